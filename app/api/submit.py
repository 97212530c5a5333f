"""Submitters: submit and dry-run (SPEC §6)."""

from __future__ import annotations

from typing import Any

from flask import g

from app.api.common import caller, ctx, doc_json, json_body, make_blueprint, requires_role
from app.api.schemas import ContractSchema, DryRunSchema, ErrorBodySchema, RunViewSchema
from app.services.submit import dry_run, submit_run

blp = make_blueprint("submit", "Submit runs and try contracts without storing them")

_CONTRACT_BODY = {"content": {"application/json": {"schema": ContractSchema}}, "required": True}


@blp.route("/runs", methods=["POST"])
@requires_role("submitter", "operator")
@blp.doc(
    requestBody=_CONTRACT_BODY,
    responses={
        "200": doc_json(RunViewSchema, "run_id already known"),
        "201": doc_json(RunViewSchema, "placed: RUNNING"),
        "202": doc_json(RunViewSchema, "QUEUED"),
        "400": doc_json(ErrorBodySchema, "invalid contract"),
        "403": doc_json(ErrorBodySchema, "queue.priority above the token's max_priority"),
        "422": doc_json(ErrorBodySchema, "no candidate or width cap"),
    },
)
def post_run() -> tuple[dict[str, Any], int]:
    body = json_body(contract=True)
    if isinstance(body, dict) and isinstance(body.get("run_id"), str):
        g.run_id = body["run_id"][:200]  # the request's log line names the run, even on a 4xx
    result = submit_run(ctx(), body, caller())
    return result.view, result.status


@blp.route("/runs/dry-run", methods=["POST"])
@requires_role("submitter", "operator")
@blp.doc(
    requestBody=_CONTRACT_BODY,
    responses={
        "200": doc_json(DryRunSchema, "DRY_RUN"),
        "422": doc_json(ErrorBodySchema, "no candidate or width cap"),
    },
)
def post_dry_run() -> dict[str, Any]:
    return dry_run(ctx(), json_body(contract=True), caller())
