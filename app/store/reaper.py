"""What the reaper's passes look for (docs/queue.md#the-reaper). Candidates are read without locks;
each is then handled in its own transaction that locks the run and re-checks the condition."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, bindparam, delete, func, literal_column, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from app.models import OPEN_STEPS, UNSEALED_RUNS, Lease, ReaperMarker, ReaperState, Run, Step
from app.states import ASKED, RUN_ALIVE, RUN_FINISHED, RUNNING, VERIFYING
from app.store import rowcount

REAPER_LOCK = 0x4D6564696174_0003  # one pass at a time across reapers (pg_try_advisory_lock)

# The session's own row of the lock in pg_locks (a bigint key shows as classid = its high 32
# bits, objid = its low 32 bits, objsubid 1), on a server that is still the primary: advisory
# locks work on a standby too, and a session left on a demoted server would find its lock there
# while the pass writes on the new primary (docs/queue.md, "The reaper").
_HOLDS_REAPER_LOCK = text(
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'"
    " AND pid = pg_backend_pid() AND granted AND objsubid = 1"
    " AND classid = CAST(:hi AS oid) AND objid = CAST(:lo AS oid))"
    " AND NOT pg_is_in_recovery()"
).bindparams(bindparam("hi", REAPER_LOCK >> 32), bindparam("lo", REAPER_LOCK & 0xFFFFFFFF))


class ReaperLockLost(Exception):
    """The reaper's lock is gone under a running pass: the pass ends after the row in hand."""


class ReaperLock:
    """One pass's turn: the session advisory lock :data:`REAPER_LOCK` on ``conn``, a connection of
    its own (autocommit) that the caller opened with the gate's liveness settings
    (:func:`app.db.gate_options`), so PostgreSQL drops the session of a host that lost power or
    of a process that hangs, and the lock with it, and another reaper passes again
    (docs/queue.md, "The reaper").

    While the pass runs, the session must never stay idle for ``idle_seconds``: :meth:`check`
    (between the pass's rows) and the thread of :meth:`kept` (during a long row: sealing a big
    Record, a prune batch) look at the session's pg_locks row, the thread whenever
    ``idle_seconds``/3 have passed since the last look. A look that fails or finds no lock marks
    the turn lost for good. Two threads share the connection, so every statement on it is made
    under one mutex."""

    def __init__(self, conn: Connection, idle_seconds: float) -> None:
        self._conn = conn
        self._period = idle_seconds / 3
        self._mutex = threading.Lock()
        self._taken = False
        self._lost: str | None = None  # why the turn was lost
        self._looked = time.monotonic()  # when the session's last statement ended

    def take(self) -> bool:
        """Take the lock if it is free (another reaper's pass holds it otherwise)."""
        with self._mutex:
            self._taken = bool(
                self._conn.execute(select(func.pg_try_advisory_lock(REAPER_LOCK))).scalar()
            )
            self._looked = time.monotonic()
        return self._taken

    def _look(self) -> None:
        """The look itself; the caller holds the mutex."""
        if self._lost is not None:
            return
        try:
            held = bool(self._conn.execute(_HOLDS_REAPER_LOCK).scalar())
        except Exception as exc:
            self._lost = f"its session failed: {type(exc).__name__}"
            return
        self._looked = time.monotonic()
        if not held:
            self._lost = "the lock is no longer held"

    def check(self) -> None:
        """Between two rows of the pass: raise :class:`ReaperLockLost` unless the session still
        holds the lock, looked at now."""
        with self._mutex:
            self._look()
        if self._lost is not None:
            raise ReaperLockLost(self._lost)

    @property
    def lost(self) -> str | None:
        """Why the turn was lost, as found by the last look; None while it is held."""
        return self._lost

    @contextmanager
    def kept(self) -> Iterator[None]:
        """A thread looks at the lock whenever ``idle_seconds``/3 have passed since the last look,
        for as long as the block runs (the pass's rows on pooled connections leave this session
        idle meanwhile)."""
        stop = threading.Event()
        thread = threading.Thread(
            target=self._keep, args=(stop,), name="mediator-reaper-lock", daemon=True
        )
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _keep(self, stop: threading.Event) -> None:
        while self._lost is None:
            due = self._looked + self._period - time.monotonic()
            if stop.wait(max(0.0, due)):
                return
            with self._mutex:
                if time.monotonic() - self._looked >= self._period:
                    self._look()

    def close(self) -> None:
        """Give the lock back and close the session; never raises (a session that is gone took
        its lock with it). The explicit unlock makes the lock free before this returns, not
        when the server gets round to ending the session."""
        with self._mutex:
            if self._taken and self._lost is None:
                try:
                    self._conn.execute(select(func.pg_advisory_unlock(REAPER_LOCK)))
                except Exception:
                    pass
            try:
                self._conn.close()
            except Exception:
                pass


@dataclass(frozen=True)
class PassStart:
    now: datetime
    previous: datetime | None  # the previous pass's time
    # the wake mark the previous pass read (docs/design.md#the-scan-gate-and-wake-marks)
    previous_mark: int | None
    covered: int  # the highest mark a successful scan has covered, read now
    # The database restarted or switched since the previous pass: its server's start time
    # changed, or the pass's row in the UNLOGGED marker table is gone.
    restarted: bool = False


_LAST_MARK = text("(SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM wake_mark)")


def read_pass_start(s: Session) -> PassStart:
    """What the previous pass stored (``reaper_state``) and what this one compares it with, read
    without a lock: the reaper's lock keeps passes apart, and :func:`record_pass` locks the row
    last in the pass's first transaction (the singletons come last in the lock order).

    ``restarted``: the previous pass stored another ``pg_postmaster_start_time()`` (a restart, or
    another server: a failover), or its marker row is gone (crash recovery empties UNLOGGED
    tables and keeps the start time; a promoted standby never had the row). A pass with no start
    time stored before it (the first ever, or the first after the upgrade that added it) knows
    of no server to compare with: never a restart."""
    now, server_started = s.execute(select(func.now(), func.pg_postmaster_start_time())).one()
    row = s.execute(
        select(
            ReaperState.last_pass_at, ReaperState.wake_mark, ReaperState.server_started_at
        ).where(ReaperState.id == 1)
    ).first()
    covered = int(s.execute(text("SELECT last_value FROM wake_covered")).scalar_one())
    marker = s.execute(select(ReaperMarker.id)).first() is not None
    if row is None:
        return PassStart(now, None, None, covered)
    restarted = row.server_started_at is not None and (
        row.server_started_at != server_started or not marker
    )
    return PassStart(now, row.last_pass_at, row.wake_mark, covered, restarted)


def record_pass(s: Session) -> None:
    """Record this pass: its time, the ``wake_mark`` it reads, the start time of the server it
    runs on, and its row in ``reaper_marker`` (the next pass compares them, see
    :func:`read_pass_start`). Two passes that overlap (one lost its lock) take turns on the
    ``reaper_state`` row."""
    stored = {
        "last_pass_at": func.now(),
        "wake_mark": _LAST_MARK,
        "server_started_at": func.pg_postmaster_start_time(),
    }
    s.execute(
        pg_insert(ReaperState)
        .values(id=1, **stored)
        .on_conflict_do_update(index_elements=[ReaperState.id], set_=stored)
    )
    s.execute(pg_insert(ReaperMarker).values(id=1).on_conflict_do_nothing())


def extend_leases(s: Session, window: timedelta) -> int:
    """Outage grace: every lease of an unfinished run ends no sooner than ``now() + window``, so
    nodes have a full window to re-advertise after the Mediator was down, and a node that really
    died is reaped one window after the outage, not one outage later
    (docs/queue.md#crashes-and-restarts). A lease that already ends later keeps its ``not_after``;
    an advert renewing meanwhile also sets ``now() + window``, and ``GREATEST`` never moves a lease
    earlier. Returns the number of leases moved."""
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


def expired_lease_nodes(s: Session, run_id: str) -> list[str]:
    """The nodes whose lease of the run is past its not_after (each gets a strike when that ends
    the run, docs/operators.md "Quarantine"), in node_id order."""
    q = (
        select(Lease.node_id)
        .where(Lease.run_id == run_id, Lease.not_after <= func.now())
        .order_by(Lease.node_id)
    )
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


# The tables whose statistics the planner's choices for requests hang on: the candidate read's
# index (nodes), the queue's and the runs list's (runs), a run's steps (steps). A bulk change (a
# fleet advertising at once, a CI system queueing thousands of runs) leaves them stale until
# autovacuum's next look, up to a minute later (docs/design.md#targets).
STATISTICS_TABLES = ("nodes", "runs", "steps")
_STALE_STATISTICS = text(
    "SELECT relname FROM pg_stat_user_tables"
    " WHERE schemaname = current_schema() AND relname = ANY(:tables)"
    " AND n_mod_since_analyze >= :least"
    " AND n_mod_since_analyze >= :fraction * GREATEST(n_live_tup, 1)"
    " ORDER BY relname"
).bindparams(bindparam("tables"), bindparam("least"), bindparam("fraction"))


def stale_statistics(conn: Connection, *, least: int, fraction: float) -> list[str]:
    """The tables of :data:`STATISTICS_TABLES` changed by at least ``least`` rows and by at least
    ``fraction`` of their live rows since they were last analysed."""
    params = {"tables": list(STATISTICS_TABLES), "least": least, "fraction": fraction}
    return [str(r[0]) for r in conn.execute(_STALE_STATISTICS, params)]


def analyze(conn: Connection, table: str) -> None:
    """``ANALYZE`` one of :data:`STATISTICS_TABLES` (in autocommit), waiting for no lock: a table
    that autovacuum is working on is left to it."""
    if table not in STATISTICS_TABLES:
        raise ValueError(f"not a table whose statistics the reaper keeps: {table}")
    conn.exec_driver_sql("SET lock_timeout = '100ms'")
    try:
        conn.exec_driver_sql(f"ANALYZE {table}")
    finally:
        conn.exec_driver_sql("RESET lock_timeout")
