"""Liveness and readiness (no token): ready = database reachable and migrated (SPEC §2 route 19)."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, fields, validate

from app.api.common import MediatorBlueprint, ctx
from app.api.openapi import json_reply, operation
from app.migrate import schema_problem

blp = MediatorBlueprint("health", __name__, description="Liveness and readiness, without a token")


class HealthSchema(Schema):
    status = fields.String(required=True, validate=validate.OneOf(["ok"]))


class ReadySchema(Schema):
    status = fields.String(required=True, validate=validate.OneOf(["ready", "unavailable"]))
    reason = fields.String(metadata={"description": "why not ready"})


@blp.route("/healthz", methods=["GET"])
@blp.doc(**operation({200: json_reply(HealthSchema, "the process serves")}, token=False))
def healthz() -> dict[str, Any]:
    return {"status": "ok"}


@blp.route("/readyz", methods=["GET"])
@blp.doc(
    **operation(
        {
            200: json_reply(ReadySchema, "database reachable and migrated"),
            503: json_reply(ReadySchema, "not ready: the database is unreachable or behind"),
        },
        token=False,
    )
)
def readyz() -> tuple[dict[str, Any], int]:
    try:
        problem = schema_problem(ctx().db.engine)
    except Exception as exc:  # unreachable database: not ready, and say why without secrets
        return {
            "status": "unavailable",
            "reason": f"database unreachable ({type(exc).__name__})",
        }, 503
    if problem:
        return {"status": "unavailable", "reason": problem}, 503
    return {"status": "ready"}, 200
