"""Submitters: submit and dry-run (SPEC §6)."""

from __future__ import annotations

from typing import Any

from app.api.common import caller, ctx, json_body, make_blueprint, requires_role
from app.api.schemas import ContractSchema, DryRunSchema, ErrorBodySchema, RunViewSchema
from app.services.submit import dry_run, submit_run

blp = make_blueprint("submit", "Submit runs and try contracts without storing them")

_CONTRACT_BODY = {"content": {"application/json": {"schema": ContractSchema}}, "required": True}


@blp.route("/runs", methods=["POST"])
@requires_role("submitter", "operator")
@blp.doc(
    requestBody=_CONTRACT_BODY,
    responses={
        "200": {"description": "run_id already known", "content": {"application/json": {"schema": RunViewSchema}}},
        "201": {"description": "placed: RUNNING", "content": {"application/json": {"schema": RunViewSchema}}},
        "202": {"description": "QUEUED", "content": {"application/json": {"schema": RunViewSchema}}},
        "400": {"description": "invalid contract", "content": {"application/json": {"schema": ErrorBodySchema}}},
        "422": {"description": "no candidate or width cap", "content": {"application/json": {"schema": ErrorBodySchema}}},
    },
)
def post_run() -> tuple[dict[str, Any], int]:
    result = submit_run(ctx(), json_body(), caller())
    return result.view, result.status


@blp.route("/runs/dry-run", methods=["POST"])
@requires_role("submitter", "operator")
@blp.doc(
    requestBody=_CONTRACT_BODY,
    responses={
        "200": {"description": "DRY_RUN", "content": {"application/json": {"schema": DryRunSchema}}},
        "422": {"description": "no candidate or width cap", "content": {"application/json": {"schema": ErrorBodySchema}}},
    },
)
def post_dry_run() -> dict[str, Any]:
    return dry_run(ctx(), json_body())
