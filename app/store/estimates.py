"""The reads behind the expected start of a QUEUED run (docs/queue.md, "What a QUEUED run's view
explains"), each bounded: the runs ahead by index ranges limited to the request's budget, the
steps of the runs concerned, and the newest recorded durations of each key."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BindParameter, Connection, DateTime, Integer, Text, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Session

from app.estimate import DURATIONS_PER_KEY
from app.store.pipeline import fetch
from app.store.queue import QueuedRun, TeamOrder

# The runs ahead of (:priority, :created_at, :run_id) in queue order
# (docs/priorities.md#priority); with teams, in the scan order of teams (docs/teams.md, "Fair
# share"): at the run's priority, every run of a team ranked before its own (:before), and the
# older runs of the teams ranked with it (:same).
_OLDER = "(created_at < :created_at OR (created_at = :created_at AND run_id < :run_id))"
_AHEAD = f"(priority > :priority OR (priority = :priority AND {_OLDER}))"
_AHEAD_WITH_TEAMS = (
    "(priority > :priority OR (priority = :priority AND (team = ANY(:before)"
    f" OR (team = ANY(:same) AND {_OLDER}))))"
)
# Not ``requires``: a shape's runs all have its head's (the key is the requires' hash), so the
# runs ahead are read without it and not decoded one by one.
_QUEUED_COLUMNS = "run_id, created_at, requires_key, priority, team, pinned_node"


@functools.lru_cache(maxsize=2)
def _ahead_statement(with_teams: bool) -> Any:
    """:func:`queued_ahead_of_shapes`' statement, compiled once: each shape by one LATERAL probe of
    ``ix_runs_queued_shape`` with its own LIMIT."""
    ahead = _AHEAD_WITH_TEAMS if with_teams else _AHEAD
    params: list[BindParameter[Any]] = [
        bindparam("keys", type_=JSONB),  # a JSON array: see _MEDIANS
        bindparam("priority", type_=Integer),
        bindparam("created_at", type_=DateTime(timezone=True)),
        bindparam("run_id", type_=Text),
        bindparam("limit", type_=Integer),
    ]
    if with_teams:
        params += [bindparam("before", type_=ARRAY(Text)), bindparam("same", type_=ARRAY(Text))]
    # The rows come back only when fewer than :limit were found (then with their number): at
    # :limit the estimate is past its budget, and only the number is sent.
    return text(
        f"WITH found AS MATERIALIZED (SELECT first.* FROM jsonb_array_elements_text(:keys)"
        " AS shapes(k)"
        f" CROSS JOIN LATERAL (SELECT {_QUEUED_COLUMNS} FROM runs"
        f" WHERE state = 'QUEUED' AND requires_key = shapes.k AND {ahead}"
        " ORDER BY priority DESC, created_at, run_id LIMIT :limit) AS first"
        " ORDER BY first.priority DESC, first.created_at, first.run_id LIMIT :limit),"
        " counted AS (SELECT count(*) AS n FROM found)"
        " SELECT counted.n, found.* FROM counted LEFT JOIN found ON counted.n < :limit"
        " ORDER BY found.priority DESC, found.created_at, found.run_id"
    ).bindparams(*params)


def queued_ahead_of_shapes(
    s: Session | Connection,
    requires_of: Mapping[str, Any],
    run: QueuedRun,
    limit: int,
    order: TeamOrder | None = None,
) -> tuple[list[QueuedRun], int]:
    """The QUEUED runs ahead of ``run`` in queue order among the shapes ``requires_of``
    (``requires_key`` -> the shape's ``requires``, which its runs carry), and how many were found,
    at most ``limit``: the runs themselves only when fewer than ``limit`` were found. Each shape
    by one LATERAL probe of ``ix_runs_queued_shape`` with its own LIMIT, so at most
    ``len(requires_of) * limit`` rows are read whatever the queue's length."""
    if not requires_of or limit <= 0:
        return [], 0
    params: dict[str, Any] = {
        "keys": list(requires_of),
        "priority": run.priority,
        "created_at": run.created_at,
        "run_id": run.run_id,
        "limit": limit,
    }
    if order is not None:
        params["before"] = list(order.before)
        params["same"] = list(order.same)
    rows = fetch(s, _ahead_statement(order is not None), params)
    found = int(rows[0][0])
    if found >= limit:
        return [], found
    return [
        QueuedRun(run_id, created_at, key, requires_of[key], priority, team, pinned)
        for _, run_id, created_at, key, priority, team, pinned in rows
        if run_id is not None
    ], found


@dataclass(frozen=True)
class StepRow:
    """A step of a run the estimate looks at, with its run's ``requires``. Both documents are
    the JSON text as stored (``null`` for a run without requires), decoded only where needed: the runs ahead of a queued one are mostly
    copies of one contract, whose duration keys are computed once (``app/services/expected.py``)."""

    run_id: str
    requires: str
    seq: int
    step_id: str
    kind: str
    uses: str | None
    needs: list[int]
    state: str
    spec: str
    ran: float  # seconds since its claim (0 when not claimed)
    team: str = "default"  # its run's, as stored


_STEPS_OF_ESTIMATED = text(
    "SELECT steps.run_id, runs.requires::text, steps.seq, steps.step_id, steps.kind, steps.uses,"
    " steps.needs, steps.state, steps.spec::text,"
    " COALESCE(EXTRACT(epoch FROM now() - steps.started_at), 0), runs.team"
    " FROM steps JOIN runs ON runs.run_id = steps.run_id"
    " WHERE steps.run_id = ANY(:run_ids) ORDER BY steps.run_id, steps.seq"
).bindparams(bindparam("run_ids", type_=ARRAY(Text)))


def steps_of_estimated(s: Session | Connection, run_ids: Sequence[str]) -> list[StepRow]:
    """The steps of ``run_ids`` (the holders and the runs ahead: bounded by the candidates and
    the budget) in one statement, with how long each claimed one has run by the database's
    clock."""
    if not run_ids:
        return []
    return [
        StepRow(
            r[0], r[1] or "null", r[2], r[3], r[4], r[5], list(r[6]), r[7], r[8], float(r[9]), r[10]
        )
        for r in fetch(s, _STEPS_OF_ESTIMATED, {"run_ids": list(run_ids)})
    ]


# The keys come as a JSON array, not a text[]: PostgreSQL's estimate of an array's rows is its
# length when the value is known and 10 when it is not, so with an array a plan for the values
# always looked cheaper than a generic one and the statement was planned at every call; a JSON
# array's rows are estimated the same either way, and the generic plan is kept.
_MEDIANS = text(
    "SELECT wanted.k, CAST(percentile_cont(0.5) WITHIN GROUP (ORDER BY newest.seconds)"
    " AS double precision)"
    " FROM jsonb_array_elements_text(:keys) AS wanted(k) CROSS JOIN LATERAL ("
    " SELECT seconds FROM step_durations WHERE key = wanted.k"
    f" ORDER BY ended_at DESC LIMIT {DURATIONS_PER_KEY}) AS newest"
    " GROUP BY wanted.k"
).bindparams(bindparam("keys", type_=JSONB))


def median_durations(s: Session | Connection, keys: Sequence[str]) -> dict[str, float]:
    """Each key's median over its newest :data:`DURATIONS_PER_KEY` recorded durations, one
    LATERAL probe of ``ix_step_durations_key`` per key; a key with none is absent."""
    if not keys:
        return {}
    return {k: float(m) for k, m in fetch(s, _MEDIANS, {"keys": sorted(set(keys))})}
