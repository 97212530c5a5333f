"""Answerers: open asks and answers (SPEC §10)."""

from __future__ import annotations

from typing import Any

from app.api.common import bounded_body, caller, ctx, doc_json, make_blueprint
from app.api.results import _seq
from app.api.schemas import AsksSchema, ErrorBodySchema, ResultReplySchema
from app.services.asks import answer, list_asks

blp = make_blueprint("asks", "People answer the questions steps ask")


@blp.route("/asks", methods=["GET"])
@blp.doc(responses={"200": doc_json(AsksSchema)})
def get_asks() -> dict[str, Any]:
    return list_asks(ctx(), caller())


@blp.route("/runs/<run_id>/steps/<seq>/answer", methods=["POST"])
@blp.doc(
    responses={
        "200": doc_json(ResultReplySchema),
        "403": doc_json(ErrorBodySchema, "not an allowed answerer"),
        "409": doc_json(ErrorBodySchema, "no open ask"),
        "413": doc_json(ErrorBodySchema),
        "422": doc_json(ErrorBodySchema, "schema violation"),
    }
)
def post_answer(run_id: str, seq: str) -> dict[str, Any]:
    n = _seq(seq)
    return answer(ctx(), run_id, n, bounded_body(ctx().config["max_blob_bytes"]), caller())
