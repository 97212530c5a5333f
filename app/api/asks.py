"""Answerers: open asks and answers (docs/api.md#answerers)."""

from __future__ import annotations

from typing import Any

from app.api.auth import may_call
from app.api.common import bounded_body, caller, ctx, make_blueprint
from app.api.openapi import PRINCIPAL, RUN_ID, SEQ, json_reply, operation
from app.api.results import _seq
from app.api.schemas import AsksSchema, ResultReplySchema
from app.contract.violations import MAX_CHECKS
from app.services.asks import answer, list_asks

blp = make_blueprint("asks", "People answer the questions steps ask")
ANSWER_RULE = "/v1/runs/<run_id>/steps/<seq>/answer"

_ANSWER_BODY = {
    "description": "the answer: any JSON value, which must satisfy the ask's schema if it has one",
    "required": True,
    "content": {"application/json": {"schema": {}}},
}


@blp.route("/asks", methods=["GET"])
@blp.doc(
    **operation(
        {
            200: json_reply(
                AsksSchema,
                "the open asks; can_answer is true where an answer of this caller would be taken",
            )
        },
        roles=("answerer", "reader", "operator"),
        parameters=[PRINCIPAL],
    )
)
def get_asks() -> dict[str, Any]:
    who = caller()
    return list_asks(ctx(), who, may_answer=may_call(who, "POST", ANSWER_RULE))


@blp.route("/runs/<run_id>/steps/<seq>/answer", methods=["POST"], parameters=[RUN_ID, SEQ])
@blp.doc(
    requestBody=_ANSWER_BODY,
    **operation(
        {200: json_reply(ResultReplySchema, "taken, like a result")},
        {
            400: "seq is not a positive integer, or the body is not JSON",
            403: "the token lacks the role (answerer or operator), or the principal is not an "
            "allowed answerer: not among the ask's answerers, or declared in X-Enode-Principal "
            "under a token that does not vouch for it (the reason says which)",
            409: "no open ask at that step (the body is not read)",
            413: "body over max_blob_bytes, or validating it against the ask's schema would take "
            f"more than {MAX_CHECKS:,} checks",
            422: "the answer does not satisfy the ask's schema",
        },
        roles=("answerer", "operator"),
        parameters=[PRINCIPAL],
    ),
)
def post_answer(run_id: str, seq: str) -> dict[str, Any]:
    n = _seq(seq)
    # The body is read by the service, once the step is known to await this caller's answer.
    return answer(ctx(), run_id, n, _answer_body, caller())


def _answer_body() -> bytes:
    return bounded_body(ctx().config["max_blob_bytes"])
