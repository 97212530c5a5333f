"""A run's team at submit and dry-run, and the teams' view (docs/teams.md)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from app.context import Caller, Context
from app.errors import BadRequest, Forbidden, QueueFull
from app.store.server import database_now
from app.store.teams import TeamCounts, queued_up_to, team_counts
from app.teams import DEFAULT_TEAM, HEALTH_TEAM, Teams
from app.wire import ts


def choose_team(teams: Teams, caller: Caller, named: str | None) -> str:
    """The run's team (docs/teams.md, "A run's team"): ``queue.team`` when the token may name it
    (its ``team`` and ``teams``; operators any), else the token's ``team``, else the first team
    whose ``members`` lists the token's name or has a glob matching the principal, else
    ``default``. A glob matches only a vouched principal: a self-declared one would let any
    caller pick a team by writing a header. Checked after validation and before the run_id
    lookup: a refusal stores nothing.

    An unconfigured name (``health`` too: the Mediator's own) is 400; a name the token may not
    use is 403."""
    if named is not None:
        if named == HEALTH_TEAM or named not in teams:
            raise BadRequest(f"unknown team: {json.dumps(named)}")
        allowed = named == caller.team or named in caller.teams or "operator" in caller.roles
        if not allowed:
            raise Forbidden(f"this token may not name team {json.dumps(named)}")
        return named
    return token_team(teams, caller)


def token_team(teams: Teams, caller: Caller) -> str:
    """The team of a run that names none: the token's, its membership's, else ``default``."""
    if caller.team is not None:
        return caller.team
    principal = caller.principal if caller.vouched else None
    return teams.of_member(caller.token_name, principal) or DEFAULT_TEAM


def check_queue_room(ctx: Context, s: Session | Connection, team_name: str) -> None:
    """A run of ``team_name`` was just inserted QUEUED in the caller's transaction: over the
    team's ``max_queued`` (its other QUEUED runs number at least that many) the submit is 429
    with ``Retry-After: <lease.renew_seconds>`` and the transaction rolls back, storing nothing
    (docs/teams.md, "Queue length"). A team without ``max_queued`` sends no statement. No row is
    locked: concurrent submits, none seeing another's uncommitted run, may together take the
    team past its limit by at most the submits in flight at once."""
    team = ctx.teams.get(team_name)
    if team is None or team.max_queued is None:
        return
    limit = team.max_queued
    apart = None
    if team.name == DEFAULT_TEAM:
        apart = [n for n in ctx.teams.names if n != DEFAULT_TEAM] + [HEALTH_TEAM]
    # The run just inserted counts too: one more than the limit is read.
    others = queued_up_to(s, team.name, apart=apart, limit=limit + 1) - 1
    if others >= limit:
        raise QueueFull(
            f"team {team.name} has {others} runs queued (max_queued {limit})",
            headers={"Retry-After": str(ctx.config["lease.renew_seconds"])},
        )


def teams_view(ctx: Context) -> dict[str, Any]:
    """``GET /v1/teams``: the configured teams and ``default``, by name, with what their runs
    hold and wait for. A run whose stored team is no longer configured counts as ``default``;
    ``health`` is in no sum. ``share`` is the team's weight over the weights of the teams with
    runs queued or running (null for a team with none); ``usage`` and ``factor`` are null until
    fair share exists (docs/teams.md, "Not built yet")."""
    teams = ctx.teams
    with ctx.db.read(snapshot=True) as s:
        now = database_now(s)
        stored = team_counts(s)
    counts: dict[str, TeamCounts] = {}
    for name, c in stored.items():
        into = teams.counted_as(name)
        if into == HEALTH_TEAM:
            continue
        was = counts.get(into, TeamCounts())
        counts[into] = TeamCounts(
            was.queued + c.queued, was.running + c.running, was.nodes + c.nodes
        )
    active = {n for n, c in counts.items() if c.queued or c.running or c.nodes}
    total = sum(t.weight for n in active if (t := teams.get(n)) is not None)
    rows = []
    for name in teams.names:
        team = teams.get(name)
        assert team is not None
        c = counts.get(name, TeamCounts())
        rows.append(
            {
                "name": name,
                "weight": team.weight,
                "share": team.weight / total if name in active and total else None,
                "usage": None,
                "factor": None,
                "running_nodes": c.nodes,
                "queued": c.queued,
                "max_nodes": team.max_nodes,
                "max_queued": team.max_queued,
            }
        )
    return {"observed_at": ts(now), "teams": rows}
