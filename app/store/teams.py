"""What the teams' view counts, by the team stored on each run (docs/teams.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from app.store.pipeline import fetch

# One configured team's QUEUED runs, up to :m, by ``ix_runs_queued_team``.
_QUEUED_OF_TEAM = text(
    "SELECT count(*) FROM (SELECT 1 FROM runs WHERE state = 'QUEUED' AND team = :team LIMIT :m) q"
)
# ``default``'s QUEUED runs, up to :m: those stored under a name that is not in :apart (the other
# configured teams and ``health``). The queue's stored names are found one index probe each (a
# loose index scan of ``ix_runs_queued_team``), then each kept name's runs are read up to :m:
# the read grows with the names in the queue and with :m, never with other teams' runs.
_QUEUED_OF_DEFAULT = text(
    "WITH RECURSIVE names(team) AS ("
    " (SELECT team FROM runs WHERE state = 'QUEUED' ORDER BY team LIMIT 1)"
    " UNION ALL"
    " SELECT (SELECT r.team FROM runs r WHERE r.state = 'QUEUED' AND r.team > names.team"
    " ORDER BY r.team LIMIT 1)"
    " FROM names WHERE names.team IS NOT NULL)"
    " SELECT count(*) FROM (SELECT 1 FROM names CROSS JOIN LATERAL"
    " (SELECT 1 FROM runs WHERE state = 'QUEUED' AND team = names.team LIMIT :m) one"
    " WHERE names.team IS NOT NULL AND names.team <> ALL(CAST(:apart AS text[]))"
    " LIMIT :m) q"
)


def queued_up_to(
    s: Session | Connection, team: str, *, apart: Sequence[str] | None, limit: int
) -> int:
    """The QUEUED runs counted as ``team``'s, at most ``limit`` of them, in the caller's
    transaction (a run it inserted counts). ``apart``: None for a configured team other than
    ``default`` (its stored name alone); for ``default``, the names whose runs are not its own
    (every other configured team and ``health``): a name no longer configured counts as
    ``default`` (docs/teams.md, "A team removed")."""
    if apart is None:
        ((n,),) = fetch(s, _QUEUED_OF_TEAM, {"team": team, "m": limit})
    else:
        ((n,),) = fetch(s, _QUEUED_OF_DEFAULT, {"apart": list(apart), "m": limit})
    return int(n)


# ------------------------------------------------------------------ quotas (docs/teams.md)

# SQLSTATE of ``take_team_quota`` (migration 0019) over quota.
OVER_QUOTA_SQLSTATE = "MQ001"
_TAKE_TEAM_QUOTA = text("SELECT take_team_quota(:team, CAST(:apart AS text[]), :width, :max_nodes)")


class OverQuota(Exception):
    """A placement that would take its team above ``max_nodes``: nothing of it stays."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.reason = message


def quota_statement(
    team: str, apart: Sequence[str] | None, width: int, max_nodes: int
) -> tuple[Any, dict[str, Any]]:
    """The statement that locks ``team``'s ``team_limits`` row (created on first use) and
    counts the leases its runs hold (``apart``: as for :func:`queued_up_to`), raising SQLSTATE
    MQ001 when ``width`` more would take it above ``max_nodes`` (:func:`over_quota` tells it
    apart). Sent after the run row and before the nodes' rows: the lock order of docs/queue.md."""
    return (
        _TAKE_TEAM_QUOTA,
        {
            "team": team,
            "apart": list(apart) if apart is not None else None,
            "width": width,
            "max_nodes": max_nodes,
        },
    )


def over_quota(exc: BaseException) -> OverQuota | None:
    """The :class:`OverQuota` a database error is, or None."""
    orig = getattr(exc, "orig", exc)
    if getattr(orig, "sqlstate", None) != OVER_QUOTA_SQLSTATE:
        return None
    diag = getattr(orig, "diag", None)
    message = getattr(diag, "message_primary", None) or str(orig).splitlines()[0]
    return OverQuota(message)


def take_quota(
    s: Session | Connection, team: str, apart: Sequence[str] | None, width: int, max_nodes: int
) -> int:
    """:func:`quota_statement` in the caller's transaction: the nodes the team holds, or
    :class:`OverQuota` (the transaction, or its savepoint, is then unusable)."""
    try:
        ((held,),) = fetch(s, *quota_statement(team, apart, width, max_nodes))
    except DBAPIError as exc:
        found = over_quota(exc)
        if found is not None:
            raise found from exc
        raise
    return int(held)


# ------------------------------------------------------------------ fair share (docs/teams.md)

# Each stored team's usage decayed to now (every slot from its own ``at``), the leases its runs
# hold and its QUEUED runs, in one statement: ``team_usage`` has at most 16 rows a team, the
# leases are read by ``ix_leases_team`` (what is held now, never history) and the queued runs
# from ``queue_counts`` (rows per priority and slot, never the queue itself).
_STANDING = text(
    "SELECT 'u', team, sum(node_seconds * power(0.5, extract(epoch FROM now() - at) / :half_life))"
    " FROM team_usage GROUP BY team"
    " UNION ALL SELECT 'l', team, count(*) FROM leases GROUP BY team"
    " UNION ALL SELECT 'q', team, sum(queued) FROM queue_counts GROUP BY team"
)


@dataclass(frozen=True)
class StoredStanding:
    """Per stored team name: its decayed usage in node-seconds, the nodes its runs hold and its
    QUEUED runs."""

    usage: dict[str, float]
    held: dict[str, int]
    queued: dict[str, int]


def stored_standing(s: Session | Connection, half_life_seconds: int) -> StoredStanding:
    out = StoredStanding({}, {}, {})
    for kind, team, value in fetch(s, _STANDING, {"half_life": float(half_life_seconds)}):
        if kind == "u":
            out.usage[team] = float(value)
        elif kind == "l":
            out.held[team] = int(value)
        elif int(value) > 0:
            out.queued[team] = int(value)
    return out


# The reaper's charge (docs/teams.md, "Fair share"). Added to a slot of ``team_usage`` after the
# slot's own decay to now, and to the hour's row of ``team_usage_hours``; ``health`` is never
# charged.
_ADD_USAGE = (
    " ins AS (INSERT INTO team_usage AS u (team, slot, node_seconds, at)"
    " SELECT team, pg_backend_pid() % 16, sum(secs), now() FROM charged"
    " WHERE team <> 'health' GROUP BY team"
    " ON CONFLICT (team, slot) DO UPDATE SET node_seconds = u.node_seconds"
    " * power(0.5, GREATEST(extract(epoch FROM now() - u.at), 0) / :half_life)"
    " + excluded.node_seconds, at = now() RETURNING 1),"
    " hours AS (INSERT INTO team_usage_hours AS h (team, hour, node_seconds)"
    " SELECT team, date_trunc('hour', now()), sum(secs) FROM charged"
    " WHERE team <> 'health' GROUP BY team"
    " ON CONFLICT (team, hour) DO UPDATE SET node_seconds = h.node_seconds + excluded.node_seconds"
    " RETURNING 1)"
)

# Leases after :after in node_id order, at most :batch, each that no other transaction holds:
# charged for their time since ``charged_until``, which moves to now.
_CHARGE_LEASES = text(
    "WITH picked AS (SELECT node_id, team, charged_until FROM leases WHERE node_id > :after"
    " ORDER BY node_id LIMIT :batch FOR NO KEY UPDATE SKIP LOCKED),"
    " moved AS (UPDATE leases l SET charged_until = now() FROM picked p"
    " WHERE l.node_id = p.node_id AND p.charged_until < now()"
    " RETURNING p.team, extract(epoch FROM now() - p.charged_until) AS secs),"
    " charged AS (SELECT team, secs FROM moved),"
    f"{_ADD_USAGE}"
    " SELECT (SELECT max(node_id) FROM picked), (SELECT count(*) FROM picked),"
    " (SELECT coalesce(sum(secs), 0) FROM moved)"
)

# The ended leases' rows, at most :batch, taken and deleted; only the deleted rows are added.
_FOLD_ENDED = text(
    "WITH gone AS (DELETE FROM usage_ended WHERE id IN (SELECT id FROM usage_ended ORDER BY id"
    " LIMIT :batch FOR UPDATE SKIP LOCKED) RETURNING team, node_seconds),"
    " charged AS (SELECT team, node_seconds AS secs FROM gone),"
    f"{_ADD_USAGE}"
    " SELECT count(*), coalesce(sum(secs), 0) FROM charged"
)

_FORGET_HOURS = text("DELETE FROM team_usage_hours WHERE hour < now() - interval '2 days'")

CHARGE_BATCH = 500
FOLD_BATCH = 5000


@dataclass(frozen=True)
class Charged:
    rows: int  # leases looked at, or ended rows folded
    node_seconds: float
    last: str | None = None  # the last lease looked at (the next batch starts after it)


def charge_leases(s: Session | Connection, after: str, half_life_seconds: int) -> Charged:
    """One batch of the reaper's charge of held leases, in the caller's transaction."""
    ((last, rows, secs),) = fetch(
        s,
        _CHARGE_LEASES,
        {"after": after, "batch": CHARGE_BATCH, "half_life": float(half_life_seconds)},
    )
    return Charged(int(rows), float(secs), last)


def fold_ended(s: Session | Connection, half_life_seconds: int) -> Charged:
    """One batch of ``usage_ended`` added to ``team_usage`` and deleted."""
    ((rows, secs),) = fetch(
        s, _FOLD_ENDED, {"batch": FOLD_BATCH, "half_life": float(half_life_seconds)}
    )
    return Charged(int(rows), float(secs))


def forget_old_hours(s: Session | Connection) -> None:
    fetch(s, _FORGET_HOURS, {})


_USAGE_HOURS = text(
    "SELECT team, hour, node_seconds FROM team_usage_hours"
    " WHERE hour >= date_trunc('hour', now()) - interval '23 hours' ORDER BY hour, team"
)


def usage_hours(s: Session | Connection) -> list[tuple[str, datetime, float]]:
    """Node-seconds charged to each stored team in each hour of the last day, oldest first."""
    return [(team, hour, float(secs)) for team, hour, secs in fetch(s, _USAGE_HOURS, {})]
