"""Liveness and readiness (no token): ready = database reachable and migrated (SPEC §2 route 19)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from app.api.common import ctx
from app.migrate import schema_problem

blp = Blueprint("health", __name__)


@blp.get("/healthz")
def healthz() -> dict[str, Any]:
    return {"status": "ok"}


@blp.get("/readyz")
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
