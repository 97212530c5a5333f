"""Observation: run view, run list, nodes, capabilities, events (docs/api.md#readers)."""

from __future__ import annotations

from typing import Any

from flask import request

from app.api.common import ctx, make_blueprint, query_args
from app.api.openapi import RUN_ID, json_reply, operation
from app.api.schemas import (
    CapabilitiesSchema,
    EventsSchema,
    NodeListSchema,
    RunListQuerySchema,
    RunListSchema,
    RunViewSchema,
    TeamsSchema,
    TeamUsageSchema,
)
from app.errors import BadRequest
from app.services.observe import capabilities, events_of, nodes_list, run_view, runs_list
from app.services.teams import teams_view, usage_chart

blp = make_blueprint("observe", "Read runs, nodes and capabilities")


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


@blp.route("/runs", methods=["GET"])
@blp.arguments(RunListQuerySchema, location="query", as_kwargs=True)
@blp.doc(
    **operation(
        {200: json_reply(RunListSchema, "runs, newest first; next is the cursor of the next page")},
        {
            400: "a bad filter: since or before not a time, limit not a positive integer, "
            "team not a team name"
        },
    )
)
def get_runs(**filters: Any) -> dict[str, Any]:
    return runs_list(ctx(), **filters)


def run_filters() -> dict[str, Any]:
    """The run list's filters from the query, for the runs page: the API's schema, 400 naming a
    bad one."""
    return query_args(RunListQuerySchema())


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


@blp.route("/teams", methods=["GET"])
@blp.doc(
    **operation(
        {200: json_reply(TeamsSchema, "the configured teams and default, by name")},
        {400: "any query parameter"},
    )
)
def get_teams() -> dict[str, Any]:
    if request.args:
        raise BadRequest(
            f"GET /v1/teams takes no query parameters, got {sorted(request.args)[0]!r}"
        )
    return teams_view(ctx())


@blp.route("/teams/usage", methods=["GET"])
@blp.doc(
    **operation(
        {
            200: json_reply(
                TeamUsageSchema,
                "node-seconds charged to each team in each hour of the last day, oldest first",
            )
        },
        {400: "any query parameter"},
    )
)
def get_teams_usage() -> dict[str, Any]:
    if request.args:
        raise BadRequest(
            f"GET /v1/teams/usage takes no query parameters, got {sorted(request.args)[0]!r}"
        )
    return usage_chart(ctx())


@blp.route("/capabilities", methods=["GET"])
@blp.doc(**operation({200: json_reply(CapabilitiesSchema, "each capability over live adverts")}))
def get_capabilities() -> dict[str, Any]:
    return capabilities(ctx())
