"""The scan gate: two PostgreSQL session advisory locks that serialise wake scans across every
process and host (docs/design.md#the-scan-gate-and-wake-marks), and the wake marks that make a skip
a debt someone pays.

A requester first tries the *waiting* lock. If another holds it, a scan is already waiting and has
not started, so it starts after the requester's commit: the requester skips. Otherwise it takes the
*scanning* lock (blocking), gives up the waiting lock and scans. At most one scan runs and one
waits, and no freeing commit is left without a scan that starts after it — while the waiter lives.

A waiter that never scans (its host lost power, its process hangs) would make everyone skip for as
long as PostgreSQL keeps its session, so (docs/design.md#the-scan-gate-and-wake-marks):
- the gate's session is opened with server-side keepalives and ``idle_session_timeout`` (see
  :func:`app.db.gate_options`): PostgreSQL drops a dead or hung host's session and its locks;
- every wake point takes a mark (``nextval('wake_mark')``) before it tries the gate, a successful
  scan stores the mark it read before its first queue read in ``wake_covered``, and the reaper
  scans when a mark stays uncovered, taking the scanning lock directly (:meth:`ScanGate.enter_directly`);
- a running scan checks that its session still holds the scanning lock (:meth:`ScanGate.check`).

Advisory locks are re-entrant within one PostgreSQL session, so the threads of one process, which
share the gate's connection, are kept apart by the same two roles in memory: ``_waiter`` (a thread
of this process holds the waiting lock and has not started scanning) and ``_scanning`` (a thread of
this process scans).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from sqlalchemy import Connection, bindparam, func, select, text
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.orm import Session

from app.store.pipeline import fetch

# Two fixed keys in one namespace of the bigint advisory-lock space ("Mediat" + 1 / 2).
WAITING_LOCK = 0x4D6564696174_0001
SCANNING_LOCK = 0x4D6564696174_0002

_inherited: list[object] = []  # connections inherited across fork: kept, never closed here

# A bigint advisory lock is shown in pg_locks as classid (high 32 bits), objid (low 32 bits),
# objsubid 1.
# A session left on a server demoted to a standby would still see its lock there (advisory locks
# are not WAL-logged and work on a standby) while the scan writes on the new primary: a standby
# counts as the lock gone.
_HOLDS_SCANNING_LOCK = text(
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'"
    " AND pid = pg_backend_pid() AND granted AND objsubid = 1"
    " AND classid = CAST(:hi AS oid) AND objid = CAST(:lo AS oid))"
    " AND NOT pg_is_in_recovery()"
).bindparams(bindparam("hi", SCANNING_LOCK >> 32), bindparam("lo", SCANNING_LOCK & 0xFFFFFFFF))

LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout expired


class GateLost(Exception):
    """The scanning lock is gone under a running scan (its session was dropped): the scan stops."""


def _dead(conn: Connection) -> bool:
    """Whether the session is gone (its locks with it): closed, invalidated by SQLAlchemy, or
    ended by the server (psycopg marks the connection closed or broken, e.g. after an
    ``idle_session_timeout``)."""
    if conn.closed or conn.invalidated:
        return True
    try:
        dbapi = conn.connection.dbapi_connection
    except Exception:
        return True
    return dbapi is None or bool(getattr(dbapi, "closed", True) or getattr(dbapi, "broken", False))


class ScanGate:
    def __init__(
        self,
        connect: Callable[[], Connection],
        idle_seconds: float = 30.0,
        deaths: Callable[[], int] | None = None,
    ) -> None:
        self._connect = connect
        # How many dead connections this process has met (Database.deaths), and how many it had
        # when the shared session opened: when it moves, that session is replaced (a switch to
        # another primary leaves it on the old server).
        self._deaths = deaths or (lambda: 0)
        self._opened_at = 0
        self._mutex = threading.Lock()  # guards _waiter and short uses of the connection
        self._scanning = threading.Lock()
        self._waiter = False
        self._conn: Connection | None = None
        self._pid: int | None = None
        self._idle = idle_seconds
        # The session holding the scanning lock for this process's running scan (the shared one,
        # or the reaper's own), whether it is the shared one, and when it was last checked.
        self._holder: Connection | None = None
        self._direct = False
        self._checked = 0.0

    def _connection(self) -> Connection:
        if self._pid != os.getpid():
            if self._conn is not None:
                # The parent's session: closing it here would end the parent's locks.
                _inherited.append(self._conn)
            self._conn, self._pid = None, os.getpid()
        if self._conn is not None and self._deaths() != self._opened_at:
            old, self._conn = self._conn, None
            try:
                old.close()  # its locks go with it; a scan that held one stops at its check
            except Exception:
                pass
        if self._conn is None or _dead(self._conn):
            self._opened_at = self._deaths()
            self._conn = self._connect()
        return self._conn

    def _forget_if_dead(self) -> None:
        """After an error on the shared session: replace it only when it is really gone (then any
        lock it held is gone with it). A statement that merely failed leaves the session, and the
        scanning lock a scan of this process may hold on it, as they are (issue: a gate error must
        not drop the scanning lock under a running scan)."""
        conn = self._conn
        if conn is not None and _dead(conn):
            self._conn = None
            try:
                conn.close()
            except Exception:
                pass

    def _call(self, fn: object, key: int) -> bool:
        try:
            return bool(self._connection().execute(select(fn(key))).scalar())  # type: ignore[operator]
        except Exception:
            self._forget_if_dead()
            raise

    def _first_call(self, fn: object, key: int) -> bool:
        """The first statement of a turn, on a session the database may have dropped meanwhile
        (a restart, a failover, an ``idle_session_timeout``): a dead session is replaced once and
        the statement tried again. Nothing is lost by that: this turn holds no lock yet."""
        try:
            return self._call(fn, key)
        except (OperationalError, InterfaceError):
            if self._conn is not None and not _dead(self._conn):
                raise
            return self._call(fn, key)

    def enter(self) -> bool:
        """Wait for this caller's turn to scan; False means skip: a scan that starts later is
        already waiting. After True the caller must call :meth:`leave` (in a ``finally``)."""
        with self._mutex:
            if self._waiter:
                return False
            if not self._first_call(func.pg_try_advisory_lock, WAITING_LOCK):
                return False
            self._waiter = True
        try:
            self._scanning.acquire()
            try:
                self._call(func.pg_advisory_lock, SCANNING_LOCK)
            except BaseException:
                self._scanning.release()
                raise
            self._holder, self._direct, self._checked = self._conn, False, time.monotonic()
        finally:
            with self._mutex:
                self._waiter = False
                if self._conn is not None:
                    try:
                        self._call(func.pg_advisory_unlock, WAITING_LOCK)
                    except Exception:
                        pass  # the session is gone and the lock with it
        return True

    def enter_directly(self, timeout: float) -> bool:
        """The reaper's turn (docs/design.md#the-scan-gate-and-wake-marks): the scanning lock taken
        directly, whatever the waiting lock says, on a session of its own under ``lock_timeout`` =
        ``timeout``. False: not within the timeout (the next pass tries again). After True the
        caller must call :meth:`leave`."""
        if not self._scanning.acquire(timeout=timeout):
            return False  # a scan of this very process runs and has not ended in that time
        try:
            conn = self._connect()
        except BaseException:
            self._scanning.release()
            raise
        try:
            conn.execute(
                text("SELECT set_config('lock_timeout', :ms, false)"),
                {"ms": str(max(1, int(timeout * 1000)))},
            )
            conn.execute(select(func.pg_advisory_lock(SCANNING_LOCK)))
        except BaseException as exc:
            self._scanning.release()
            try:
                conn.close()
            except Exception:
                pass
            if isinstance(exc, DBAPIError) and _sqlstate(exc) == LOCK_NOT_AVAILABLE:
                return False
            raise
        self._holder, self._direct, self._checked = conn, True, time.monotonic()
        return True

    def check(self, *, now: bool = False) -> None:
        """Inside a turn: raise :class:`GateLost` unless this turn's session still holds the
        scanning lock. Asked often; looks at most every ``idle_seconds``/3 unless ``now`` (before
        writing reservations). The look is itself a statement on the gate's session, so the
        session is not idle while its scan runs on pooled connections."""
        if not now and time.monotonic() - self._checked < self._idle / 3:
            return
        holder = self._holder
        if holder is None:
            raise GateLost("no scan turn is held")
        try:
            if self._direct:
                held = bool(holder.execute(_HOLDS_SCANNING_LOCK).scalar())
            else:
                with self._mutex:
                    held = bool(holder.execute(_HOLDS_SCANNING_LOCK).scalar())
        except Exception as exc:
            raise GateLost(f"the gate's session failed: {type(exc).__name__}") from exc
        if not held:
            raise GateLost("the scanning lock is no longer held")
        self._checked = time.monotonic()

    def leave(self) -> None:
        holder, direct = self._holder, self._direct
        self._holder, self._direct = None, False
        try:
            if direct and holder is not None:
                try:
                    holder.close()  # the session ends, and its lock with it
                except Exception:
                    pass
            else:
                with self._mutex:
                    if holder is not None and holder is self._conn and not _dead(holder):
                        try:
                            self._call(func.pg_advisory_unlock, SCANNING_LOCK)
                        except Exception:
                            pass
        finally:
            self._scanning.release()

    def close(self) -> None:
        with self._mutex:
            if self._pid == os.getpid():
                conn, self._conn = self._conn, None
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass


def _sqlstate(exc: DBAPIError) -> str | None:
    return getattr(exc.orig, "sqlstate", None)


def take_mark(conn: Connection) -> int:
    """A wake point's mark, right after its freeing commit
    (docs/queue.md#which-commit-frees-and-its-mark): ``nextval`` on a sequence with CACHE 1, outside
    any transaction (no row lock, nothing to roll back)."""
    return int(conn.execute(text("SELECT nextval('wake_mark')")).scalar_one())


LAST_MARK_SQL = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM wake_mark"
_LAST_MARK = text(LAST_MARK_SQL)


def last_mark(conn: Connection | Session) -> int:
    """The highest mark taken so far (0: none yet). A sequence is read as it is now, whatever
    the snapshot of the transaction it is read in."""
    ((mark,),) = fetch(conn, _LAST_MARK, {})
    return int(mark)


# The last mark and whether no run is QUEUED (``ix_runs_queued_age``: one index probe); when none
# is, the marks up to it are covered in the same statement (``cover_marks``' setval). The sequence
# is read as it is now, and the queue in the statement's snapshot.
_COVER_IF_QUEUE_EMPTY = text(
    f"WITH look AS (SELECT ({LAST_MARK_SQL}) AS mark,"
    " NOT EXISTS (SELECT 1 FROM runs WHERE state = 'QUEUED') AS empty)"
    " SELECT look.empty, CASE WHEN look.empty THEN setval('wake_covered',"
    " GREATEST(look.mark, (SELECT last_value FROM wake_covered))) END FROM look"
)


def cover_if_queue_empty(conn: Connection) -> bool:
    """When no run is QUEUED (a scan would find nothing to promote or reserve), cover every mark
    taken so far, as a scan that found the queue empty does, and say so; else change nothing.
    One statement."""
    ((empty, _covered),) = fetch(conn, _COVER_IF_QUEUE_EMPTY, {})
    return bool(empty)


def cover_marks(conn: Connection, mark: int) -> None:
    """A successful scan covered every mark up to ``mark`` (read before its first queue read).
    Called while it holds the scanning lock, or for a queue found empty (which needs no scan):
    two covers at once may leave the lower of the two, which only makes the reaper scan once
    more; a cover never claims a mark its caller did not cover."""
    conn.execute(
        text("SELECT setval('wake_covered', GREATEST(:m, (SELECT last_value FROM wake_covered)))"),
        {"m": mark},
    )
