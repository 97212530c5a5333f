"""``GET /metrics`` (docs/api.md#get-metrics): Prometheus text, no token unless
``metrics.require_token`` (then any valid token, docs/api.md#get-metrics). Never a 5xx: a database
it cannot read is a gauge of the reply (``mediator_database_figures_failed``), not an error."""

from __future__ import annotations

from typing import Any

from flask import Response

from app.api.auth import check_token_when
from app.api.common import MediatorBlueprint, ctx
from app.api.openapi import BEARER_OR_NONE, content_reply, operation
from app.services.metrics import render_metrics

# The text format every Prometheus reads (the names here need none of 1.0.0's escaping).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

blp = MediatorBlueprint("metrics", __name__, description="Prometheus metrics")


def _doc() -> dict[str, Any]:
    doc = operation(
        {200: content_reply("text/plain", "Prometheus text format 0.0.4")},
        {401: "missing or invalid token, when metrics.require_token is set"},
        token=False,
    )
    doc["responses"].pop(503)  # the database's figures failing is a gauge, not an error
    doc["security"] = BEARER_OR_NONE
    return doc


@blp.route("/metrics", methods=["GET"])
@blp.doc(**_doc())
def metrics() -> Response:
    check_token_when("metrics.require_token")
    return Response(render_metrics(ctx()), status=200, content_type=CONTENT_TYPE)
