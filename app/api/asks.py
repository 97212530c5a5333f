"""Answerers: open asks and answers (SPEC §10)."""

from __future__ import annotations

from typing import Any

from flask import request

from app.api.common import caller, ctx, make_blueprint, requires_role
from app.api.results import _seq
from app.api.schemas import AsksSchema, ErrorBodySchema, ResultReplySchema
from app.services.asks import answer, list_asks

blp = make_blueprint("asks", "People answer the questions steps ask")


def _json(schema: type, description: str = "ok") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


@blp.route("/asks", methods=["GET"])
@requires_role("answerer", "reader", "operator")
@blp.doc(responses={"200": _json(AsksSchema)})
def get_asks() -> dict[str, Any]:
    return list_asks(ctx(), caller())


@blp.route("/runs/<run_id>/steps/<seq>/answer", methods=["POST"])
@requires_role("answerer", "operator")
@blp.doc(
    responses={
        "200": _json(ResultReplySchema),
        "403": _json(ErrorBodySchema, "not an allowed answerer"),
        "409": _json(ErrorBodySchema, "no open ask"),
        "413": _json(ErrorBodySchema),
        "422": _json(ErrorBodySchema, "schema violation"),
    }
)
def post_answer(run_id: str, seq: str) -> dict[str, Any]:
    n = _seq(seq)
    request.max_content_length = ctx().config["max_blob_bytes"]
    return answer(ctx(), run_id, n, request.get_data(cache=False), caller())
