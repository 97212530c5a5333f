"""Submitters: submit and dry-run (docs/api.md#submitters)."""

from __future__ import annotations

from typing import Any

from flask import g

from app.api.common import caller, ctx, json_body, make_blueprint
from app.api.contract_doc import ContractSchema
from app.api.openapi import PRINCIPAL, json_reply, operation
from app.api.schemas import DryRunSchema, RunViewSchema
from app.services.submit import dry_run, submit_run

blp = make_blueprint("submit", "Submit runs and try contracts without storing them")

_CONTRACT_BODY = {"content": {"application/json": {"schema": ContractSchema}}, "required": True}
_INVALID = (
    "invalid contract: the reason names the first field at fault and its value (body not "
    "JSON, not an object, a rule of the contract, or a rule between its steps and roles); or "
    'unknown team: "<name>" for a queue.team that is not configured; nothing stored'
)
_FORBIDDEN = (
    "the token lacks the role (submitter or operator), its principal differs from "
    "X-Enode-Principal, queue.priority is above its max_priority, or queue.team names a team it "
    "may not name; nothing stored"
)
_ROLES = ("submitter", "operator")


@blp.route("/runs", methods=["POST"])
@blp.doc(
    requestBody=_CONTRACT_BODY,
    **operation(
        {
            200: json_reply(RunViewSchema, "run_id already known: the run as it is"),
            201: json_reply(RunViewSchema, "placed: RUNNING on the assigned nodes"),
            202: json_reply(RunViewSchema, "QUEUED: candidates exist but are busy"),
        },
        {
            400: _INVALID,
            403: _FORBIDDEN,
            413: "body over max_body_bytes; nothing stored",
            422: "FAILED at once: no node in the fleet can fill a role, or the width cap",
            429: (
                "the run would queue and its team already has max_queued runs queued; "
                "Retry-After: lease.renew_seconds; nothing stored"
            ),
        },
        roles=_ROLES,
        parameters=[PRINCIPAL],
    ),
)
def post_run() -> tuple[dict[str, Any], int]:
    body = json_body(contract=True)
    if isinstance(body, dict) and isinstance(body.get("run_id"), str):
        g.run_id = body["run_id"][:200]  # the request's log line names the run, even on a 4xx
    result = submit_run(ctx(), body, caller())
    return result.view, result.status


@blp.route("/runs/dry-run", methods=["POST"])
@blp.doc(
    requestBody=_CONTRACT_BODY,
    **operation(
        {200: json_reply(DryRunSchema, "DRY_RUN: where it would be placed; nothing stored")},
        {
            400: _INVALID,
            403: _FORBIDDEN,
            413: "body over max_body_bytes",
            422: "no node in the fleet can fill a role, or the width cap",
        },
        roles=_ROLES,
        parameters=[PRINCIPAL],
    ),
)
def post_dry_run() -> dict[str, Any]:
    return dry_run(ctx(), json_body(contract=True), caller())
