"""Engines, sessions and the scan-gate connection, created per process (SPEC §1).

Nothing here is opened at import or inherited across gunicorn's fork: the first use in a process
(checked by pid) creates the engine, and a forked child that finds its parent's engine drops it
without closing the parent's sockets.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from sqlalchemy import Connection, Engine, create_engine, pool
from sqlalchemy.orm import Session, sessionmaker

from app.config import Config


class Database:
    """The process's engine (a small pool) and its session factory."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._engine: Engine | None = None
        self._sessions: sessionmaker[Session] | None = None

    def _ensure(self) -> None:
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid == os.getpid():
                return
            if self._engine is not None:
                # Inherited from the parent: forget its connections, never close them (they are
                # the parent's sockets).
                self._engine.dispose(close=False)
            self._engine = create_engine(
                self.config.sqlalchemy_url,
                pool_size=self.config["database.pool_size"],
                max_overflow=0,
                # SPEC §15: a request that gets no connection in time is a 503, never a hang.
                pool_timeout=self.config["database.pool_timeout"],
                pool_pre_ping=True,
                connect_args={"application_name": "mediator"},
            )
            self._sessions = sessionmaker(self._engine, expire_on_commit=False)
            self._pid = os.getpid()

    @property
    def engine(self) -> Engine:
        self._ensure()
        assert self._engine is not None
        return self._engine

    @property
    def sessions(self) -> sessionmaker[Session]:
        self._ensure()
        assert self._sessions is not None
        return self._sessions

    def begin(self) -> AbstractContextManager[Session]:
        """``with db.begin() as s:`` one transaction, committed on success, rolled back on error."""
        return self.sessions.begin()

    @contextmanager
    def read(self, *, snapshot: bool = False) -> Iterator[Session]:
        """A read-only unit of work; the transaction is rolled back at the end. ``snapshot``:
        every statement sees one snapshot (REPEATABLE READ), for views that count across tables
        (SPEC §7 "one snapshot"); the pool restores the level when the connection returns."""
        with self.sessions() as s:
            if snapshot:
                s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            yield s

    def dedicated_connection(self) -> Connection:
        """A connection outside the request pool, in autocommit, for session-level advisory locks
        and LISTEN; the caller owns it and closes it."""
        engine = create_engine(
            self.config.sqlalchemy_url,
            poolclass=pool.NullPool,
            connect_args={"application_name": "mediator-gate"},
        )
        return engine.connect().execution_options(isolation_level="AUTOCOMMIT")

    def dispose(self) -> None:
        with self._lock:
            if self._engine is not None and self._pid == os.getpid():
                self._engine.dispose()
            self._engine = None
            self._sessions = None
            self._pid = None
