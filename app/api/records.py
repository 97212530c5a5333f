"""Records and the ledger (SPEC §11)."""

from __future__ import annotations

from typing import Any

from flask import Response, stream_with_context

from app.api.common import ctx, doc_json, make_blueprint
from app.api.schemas import ErrorBodySchema, LedgerSchema
from app.services.records import ledger, record_stream

blp = make_blueprint("records", "Sealed Records and the artifact ledger")


@blp.route("/runs/<run_id>/record", methods=["GET"])
@blp.doc(
    responses={
        "200": {"description": "application/x-tar of the sealed Record"},
        "409": doc_json(ErrorBodySchema, "not sealed yet"),
    }
)
def get_record(run_id: str) -> Response:
    chunks = record_stream(ctx(), run_id)
    resp = Response(stream_with_context(chunks), status=200, mimetype="application/x-tar")
    resp.headers["Content-Disposition"] = f'attachment; filename="run-{run_id}.tar"'
    return resp


@blp.route("/runs/<run_id>/ledger", methods=["GET"])
@blp.doc(responses={"200": doc_json(LedgerSchema, "ok")})
def get_ledger(run_id: str) -> dict[str, Any]:
    return ledger(ctx(), run_id)
