"""Runs, their events and the wake-debt marker."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, delete, func, insert, or_, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.contract import is_valid_id
from app.contract.types import Contract
from app.models import RUNS_PKEY, Run, RunEvent, WakeDebt
from app.states import FAILED, QUEUED, RUN_ALIVE, RUNNING
from app.store import DuplicateRun, NotQueued, constraint_name


def get_run(s: Session, run_id: str) -> Run | None:
    if not is_valid_id(run_id):  # SPEC §13: names no run; 404, never a 500
        return None
    return s.execute(select(Run).where(Run.run_id == run_id)).scalar_one_or_none()


def lock_run(s: Session, run_id: str) -> Run | None:
    """``SELECT … FOR UPDATE`` of the run row: the first lock of every transaction that changes a
    run (SPEC §1 lock order); the state is re-read under the lock."""
    if not is_valid_id(run_id):  # SPEC §13: names no run; 404, never a 500
        return None
    return s.execute(
        select(Run)
        .where(Run.run_id == run_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


def insert_run(
    s: Session,
    contract: Contract,
    *,
    state: str,
    principal: str | None,
    token_name: str | None,
    assigned: list[dict[str, Any]] | None = None,
    reject: dict[str, Any] | None = None,
    cause: str = "submit",
) -> datetime:
    """Insert the run row first and flush it, so a concurrent duplicate run_id fails on
    ``pk_runs`` before anything else is written (SPEC §6.7). Returns created_at."""
    finished = state == FAILED
    try:
        created_at = s.execute(
            insert(Run)
            .values(
                run_id=contract.run_id,
                state=state,
                work_id=contract.work_id,
                principal=principal,
                token_name=token_name,
                contract=contract.document,
                requires=[r.to_wire() for r in contract.requires],
                requires_key=contract.requires_key,
                assigned=assigned,
                reject=reject,
                warnings=list(contract.warnings),
                ledger_scope=contract.ledger_scope,
                queue_timeout_seconds=contract.queue_timeout_seconds,
                priority=contract.priority,
                promoted_at=func.now() if state == RUNNING else None,
                ended_at=func.now() if finished else None,
            )
            .returning(Run.created_at)
        ).scalar_one()
    except IntegrityError as exc:
        if constraint_name(exc) == RUNS_PKEY:
            raise DuplicateRun(contract.run_id) from exc
        raise
    add_event(s, contract.run_id, None, state, cause, principal)
    return created_at


def add_event(
    s: Session, run_id: str, from_state: str | None, to_state: str, cause: str, by: str | None
) -> None:
    s.execute(
        insert(RunEvent).values(
            run_id=run_id, from_state=from_state, to_state=to_state, cause=cause, by=by
        )
    )


def promote_run(s: Session, run_id: str, assigned: list[dict[str, Any]]) -> None:
    """``UPDATE runs SET state='RUNNING' … WHERE run_id=… AND state='QUEUED'``: the row condition is
    the guard. A second scan waits on the row lock, re-checks after the first commits and gets
    0 rows -> :class:`NotQueued` (SPEC §7)."""
    row = s.execute(
        update(Run)
        .where(Run.run_id == run_id, Run.state == QUEUED)
        .values(state=RUNNING, assigned=assigned, promoted_at=func.now())
        .returning(Run.run_id)
    ).first()
    if row is None:
        raise NotQueued(run_id)


def finish_run(
    s: Session,
    run_id: str,
    *,
    from_states: Sequence[str],
    state: str,
    verdict: dict[str, Any] | None = None,
    reject: dict[str, Any] | None = None,
) -> bool:
    """Guarded end of a run: only from ``from_states`` (the caller holds the run lock, the guard
    keeps a stale caller from ending a run twice)."""
    values: dict[str, Any] = {"state": state, "ended_at": func.now()}
    if verdict is not None:
        values["verdict"] = verdict
    if reject is not None:
        values["reject"] = reject
    row = s.execute(
        update(Run)
        .where(Run.run_id == run_id, Run.state.in_(from_states))
        .values(**values)
        .returning(Run.run_id)
    ).first()
    return row is not None


def run_events(s: Session, run_id: str) -> list[RunEvent]:
    return list(
        s.execute(select(RunEvent).where(RunEvent.run_id == run_id).order_by(RunEvent.id)).scalars()
    )


def list_runs(
    s: Session,
    *,
    state: str | None,
    since: datetime | None,
    work: str | None,
    before: tuple[datetime, str] | None,
    limit: int,
) -> list[Run]:
    """Newest first; ``before`` is the (created_at, run_id) of the last row of the previous page."""
    q = select(Run)
    if state:
        q = q.where(Run.state == state)
    if since is not None:
        q = q.where(Run.created_at >= since)
    if work:
        q = q.where(Run.work_id == work)
    if before is not None:
        q = q.where(tuple_(Run.created_at, Run.run_id) < tuple_(*before))
    q = q.order_by(Run.created_at.desc(), Run.run_id.desc()).limit(limit)
    return list(s.execute(q).scalars())


def count_queued_before(s: Session, priority: int, created_at: datetime, run_id: str) -> int:
    """QUEUED runs ahead in queue order: higher priority, or equal priority and older (the queue
    position of a run, SPEC §7 "Explaining the wait", §7a)."""
    return s.execute(
        select(func.count())
        .select_from(Run)
        .where(
            Run.state == QUEUED,
            or_(
                Run.priority > priority,
                and_(
                    Run.priority == priority,
                    or_(
                        Run.created_at < created_at,
                        and_(Run.created_at == created_at, Run.run_id < run_id),
                    ),
                ),
            ),
        )
    ).scalar_one()


def runs_by_ids(s: Session, run_ids: Iterable[str]) -> dict[str, Run]:
    ids = list(run_ids)
    if not ids:
        return {}
    return {r.run_id: r for r in s.execute(select(Run).where(Run.run_id.in_(ids))).scalars()}


def alive_states() -> tuple[str, ...]:
    return RUN_ALIVE


# Wake debt (SPEC §7): one row, set by a wake that failed after its freeing commit.


def set_wake_debt(s: Session, reason: str) -> None:
    s.execute(
        pg_insert(WakeDebt)
        .values(id=1, reason=reason[:1000])
        .on_conflict_do_update(
            index_elements=[WakeDebt.id], set_={"reason": reason[:1000], "set_at": func.now()}
        )
    )


def wake_debt_set(s: Session) -> bool:
    return s.execute(select(WakeDebt.id)).first() is not None


def clear_wake_debt(s: Session, set_before: datetime | None = None) -> None:
    """Clear the marker; with ``set_before``, only one set before that time (a debt set while the
    paying scan ran stays for the next pass)."""
    q = delete(WakeDebt)
    if set_before is not None:
        q = q.where(WakeDebt.set_at <= set_before)
    s.execute(q)


def set_run_state(s: Session, run_id: str, from_states: Sequence[str], to_state: str) -> bool:
    """Guarded state change (the caller holds the run lock)."""
    row = s.execute(
        update(Run)
        .where(Run.run_id == run_id, Run.state.in_(list(from_states)))
        .values(state=to_state)
        .returning(Run.run_id)
    ).first()
    return row is not None


def set_run_fields(s: Session, run_id: str, **values: Any) -> None:
    """Fields that are not the state (``assigned`` after acquire/release); run row locked."""
    s.execute(update(Run).where(Run.run_id == run_id).values(**values))


def mark_sealed(s: Session, run_id: str) -> None:
    """``sealed_at`` once: the Record is written and read-only (SPEC §11); idempotent."""
    s.execute(
        update(Run)
        .where(Run.run_id == run_id, Run.sealed_at.is_(None))
        .values(sealed_at=func.now())
    )
