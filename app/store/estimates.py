"""The reads behind the expected start of a QUEUED run (docs/queue.md, "What a QUEUED run's view
explains"), each bounded: the runs ahead by index ranges limited to the request's budget, the
steps of the runs concerned, and the newest recorded durations of each key."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Float, String, and_, column, func, literal_column, or_, select
from sqlalchemy import values as values_
from sqlalchemy.orm import Session

from app.estimate import DURATIONS_PER_KEY
from app.models import Run, Step, StepDuration
from app.store.queue import IS_QUEUED, QUEUE_ORDER, QueuedRun, TeamOrder, queued_columns


def _before_in_queue(  # type: ignore[no-untyped-def]
    priority: int, created_at: Any, run_id: str, order: TeamOrder | None = None
):
    """The runs ahead of (priority, created_at, run_id) in queue order
    (docs/priorities.md#priority); with ``order``, in the scan order of teams (docs/teams.md, "Fair
    share"): at the run's priority, every run of a team ranked before its own, and the older runs of
    the teams ranked with it."""
    older = or_(
        Run.created_at < created_at,
        and_(Run.created_at == created_at, Run.run_id < run_id),
    )
    if order is None:
        return or_(Run.priority > priority, and_(Run.priority == priority, older))
    return or_(
        Run.priority > priority,
        and_(
            Run.priority == priority,
            or_(Run.team.in_(order.before), and_(Run.team.in_(order.same), older)),
        ),
    )


def queued_ahead_of_shapes(
    s: Session | Connection,
    keys: Sequence[str],
    run: QueuedRun,
    limit: int,
    order: TeamOrder | None = None,
) -> list[QueuedRun]:
    """The first ``limit`` QUEUED runs ahead of ``run`` in queue order among the shapes
    ``keys``: each shape by one LATERAL probe of ``ix_runs_queued_shape`` with its own LIMIT, so
    at most ``len(keys) * limit`` rows are read whatever the queue's length."""
    if not keys or limit <= 0:
        return []
    shapes = values_(column("k", String), name="shapes", literal_binds=False).data(
        [(k,) for k in keys]
    )
    first = (
        select(*queued_columns())
        .where(
            IS_QUEUED,
            Run.requires_key == shapes.c.k,
            _before_in_queue(run.priority, run.created_at, run.run_id, order),
        )
        .order_by(*QUEUE_ORDER)
        .limit(limit)
        .lateral("first")
    )
    q = (
        select(*(first.c[col.key] for col in queued_columns()))
        .select_from(shapes)
        .join(first, literal_column("true"))
        .order_by(first.c.priority.desc(), first.c.created_at, first.c.run_id)
        .limit(limit)
    )
    return [QueuedRun(*row) for row in s.execute(q).all()]


@dataclass(frozen=True)
class StepRow:
    """A step of a run the estimate looks at, with its run's ``requires``."""

    run_id: str
    requires: Any
    seq: int
    step_id: str
    kind: str
    uses: str | None
    needs: list[int]
    state: str
    spec: Any
    ran: float  # seconds since its claim (0 when not claimed)
    team: str = "default"  # its run's, as stored


def steps_of_estimated(s: Session | Connection, run_ids: Sequence[str]) -> list[StepRow]:
    """The steps of ``run_ids`` (the holders and the runs ahead: bounded by the candidates and
    the budget) in one statement, with how long each claimed one has run by the database's
    clock."""
    if not run_ids:
        return []
    ran = func.coalesce(func.extract("epoch", func.now() - Step.started_at), 0)
    q = (
        select(
            Step.run_id,
            Run.requires,
            Step.seq,
            Step.step_id,
            Step.kind,
            Step.uses,
            Step.needs,
            Step.state,
            Step.spec,
            ran,
            Run.team,
        )
        .join(Run, Run.run_id == Step.run_id)
        .where(Step.run_id.in_(list(run_ids)))
        .order_by(Step.run_id, Step.seq)
    )
    return [
        StepRow(r[0], r[1], r[2], r[3], r[4], r[5], list(r[6]), r[7], r[8], float(r[9]), r[10])
        for r in s.execute(q).all()
    ]


def median_durations(s: Session | Connection, keys: Sequence[str]) -> dict[str, float]:
    """Each key's median over its newest :data:`DURATIONS_PER_KEY` recorded durations, one
    LATERAL probe of ``ix_step_durations_key`` per key; a key with none is absent."""
    if not keys:
        return {}
    wanted = values_(column("k", String), name="wanted", literal_binds=False).data(
        [(k,) for k in sorted(set(keys))]
    )
    newest = (
        select(StepDuration.seconds)
        .where(StepDuration.key == wanted.c.k)
        .order_by(StepDuration.ended_at.desc())
        .limit(DURATIONS_PER_KEY)
        .lateral("newest")
    )
    q = (
        select(
            wanted.c.k,
            func.percentile_cont(0.5).within_group(newest.c.seconds).cast(Float),
        )
        .select_from(wanted)
        .join(newest, literal_column("true"))
        .group_by(wanted.c.k)
    )
    return {k: float(m) for k, m in s.execute(q).all()}
