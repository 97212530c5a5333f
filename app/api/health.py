"""Liveness and readiness (no token): ready = database reachable and migrated
(docs/api.md#get-readyz)."""

from __future__ import annotations

import threading
from typing import Any

from flask import current_app
from marshmallow import Schema, fields, validate

from app.api.common import MediatorBlueprint, ctx
from app.api.openapi import json_reply, operation
from app.logs import log
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
        problem = f"database unreachable ({type(exc).__name__})"
    readiness().saw(problem)
    if problem:
        return {"status": "unavailable", "reason": problem}, 503
    return {"status": "ready"}, 200


class Readiness:
    """What this process's ``/readyz`` said last: a line is logged when it turns 503 (with the
    reason: the database unreachable, or its schema behind), when the reason changes, and when
    it is ready again — once per transition, not per probe (docs/api.md#get-readyz)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: str | None = READY  # a process starts out assumed ready: its first 503 logs

    def saw(self, problem: str | None) -> None:
        now = problem or READY
        with self._lock:
            before, self._last = self._last, now
        if now == before:
            return
        if problem:
            log.error("readyz: not ready", reason=problem)
        else:
            log.info("readyz: ready again", was=before)


READY = "ready"


def readiness() -> Readiness:
    found: Readiness | None = current_app.extensions.get("mediator.readiness")
    if found is None:
        found = current_app.extensions.setdefault("mediator.readiness", Readiness())
    return found
