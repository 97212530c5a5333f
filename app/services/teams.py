"""A run's team at submit and dry-run, and the teams' view (docs/teams.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from app.context import Caller, Context
from app.errors import BadRequest, Forbidden, QueueFull
from app.store.clock import database_now
from app.store.queue import TeamOrder
from app.store.teams import (
    CHARGE_BATCH,
    FOLD_BATCH,
    charge_leases,
    fold_ended,
    forget_old_hours,
    queued_up_to,
    stored_standing,
    usage_hours,
)
from app.teams import DEFAULT_TEAM, HEALTH_TEAM, Standing, Teams, least_width, quota_reason
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
    apart = ctx.teams.apart(team.name)
    # The run just inserted counts too: one more than the limit is read.
    others = queued_up_to(s, team.name, apart=apart, limit=limit + 1) - 1
    if others >= limit:
        raise QueueFull(
            f"team {team.name} has {others} runs queued (max_queued {limit})",
            headers={"Retry-After": str(ctx.config["lease.renew_seconds"])},
        )


def standing_now(ctx: Context, s: Session | Connection) -> Standing:
    """The teams' standing as the queue orders them now (docs/teams.md, "Fair share"), in one
    statement: usage, nodes held and QUEUED runs by stored team (a stored name no longer
    configured counts as ``default``'s; ``health`` is in no sum)."""
    return Shares(
        ctx.teams,
        ctx.config["fairshare.half_life_seconds"],
        ctx.config["fairshare.running_charge_seconds"],
    ).read(s)


def team_row(ctx: Context, standing: Standing, name: str) -> dict[str, Any]:
    """One team as ``GET /v1/teams`` shows it."""
    team = ctx.teams.get(name)
    assert team is not None
    return {
        "name": name,
        "weight": team.weight,
        "share": standing.share(name),
        "usage": standing.normalised_usage(name),
        "factor": standing.factor(name),
        "running_nodes": standing.holding(name),
        "queued": standing.queued_of(name),
        "max_nodes": team.max_nodes,
        "max_queued": team.max_queued,
    }


def teams_view(ctx: Context) -> dict[str, Any]:
    """``GET /v1/teams``: the configured teams and ``default``, by name, with their share of the
    fleet, their usage and factor (docs/teams.md, "Fair share"), what their runs hold and how
    many wait. ``share``, ``usage`` and ``factor`` are null for a team with no run queued or
    running; ``factor`` also while the team has spent nothing (it is ranked first)."""
    with ctx.db.read(snapshot=True) as s:
        now = database_now(s)
        standing = standing_now(ctx, s)
    rows = [team_row(ctx, standing, n) for n in ctx.teams.names]
    return {"observed_at": ts(now), "teams": rows}


def usage_chart(ctx: Context) -> dict[str, Any]:
    """Node-seconds charged to each team in each hour of the last day (a stored name no longer
    configured under ``default``), oldest hour first: the teams' chart."""
    with ctx.db.read(snapshot=True) as s:
        now = database_now(s)
        hours = usage_hours(s)
    by_hour: dict[str, dict[str, float]] = {}
    for stored, hour, secs in hours:
        into = ctx.teams.counted_as(stored)
        row = by_hour.setdefault(ts(hour) or "", {})
        row[into] = row.get(into, 0.0) + secs
    return {
        "observed_at": ts(now),
        "hours": [{"hour": h, "node_seconds": v} for h, v in sorted(by_hour.items())],
    }


def charge_usage(ctx: Context, check: Callable[[], None] = lambda: None) -> float:
    """The reaper's charge of the teams' usage (docs/teams.md, "Fair share"), in its own
    transactions: the ended leases' rows folded into ``team_usage`` and deleted (only the rows
    its ``DELETE … RETURNING`` returned), then the held leases in batches of 500 in node_id
    order, each batch taking only leases no other transaction holds (``SKIP LOCKED``: a skipped
    one is charged by the next pass or by its deletion), charged for their time since
    ``charged_until``, which moves to now. ``check``: the reaper's check of its lock, before
    each transaction. Returns the node-seconds charged."""
    half_life = ctx.config["fairshare.half_life_seconds"]
    total = 0.0
    while True:
        check()
        with ctx.db.begin() as s:
            folded = fold_ended(s, half_life)
        total += folded.node_seconds
        if folded.rows < FOLD_BATCH:
            break
    after = ""
    while True:
        check()
        with ctx.db.begin() as s:
            charged = charge_leases(s, after, half_life)
        total += charged.node_seconds
        if charged.rows < CHARGE_BATCH or charged.last is None:
            break
        after = charged.last
    with ctx.db.begin() as s:
        forget_old_hours(s)
    return total


@dataclass(frozen=True)
class Shares:
    """What a QUEUED run's view needs to show its team's ``share`` (docs/teams.md, "What a
    queued run shows")."""

    teams: Teams
    half_life_seconds: int
    running_charge_seconds: int

    @classmethod
    def of(cls, ctx: Context) -> Shares | None:
        """None without teams configured: every run is ``default``'s, whose share says nothing,
        and a queued run's view reads nothing more than before teams."""
        if not ctx.teams.shared:
            return None
        return cls(
            ctx.teams,
            ctx.config["fairshare.half_life_seconds"],
            ctx.config["fairshare.running_charge_seconds"],
        )

    def read(self, s: Session | Connection) -> Standing:
        """The teams' standing now, in one statement."""
        stored = stored_standing(s, self.half_life_seconds)
        return Standing(
            self.teams,
            stored.usage,
            stored.held,
            stored.queued,
            self.running_charge_seconds,
            queued=stored.queued,
        )

    @staticmethod
    def order(standing: Standing, stored: str) -> TeamOrder:
        """Where a queued run of the stored team ``stored`` stands among the teams."""
        before, same = standing.order_of(stored)
        return TeamOrder(before, same)

    def view(self, standing: Standing, stored: str, counts: list[int]) -> dict[str, Any]:
        """``share`` of a QUEUED run of the stored team ``stored`` whose roles have ``counts``:
        its team's weight, share, usage and factor, the nodes its runs hold, its quota, and
        whether the run is quota-blocked (``at_quota``, with the ``reason``)."""
        name = self.teams.counted_as(stored)
        team = self.teams.get(name)
        quota = self.teams.quota(stored)
        holding = standing.holding(stored)
        at_quota = quota is not None and holding + least_width(counts) > quota.max_nodes
        out: dict[str, Any] = {
            "team": name,
            "weight": team.weight if team is not None else None,
            "share": standing.share(name),
            "usage": standing.normalised_usage(name),
            "factor": standing.factor(name),
            "running_nodes": holding,
            "max_nodes": quota.max_nodes if quota is not None else None,
            "at_quota": at_quota,
        }
        if at_quota and quota is not None:
            out["reason"] = quota_reason(name, quota.max_nodes, holding)
        return out
