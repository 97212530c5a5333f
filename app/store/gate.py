"""The scan gate: two PostgreSQL session advisory locks that serialise wake scans across every
process and host (SPEC §7).

A requester first tries the *waiting* lock. If another holds it, a scan is already waiting and has
not started, so it starts after the requester's commit: the requester skips. Otherwise it takes the
*scanning* lock (blocking), gives up the waiting lock and scans. At most one scan runs and one
waits, and no freeing commit is left without a scan that starts after it.

Advisory locks are re-entrant within one PostgreSQL session, so the threads of one process, which
share the gate's connection, are kept apart by the same two roles in memory: ``_waiter`` (a thread
of this process holds the waiting lock and has not started scanning) and ``_scanning`` (a thread of
this process scans).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from sqlalchemy import Connection, func, select
from sqlalchemy.exc import InterfaceError, OperationalError

# Two fixed keys in one namespace of the bigint advisory-lock space ("Mediat" + 1 / 2).
WAITING_LOCK = 0x4D6564696174_0001
SCANNING_LOCK = 0x4D6564696174_0002

_inherited: list[object] = []  # connections inherited across fork: kept, never closed here


class ScanGate:
    def __init__(self, connect: Callable[[], Connection]) -> None:
        self._connect = connect
        self._mutex = threading.Lock()  # guards _waiter and short uses of the connection
        self._scanning = threading.Lock()
        self._waiter = False
        self._conn: Connection | None = None
        self._pid: int | None = None

    def _connection(self) -> Connection:
        if self._pid != os.getpid():
            if self._conn is not None:
                # The parent's session: closing it here would end the parent's locks.
                _inherited.append(self._conn)
            self._conn, self._pid = None, os.getpid()
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            self._conn = self._connect()
        return self._conn

    def _drop(self) -> None:
        """After a database error the session (and any lock it held) is gone or unknown: close it
        so the next turn starts on a fresh one."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def _call(self, fn: object, key: int) -> bool:
        try:
            return bool(self._connection().execute(select(fn(key))).scalar())  # type: ignore[operator]
        except Exception:
            self._drop()
            raise

    def _first_call(self, fn: object, key: int) -> bool:
        """The first statement of a turn, on a session the database may have dropped meanwhile
        (a restart, a failover, a reset connection): a dead session is replaced once and the
        statement tried again. Nothing is lost by that: this turn holds no lock yet."""
        try:
            return self._call(fn, key)
        except (OperationalError, InterfaceError):
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
        finally:
            with self._mutex:
                self._waiter = False
                if self._conn is not None:
                    try:
                        self._call(func.pg_advisory_unlock, WAITING_LOCK)
                    except Exception:
                        pass  # the session is gone and the lock with it
        return True

    def leave(self) -> None:
        try:
            with self._mutex:
                if self._conn is not None:
                    try:
                        self._call(func.pg_advisory_unlock, SCANNING_LOCK)
                    except Exception:
                        pass
        finally:
            self._scanning.release()

    def close(self) -> None:
        with self._mutex:
            if self._pid == os.getpid():
                self._drop()
