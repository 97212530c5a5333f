"""Runs, their events and the wake-debt marker."""

from __future__ import annotations

import functools
import hashlib
from collections import namedtuple
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    CTE,
    Connection,
    Integer,
    Select,
    Text,
    bindparam,
    case,
    delete,
    func,
    insert,
    null,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from app.contract import is_valid_id
from app.contract.types import Contract
from app.models import (
    LEASES_PKEY,
    RUNS_PKEY,
    TOMBSTONES_PKEY,
    Node,
    Run,
    RunEvent,
    Step,
    WakeDebt,
)
from app.states import FAILED, QUEUED, RUN_ALIVE, RUNNING, STEP_OPEN, check_run_change
from app.store import DuplicateRun, NodeTaken, NotQueued, PrunedRunId, constraint_name
from app.store.bulk import STEP_COLUMNS, rows_insert
from app.store.pipeline import fetch, pipelined
from app.store.placing import check_unreserved, leasing_statements
from app.store.teams import over_quota, quota_statement
from app.teams import Quota


def get_run(s: Session, run_id: str) -> Run | None:
    if not is_valid_id(run_id):  # names no run: 404, never a 500 (docs/api.md#conventions)
        return None
    return s.execute(select(Run).where(Run.run_id == run_id)).scalar_one_or_none()


def lock_run(s: Session, run_id: str) -> Run | None:
    """``SELECT … FOR UPDATE`` of the run row: the first lock of every transaction that changes a
    run (docs/queue.md#lock-order); the state is re-read under the lock."""
    if not is_valid_id(run_id):  # names no run: 404, never a 500 (docs/api.md#conventions)
        return None
    return s.execute(
        select(Run)
        .where(Run.run_id == run_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


class LockedRun(NamedTuple):
    """What a cancel reads of its run under the run's lock."""

    run_id: str
    state: str
    token_name: str | None


_LOCK_ROW = text(
    "SELECT run_id, state, token_name FROM runs WHERE run_id = :run_id FOR UPDATE"
).bindparams(bindparam("run_id", type_=Text))


def lock_run_row(s: Session, run_id: str) -> LockedRun | None:
    """:func:`lock_run` reading only the run's state and token (one small statement, no ORM
    object): the first lock of the transaction (docs/queue.md#lock-order)."""
    if not is_valid_id(run_id):
        return None
    rows = fetch(s, _LOCK_ROW, {"run_id": run_id})
    return LockedRun(*rows[0]) if rows else None


# A RUNNING run FAILED in one statement (docs/queue.md#leaving-the-queue): the run guarded by its
# state, its open steps, its leases (locked in node_id order before the first goes, as
# app.store.bulk.delete_in_key_order does), and its event. Each later part waits for the one
# before it (a one-time filter on its count), so the rows are locked in the lock order: the run
# (already held), its steps, its leases (docs/queue.md, "Lock order").
_FAIL_RUNNING = text(
    f"""
    WITH ended AS (
      UPDATE runs SET state = '{FAILED}', verdict = :verdict, ended_at = now()
      WHERE run_id = :run_id AND state = '{RUNNING}' RETURNING run_id),
    failed AS (
      UPDATE steps SET state = '{FAILED}', error = :error, ended_at = now()
      WHERE run_id = (SELECT run_id FROM ended)
        AND state IN ({", ".join(f"'{st}'" for st in STEP_OPEN)})
      RETURNING seq),
    freed AS (
      DELETE FROM leases WHERE node_id = ANY(ARRAY(
        SELECT node_id FROM leases
        WHERE run_id = (SELECT run_id FROM ended) AND (SELECT count(*) FROM failed) >= 0
        ORDER BY node_id FOR UPDATE))
      RETURNING node_id),
    event AS (
      INSERT INTO run_events (run_id, from_state, to_state, cause, by, by_declared_token)
      SELECT run_id, '{RUNNING}', '{FAILED}', :cause, :by, :by_declared_token FROM ended
      WHERE (SELECT count(*) FROM freed) >= 0)
    SELECT (SELECT count(*) FROM ended), ARRAY(SELECT node_id FROM freed ORDER BY node_id)
    """
).bindparams(
    bindparam("verdict", type_=JSONB),
    bindparam("run_id", type_=Text),
    bindparam("error", type_=Text),
    bindparam("cause", type_=Text),
    bindparam("by", type_=Text),
    bindparam("by_declared_token", type_=Text),
)


def fail_running_run(
    s: Session,
    run_id: str,
    *,
    verdict: dict[str, Any],
    step_error: str,
    cause: str,
    by: str | None,
    by_declared_token: str | None,
) -> list[str] | None:
    """A RUNNING run whose row the caller locked ends FAILED with ``verdict``, its open steps
    FAILED with ``step_error``, its leases deleted, its event written, in one statement; the freed
    nodes, or None when the run was not RUNNING."""
    check_run_change([RUNNING], FAILED)
    params = {
        "verdict": verdict,
        "run_id": run_id,
        "error": step_error,
        "cause": cause,
        "by": by,
        "by_declared_token": by_declared_token,
    }
    ((settled, freed),) = fetch(s, _FAIL_RUNNING, params)
    return sorted(freed) if settled else None


def create_run(
    s: Session | Connection,
    contract: Contract,
    *,
    state: str,
    principal: str | None,
    token_name: str | None,
    record_location: str,
    principal_self_declared: bool = False,
    assigned: list[dict[str, Any]] | None = None,
    reject: dict[str, Any] | None = None,
    leases: Sequence[dict[str, Any]] = (),
    steps: Sequence[dict[str, Any]] = (),
    cause: str = "submit",
    unreserved_for: int | None = None,
    quota: Quota | None = None,
    pinned_node: str | None = None,
) -> datetime:
    """A new run in one round trip: one statement for its row, its first event and its steps
    (rows from :func:`app.store.steps.step_rows`), as data-modifying CTEs, then its leases (rows
    from :func:`app.store.leases.lease_rows`) in the lock order (docs/queue.md, "Lock order"):
    its nodes' rows, the reservation check and the placements, the leases
    (:func:`app.store.placing.leasing_statements`). Returns created_at. A
    ``principal_self_declared`` is marked on the run and, with the token's name, on its first
    event (docs/tokens.md#principal). The write begins the caller's transaction when it has not
    begun (``Database.transaction``).

    The run row goes first, so a duplicate run_id waits on its key before this transaction holds
    any node, placement or lease row. ``unreserved_for``: the priority whose reservations the
    leases may not pass (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits; None:
    reservations are off, and nothing is checked or placed); a reservation found raises
    :class:`NodeTaken`. ``quota``: the run's team has ``max_nodes``, and its ``team_limits`` row is
    locked and its leases counted after the run row and before the nodes' rows; over quota raises
    :class:`OverQuota` (docs/teams.md, "Quotas").

    A duplicate run_id fails on ``pk_runs`` (:class:`DuplicateRun`), a node another run holds on
    ``pk_leases`` (:class:`NodeTaken`), the id of a pruned run on its tombstone (a trigger,
    :class:`PrunedRunId`, docs/retention.md#what-a-pruned-run-looks-like); either way nothing of the
    statement stays, and the caller rolls the transaction back whole
    (docs/design.md#submit-and-dry-run)."""
    params: dict[str, Any] = {
        "run_id": contract.run_id,
        "state": state,
        "work_id": contract.work_id,
        "principal": principal,
        "token_name": token_name,
        "principal_self_declared": principal_self_declared,
        "by_declared_token": token_name if principal_self_declared else None,
        "contract": contract.document,
        "requires": [r.to_wire() for r in contract.requires],
        "requires_key": contract.requires_key,
        "assigned": assigned,
        "reject": reject,
        "warnings": list(contract.warnings),
        "ledger_scope": contract.ledger_scope,
        "queue_timeout_seconds": contract.queue_timeout_seconds,
        "priority": contract.priority,
        "team": contract.team,
        "record_location": record_location,
        "pinned_node": pinned_node,
        "cause": cause,
        "new_steps": list(steps),
    }
    try:
        # On the session's driver connection: nothing here goes through the ORM's identity map.
        statement = _create_statement(bool(steps))
        leasing = leasing_statements(contract.run_id, unreserved_for, leases)
        if leasing and quota is not None:
            width = len({lease["node_id"] for lease in leases})
            leasing = [quota_statement(quota.team, quota.apart, width, quota.max_nodes), *leasing]
        rows = pipelined(s, (statement, params), *leasing, begin=True)
    except IntegrityError as exc:
        name = constraint_name(exc)
        if name == RUNS_PKEY:
            raise DuplicateRun(contract.run_id) from exc
        if name == LEASES_PKEY:
            raise NodeTaken(contract.run_id) from exc
        if name == TOMBSTONES_PKEY:
            raise PrunedRunId(contract.run_id) from exc
        raise
    except DBAPIError as exc:
        refused = over_quota(exc)
        if refused is not None:
            raise refused from exc
        raise
    if leasing and unreserved_for is not None:
        check_unreserved(contract.run_id, rows[-1])
    ((created_at,),) = rows[0]
    return created_at


@functools.cache
def _create_statement(with_steps: bool) -> Select[Any]:
    """The statement of :func:`create_run`, built once per shape (building it costs more Python
    than sending it); every value is a bound parameter."""
    state = bindparam("state", type_=Text)
    new_run = (
        insert(Run)
        .values(
            {
                c: bindparam(c)
                for c in (
                    "run_id",
                    "work_id",
                    "principal",
                    "token_name",
                    "principal_self_declared",
                    "contract",
                    "requires",
                    "requires_key",
                    "assigned",
                    "reject",
                    "warnings",
                    "ledger_scope",
                    "queue_timeout_seconds",
                    "priority",
                    "team",
                    "record_location",
                    "pinned_node",
                )
            }
            | {
                "state": state,
                "promoted_at": case((state == RUNNING, func.now())),
                "ended_at": case((state == FAILED, func.now())),
            }
        )
        .returning(Run.run_id, Run.created_at)
        .cte("new_run")
    )
    event = insert(RunEvent).from_select(
        ["run_id", "from_state", "to_state", "cause", "by", "by_declared_token"],
        select(
            new_run.c.run_id,
            null(),
            state,
            bindparam("cause", type_=Text),
            bindparam("principal", type_=Text),
            bindparam("by_declared_token", type_=Text),
        ),
    )
    ctes: list[CTE] = [event.cte("new_event")]
    if with_steps:
        ctes.append(rows_insert(Step, STEP_COLUMNS, "new_steps").cte("new_steps"))
    return select(new_run.c.created_at).add_cte(*ctes)


def add_event(
    s: Session,
    run_id: str,
    from_state: str | None,
    to_state: str,
    cause: str,
    by: str | None,
    by_declared_token: str | None = None,
) -> None:
    """One audit event; ``by_declared_token``: the token's name when ``by`` is a principal
    self-declared under it (docs/tokens.md#principal)."""
    s.execute(
        insert(RunEvent).values(
            run_id=run_id,
            from_state=from_state,
            to_state=to_state,
            cause=cause,
            by=by,
            by_declared_token=by_declared_token,
        )
    )


def promote_run(s: Session, run_id: str, assigned: list[dict[str, Any]]) -> float:
    """``UPDATE runs SET state='RUNNING' … WHERE run_id=… AND state='QUEUED'``: the row condition is
    the guard. A second scan waits on the row lock, re-checks after the first commits and gets
    0 rows -> :class:`NotQueued` (docs/design.md#promotion). Returns the seconds the run waited
    QUEUED, by the database's clock."""
    row = s.execute(
        update(Run)
        .where(Run.run_id == run_id, Run.state == QUEUED)
        .values(state=RUNNING, assigned=assigned, promoted_at=func.now())
        .returning(func.extract("epoch", func.now() - Run.created_at))
    ).first()
    if row is None:
        raise NotQueued(run_id)
    return max(0.0, float(row[0]))


def settle_run(
    s: Session,
    run_id: str,
    *,
    from_states: Sequence[str],
    state: str,
    verdict: dict[str, Any] | None = None,
    reject: dict[str, Any] | None = None,
) -> bool:
    """Guarded end of a run: only from ``from_states`` (the caller holds the run lock, the guard
    keeps a stale caller from ending a run twice). The transition is checked against
    ``app/states.py``."""
    check_run_change(from_states, state)
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
    team: str | None = None,
) -> list[Run]:
    """Newest first; ``before`` is the (created_at, run_id) of the last row of the previous page.
    ``team``: the team stored on the run, configured or not (docs/teams.md)."""
    q = select(Run)
    if team:
        q = q.where(Run.team == team)
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


def runs_by_ids(s: Session, run_ids: Iterable[str]) -> dict[str, Run]:
    ids = list(run_ids)
    if not ids:
        return {}
    return {r.run_id: r for r in s.execute(select(Run).where(Run.run_id.in_(ids))).scalars()}


def alive_states() -> tuple[str, ...]:
    return RUN_ALIVE


# Wake debt (docs/queue.md#crashes-and-restarts): one row, set by a wake that failed after its
# freeing commit.


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
    """Guarded state change (the caller holds the run lock), checked against ``app/states.py``."""
    check_run_change(from_states, to_state)
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


# The two-int4 advisory-lock space ("MSea"), as the log locks use it (app/store/log_lock.py).
SEAL_LOCK_CLASS = 0x4D536561


def _seal_key(run_id: str) -> int:
    """The advisory lock key of a run's seal (with :data:`SEAL_LOCK_CLASS`)."""
    digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


class SealReads(NamedTuple):
    """What a seal reads, rows with the columns' names as attributes: the run (None when it does
    not exist), its steps each with its node's label, its events."""

    run: Any
    steps: list[tuple[Any, str | None]]
    events: list[Any]


_SEALED_RUN = select(
    func.pg_try_advisory_xact_lock(
        bindparam("lock_class", type_=Integer), bindparam("lock_key", type_=Integer)
    ).label("locked"),
    *Run.__table__.columns,
).where(Run.run_id == bindparam("run_id", type_=Text))
_SEALED_STEPS = (
    select(*Step.__table__.columns, Node.label.label("node_label"))
    .outerjoin(Node, Node.node_id == Step.node_id)
    .where(Step.run_id == bindparam("run_id", type_=Text))
    .order_by(Step.seq)
)
_SEALED_EVENTS = (
    select(*RunEvent.__table__.columns)
    .where(RunEvent.run_id == bindparam("run_id", type_=Text))
    .order_by(RunEvent.id)
)


# The rows of the three, by their columns' names.
_SealedRun = namedtuple("_SealedRun", [c.name for c in _SEALED_RUN.selected_columns])  # type: ignore[misc]
_SealedStep = namedtuple("_SealedStep", [c.name for c in _SEALED_STEPS.selected_columns])  # type: ignore[misc]
_SealedEvent = namedtuple("_SealedEvent", [c.name for c in _SEALED_EVENTS.selected_columns])  # type: ignore[misc]


def seal_reads(s: Session, run_id: str) -> SealReads | None:
    """``pg_try_advisory_xact_lock`` on the run's seal (one seal of a run at a time across every
    process and host: the finishing request's and each reaper's) and the seal's reads, in one
    round trip; None when
    another holds the lock. The run is read in the statement that takes the lock: a seal that
    committed in between leaves ``sealed_at`` unseen, and the store's seal, which is idempotent,
    finds the Record sealed."""
    params = {"run_id": run_id, "lock_class": SEAL_LOCK_CLASS, "lock_key": _seal_key(run_id)}
    runs, steps, events = pipelined(
        s, (_SEALED_RUN, params), (_SEALED_STEPS, params), (_SEALED_EVENTS, params)
    )
    if not runs:
        return SealReads(None, [], [])
    run: Any = _SealedRun._make(runs[0])
    if not run.locked:
        return None
    rows: list[Any] = [_SealedStep._make(st) for st in steps]
    return SealReads(
        run, [(st, st.node_label) for st in rows], [_SealedEvent._make(e) for e in events]
    )


def mark_sealed(s: Session, run_id: str) -> None:
    """``sealed_at`` once: the Record is written and read-only (docs/design.md#records);
    idempotent."""
    fetch(s, _MARK_SEALED, {"run_id": run_id})


_MARK_SEALED = text(
    "UPDATE runs SET sealed_at = now() WHERE run_id = :run_id AND sealed_at IS NULL"
).bindparams(bindparam("run_id", type_=Text))


def queued_runs(s: Session, limit: int) -> list[Run]:
    """QUEUED runs in queue order (priority, then arrival), the order of
    :func:`app.store.queue.queue_place` counts in (the status page)."""
    q = (
        select(Run)
        .where(Run.state == QUEUED)
        .order_by(Run.priority.desc(), Run.created_at, Run.run_id)
        .limit(limit)
    )
    return list(s.execute(q).scalars())


def runs_in_states(s: Session, states: Sequence[str], limit: int) -> list[Run]:
    """Runs in ``states``, oldest first (the status page's running runs)."""
    q = (
        select(Run)
        .where(Run.state.in_(list(states)))
        .order_by(Run.created_at, Run.run_id)
        .limit(limit)
    )
    return list(s.execute(q).scalars())


def recently_finished(s: Session, limit: int) -> list[Run]:
    """Finished runs, the last to end first (the status page's recent verdicts)."""
    q = (
        select(Run)
        .where(Run.ended_at.is_not(None))
        .order_by(Run.ended_at.desc(), Run.run_id)
        .limit(limit)
    )
    return list(s.execute(q).scalars())
