"""What the reaper's passes look for (SPEC §12). Candidates are read without locks; each is then
handled in its own transaction that locks the run and re-checks the condition."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, delete, func, literal_column, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from app.models import OPEN_STEPS, UNSEALED_RUNS, Lease, ReaperState, Run, Step
from app.states import ASKED, RUN_ALIVE, RUN_FINISHED, RUNNING, VERIFYING
from app.store import rowcount

REAPER_LOCK = 0x4D6564696174_0003  # one pass at a time across reapers (pg_try_advisory_lock)


def try_reaper_lock(conn: Connection) -> bool:
    """Take the session advisory lock of a pass on this (autocommit) connection, if it is free."""
    return bool(conn.execute(select(func.pg_try_advisory_lock(REAPER_LOCK))).scalar())


def release_reaper_lock(conn: Connection) -> None:
    conn.execute(select(func.pg_advisory_unlock(REAPER_LOCK)))


@dataclass(frozen=True)
class PassStart:
    now: datetime
    previous: datetime | None  # the previous pass's time
    previous_mark: int | None  # the wake mark the previous pass read (SPEC §7)
    covered: int  # the highest mark a successful scan has covered, read now


_LAST_MARK = text("(SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM wake_mark)")


def begin_pass(s: Session) -> PassStart:
    """Record this pass, with the ``wake_mark`` it reads, and return what the previous pass
    stored (``reaper_state``, locked: several reapers take turns)."""
    now = s.execute(select(func.now())).scalar_one()
    row = s.execute(
        select(ReaperState.last_pass_at, ReaperState.wake_mark)
        .where(ReaperState.id == 1)
        .with_for_update()
    ).first()
    covered = int(s.execute(text("SELECT last_value FROM wake_covered")).scalar_one())
    s.execute(
        pg_insert(ReaperState)
        .values(id=1, last_pass_at=func.now(), wake_mark=_LAST_MARK)
        .on_conflict_do_update(
            index_elements=[ReaperState.id],
            set_={"last_pass_at": func.now(), "wake_mark": _LAST_MARK},
        )
    )
    if row is None:
        return PassStart(now, None, None, covered)
    return PassStart(now, row.last_pass_at, row.wake_mark, covered)


def extend_leases(s: Session, window: timedelta) -> int:
    """Outage grace: every lease of an unfinished run ends no sooner than ``now() + window``, so
    nodes have a full window to re-advertise after the Mediator was down, and a node that really
    died is reaped one window after the outage, not one outage later (SPEC §12). A lease that
    already ends later keeps its ``not_after``; an advert renewing meanwhile also sets ``now() +
    window``, and ``GREATEST`` never moves a lease earlier. Returns the number of leases moved."""
    until = func.now() + window
    result = s.execute(
        update(Lease)
        .where(
            Lease.not_after < until,
            select(Run.run_id).where(Run.run_id == Lease.run_id, Run.state.in_(RUN_ALIVE)).exists(),
        )
        .values(not_after=func.greatest(Lease.not_after, until))
    )
    return rowcount(result)


def expired_asks(s: Session) -> list[tuple[str, int]]:
    q = select(Step.run_id, Step.seq).where(
        Step.state == literal_column("'ASKED'"), Step.ask_deadline <= func.now()
    )
    return [(r.run_id, r.seq) for r in s.execute(q).all()]


def runs_with_expired_leases(s: Session, run_id: str | None = None) -> list[str]:
    """RUNNING runs holding a lease past its not_after and no ASKED step (people are slow: such a
    run keeps its lease); with ``run_id``, whether that one run still is such a run."""
    asked = select(Step.seq).where(Step.run_id == Run.run_id, Step.state == ASKED).exists()
    q = (
        select(Run.run_id)
        .join(Lease, Lease.run_id == Run.run_id)
        .where(Run.state == RUNNING, Lease.not_after <= func.now(), ~asked)
        .distinct()
    )
    if run_id is not None:
        q = q.where(Run.run_id == run_id)
    return list(s.execute(q).scalars())


def open_steps_of_finished_runs(s: Session) -> list[str]:
    """Through ``ix_steps_open``: the open steps are the live work, so the cost of this read does
    not grow with finished history."""
    q = (
        select(Step.run_id)
        .join(Run, Run.run_id == Step.run_id)
        .where(text(f"steps.{OPEN_STEPS}"), Run.state.in_(RUN_FINISHED))
        .distinct()
    )
    return list(s.execute(q).scalars())


def leases_of_finished_runs(s: Session) -> list[str]:
    q = (
        select(Lease.run_id)
        .join(Run, Run.run_id == Lease.run_id)
        .where(Run.state.in_(RUN_FINISHED))
        .distinct()
    )
    return list(s.execute(q).scalars())


def verifying_runs(s: Session) -> list[str]:
    return list(s.execute(select(Run.run_id).where(Run.state == VERIFYING)).scalars())


def unsealed_finished_runs(s: Session) -> list[str]:
    """Finished, not sealed, and not a rejected submit (those have no Record: reject Code 422),
    through ``ix_runs_unsealed``, whose predicate this is word for word."""
    q = select(Run.run_id).where(text(UNSEALED_RUNS))
    return list(s.execute(q).scalars())


def delete_run_leases(s: Session, run_id: str) -> int:
    result = s.execute(delete(Lease).where(Lease.run_id == run_id))
    return rowcount(result)
