"""Records and the ledger (docs/design.md#records)."""

from __future__ import annotations

from typing import Any

from flask import Response, stream_with_context

from app.api.common import ctx, make_blueprint
from app.api.openapi import RUN_ID, content_reply, json_reply, operation
from app.api.schemas import LedgerSchema
from app.services.records import ledger, record_stream

blp = make_blueprint("records", "Sealed Records and the artifact ledger")


@blp.route("/runs/<run_id>/record", methods=["GET"], parameters=[RUN_ID])
@blp.doc(
    **operation(
        {
            200: content_reply(
                "application/x-tar",
                "the sealed Record as a tar stream",
                {
                    "Content-Disposition": {
                        "description": 'attachment; filename="run-<run_id>.tar"',
                        "schema": {"type": "string"},
                    }
                },
            )
        },
        {404: "no such run", 409: "the run's Record is not sealed yet"},
    )
)
def get_record(run_id: str) -> Response:
    chunks = record_stream(ctx(), run_id)
    resp = Response(stream_with_context(chunks), status=200, mimetype="application/x-tar")
    resp.headers["Content-Disposition"] = f'attachment; filename="run-{run_id}.tar"'
    return resp


@blp.route("/runs/<run_id>/ledger", methods=["GET"], parameters=[RUN_ID])
@blp.doc(
    **operation(
        {200: json_reply(LedgerSchema, "the artifacts the run can see, oldest first")},
        {404: "no such run"},
    )
)
def get_ledger(run_id: str) -> dict[str, Any]:
    return ledger(ctx(), run_id)
