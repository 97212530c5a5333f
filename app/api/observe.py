"""Observation: run view, run list, nodes, capabilities, events (SPEC §14)."""

from __future__ import annotations

import re
from typing import Any

from flask import request

from app.api.common import ctx, make_blueprint, query_text
from app.api.openapi import RUN_ID, json_reply, operation
from app.api.schemas import (
    CapabilitiesSchema,
    EventsSchema,
    NodeListSchema,
    RunListQuerySchema,
    RunListSchema,
    RunViewSchema,
)
from app.errors import BadRequest
from app.services.observe import capabilities, events_of, nodes_list, run_view, runs_list
from app.wire import parse_ts

blp = make_blueprint("observe", "Read runs, nodes and capabilities")

MAX_LIMIT = 1000


@blp.route("/runs/<run_id>", methods=["GET"], parameters=[RUN_ID])
@blp.doc(
    **operation(
        {200: json_reply(RunViewSchema, "the run view; while QUEUED, why it waits")},
        {404: "no such run"},
    )
)
def get_run(run_id: str) -> dict[str, Any]:
    return run_view(ctx(), run_id)


@blp.route("/runs/dry-run", methods=["GET"])
@blp.doc(
    **operation(
        {200: json_reply(RunViewSchema, "the view of the run whose run_id is dry-run")},
        {404: "no such run"},
        description="GET /v1/runs/{run_id} for the run_id dry-run, which this path also is.",
    )
)
def get_run_dry_run() -> dict[str, Any]:
    return run_view(ctx(), "dry-run")


@blp.route("/runs/<run_id>/events", methods=["GET"], parameters=[RUN_ID])
@blp.doc(
    **operation(
        {200: json_reply(EventsSchema, "the run's state changes, oldest first")},
        {404: "no such run"},
    )
)
def get_events(run_id: str) -> dict[str, Any]:
    return events_of(ctx(), run_id)


def _limit(text: str | None) -> int:
    if text is None:
        return 100
    # ASCII digits only: int() would also take "1_000" and other scripts' digits.
    if not re.fullmatch(r"[+-]?[0-9]{1,12}", text.strip()):
        raise BadRequest(f"limit must be a positive integer, got {text!r}")
    value = int(text)
    if value <= 0:
        raise BadRequest(f"limit must be a positive integer, got {text!r}")
    return min(value, MAX_LIMIT)


@blp.route("/runs", methods=["GET"])
@blp.doc(
    **operation(
        {200: json_reply(RunListSchema, "runs, newest first; next is the cursor of the next page")},
        {400: "a bad filter: since or before not a time, limit not a positive integer"},
        parameters=[{"in": "query", "schema": RunListQuerySchema}],
    )
)
def get_runs() -> dict[str, Any]:
    return runs_list(ctx(), **run_filters())


def run_filters() -> dict[str, Any]:
    """The run list's filters from the query (the API's and the runs page's): 400 naming a bad
    one."""
    # A state no run can have (runctl offers CANCELLED) lists no runs (SPEC §19.8).
    state = query_text("state") or None
    since = None
    since_text = query_text("since")
    if since_text:
        try:
            since = parse_ts(since_text)
        except ValueError:
            raise BadRequest(f"since must be an RFC 3339 time, got {since_text!r}") from None
    before = None
    before_text = query_text("before")
    if before_text:
        stamp, _, run_id = before_text.partition(",")
        try:
            before = (parse_ts(stamp), run_id)
        except ValueError:
            raise BadRequest(
                f"before must be the cursor <created_at>,<run_id>, got {before_text!r}"
            ) from None
        if not run_id:
            raise BadRequest(
                f"before must be the cursor <created_at>,<run_id>, got {before_text!r}"
            )
    return {
        "state": state,
        "since": since,
        "work": query_text("work") or None,
        "before": before,
        "limit": _limit(query_text("limit")),
    }


@blp.route("/nodes", methods=["GET"])
@blp.doc(
    **operation(
        {200: json_reply(NodeListSchema, "live nodes, and nodes that still hold a lease")},
        {400: "any query parameter"},
    )
)
def get_nodes() -> dict[str, Any]:
    if request.args:
        raise BadRequest(
            f"GET /v1/nodes takes no query parameters, got {sorted(request.args)[0]!r}"
        )
    return nodes_list(ctx())


@blp.route("/capabilities", methods=["GET"])
@blp.doc(**operation({200: json_reply(CapabilitiesSchema, "each capability over live adverts")}))
def get_capabilities() -> dict[str, Any]:
    return capabilities(ctx())
