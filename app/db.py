"""Engines, sessions and the scan-gate connection, created per process
(docs/design.md#shape-of-the-service).

Nothing here is opened at import or inherited across gunicorn's fork: the first use in a process
(checked by pid) creates the engine, and a forked child that finds its parent's engine drops it
without closing the parent's sockets.
"""

from __future__ import annotations

import os
import select
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sqlalchemy import Connection, Engine, create_engine, event, pool
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from app.config import Config, to_libpq_url
from app.jsonbytes import compact
from app.store.pipeline import LATE_BEGIN

# What every connection the Mediator opens adds to the configured string, unless the string sets
# it (docs/deploy.md#11-a-database-with-a-standby): only the primary is taken, a host that does
# not answer is given up after 2 s (the next one is tried), and a silent peer is found dead by
# client-side keepalives within about 10 s.
CONNECT_DEFAULTS = {
    "target_session_attrs": "primary",
    "connect_timeout": "2",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
}

# A server that is no longer the primary, or that is going away: the connection is dead, and so
# is every other of the pool (read_only_sql_transaction, admin_shutdown, crash_shutdown,
# cannot_connect_now). 57P05, idle_session_timeout, is the scan gate's expected end.
DEAD_SQLSTATES = frozenset({"25006", "57P01", "57P02", "57P03"})
IDLE_SESSION_ENDED = "57P05"


# psycopg's own timeout of a wait (private; app/store/pipeline.py's start-up check looks for it).
_WaitTimeout: type[Exception] = getattr(psycopg.errors, "_WaitTimeout", psycopg.OperationalError)


# The WARNING of a COMMIT whose wait for a synchronous standby was cancelled (an administrator's
# pg_cancel_backend, or the session terminated): committed on this server only.
_UNREPLICATED = "canceling the wait for synchronous replication"
_UNREPLICATED_USER = "canceling wait for synchronous replication"


class UnreplicatedCommit(psycopg.OperationalError):
    """A COMMIT that PostgreSQL answered with a WARNING that its wait for the standby was cancelled:
    it committed on this server only, and a failover may lose it. The request is answered 503 as
    one whose outcome is unknown (docs/deploy.md#11-a-database-with-a-standby)."""


class BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait on its server (a statement, a COMMIT, a lock) has a
    deadline on the client side, ``deadline`` seconds (None: none). A server that stopped
    answering (its processes stopped, its host frozen) enforces no timeout of its own, and its
    kernel keeps acknowledging keepalives, so without one a request would wait for ever
    (docs/deploy.md#11-a-database-with-a-standby). A wait past it closes the connection, which
    then counts as dead (the pool is invalidated), and raises ``OperationalError``."""

    deadline: float | None = None
    unreplicated: bool = False  # a commit's wait for the standby was cancelled since the check

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        if timeout is not None or not self.deadline:
            done = super().wait(gen, interval, timeout)
        else:
            try:
                done = super().wait(gen, interval, self.deadline)
            except _WaitTimeout:
                self.close()  # half a protocol exchange: nothing can bring it back
                raise psycopg.OperationalError(
                    f"the database did not answer within {self.deadline:g} s"
                ) from None
        self.check_replicated()
        return done

    def check_replicated(self) -> None:
        """Raise :class:`UnreplicatedCommit` when a commit since the last check was answered
        with the WARNING of a cancelled wait for the standby."""
        if self.unreplicated:
            self.unreplicated = False
            raise UnreplicatedCommit(
                "the commit was not confirmed by the synchronous standby: its outcome is unknown"
            )


def bounded_connect(info: str, *, deadline: float | None, **kwargs: Any) -> BoundedConnection:
    """:class:`BoundedConnection` to ``info`` (:func:`conninfo`'s) with ``deadline``."""
    conn = BoundedConnection.connect(info, **kwargs)
    conn.deadline = deadline
    conn.add_notice_handler(_unreplicated_notice(weakref.ref(conn)))
    return conn


def _unreplicated_notice(
    ref: weakref.ReferenceType[BoundedConnection],
) -> Callable[[psycopg.errors.Diagnostic], None]:
    """A notice handler of one connection: the WARNING of a cancelled wait for the synchronous
    standby marks it (:meth:`BoundedConnection.check_replicated` raises at the wait's end)."""

    def note(diag: psycopg.errors.Diagnostic) -> None:
        message = diag.message_primary or ""
        if diag.severity_nonlocalized == "WARNING" and message.startswith(
            (_UNREPLICATED, _UNREPLICATED_USER)
        ):
            conn = ref()
            if conn is not None:
                conn.unreplicated = True

    return note


def conninfo(url: str) -> str:
    """libpq's connection string for ``url`` (``database.url``): a URL, one host or several
    (``postgresql://h1:5432,h2:5432/db``), or a keyword string (``host=h1,h2 port=5432,5432
    dbname=db``), taken as given (``postgresql+psycopg://`` read as ``postgresql://``), with
    :data:`CONNECT_DEFAULTS` added where it does not set them."""
    base = to_libpq_url(url)
    given = conninfo_to_dict(base)
    return make_conninfo(base, **{k: v for k, v in CONNECT_DEFAULTS.items() if k not in given})


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not be reached or used (unreachable, restarting,
    switching to a standby, a dead connection, a deadline passed), not that a statement was
    wrong: a request is answered 503, and the reaper's next pass gives every lease a full window
    first (docs/deploy.md#11-a-database-with-a-standby)."""
    return isinstance(exc, OperationalError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    )


def mark_dead_connections(context: ExceptionContext) -> None:
    """SQLAlchemy's ``handle_error`` hook: an error of :data:`DEAD_SQLSTATES` counts as a
    disconnect, so the connection and the whole pool are invalidated (the next checkout
    connects again, and ``target_session_attrs`` finds the primary)."""
    if getattr(context.original_exception, "sqlstate", None) in DEAD_SQLSTATES:
        context.is_disconnect = True


def engine_for(
    url: str,
    *,
    name: str,
    options: str | None = None,
    on_dead: Callable[[], None] | None = None,
    deadline: float | None = None,
    **kwargs: Any,
) -> Engine:
    """An engine whose connections psycopg opens from :func:`conninfo` of ``url`` (SQLAlchemy's
    own URL parser takes one host only), named ``name`` (``application_name``), with libpq's
    server-side ``options`` when given; ``on_dead`` is called when a connection of it is found
    dead; ``deadline``: every wait of its connections on the server, seconds
    (:class:`BoundedConnection`); ``kwargs`` go to ``create_engine`` (pool settings).

    No statement is prepared by psycopg itself: the statements that run often are prepared by
    ``app.store.pipeline`` under names of its own, which live as long as the connection; psycopg
    would send ``DEALLOCATE ALL`` after every ROLLBACK once it had prepared a statement of its
    own (the end of every read), dropping those with its own."""
    info = conninfo(url)
    extra: dict[str, Any] = {"application_name": name, "prepare_threshold": None}
    if options:
        extra["options"] = options

    def connect() -> psycopg.Connection[Any]:
        return bounded_connect(info, deadline=deadline, **extra)

    def dead(context: ExceptionContext) -> None:
        mark_dead_connections(context)
        # A session that idle_session_timeout ended (the gate's, after a quiet spell) is gone,
        # but its server is fine: the other sessions of the process keep theirs.
        expected_end = getattr(context.original_exception, "sqlstate", None) == IDLE_SESSION_ENDED
        if context.is_disconnect and on_dead is not None and not expected_end:
            on_dead()

    engine = create_engine("postgresql+psycopg://", creator=connect, **kwargs)
    event.listen(engine, "handle_error", dead)
    return engine


def _drop_if_server_spoke(dbapi_conn: Any, record: Any, proxy: Any) -> None:
    """The pool's liveness check at checkout, without a round trip. An idle connection has
    nothing to read unless its server ended it: a restart, a shutdown or an administrator's
    ``pg_terminate_backend`` sends its FATAL message and closes the socket (a crash closes it),
    and either makes the socket readable. Such a connection is dropped and the pool connects
    again, so the first request after a database restart is answered normally. (SQLAlchemy's
    ``pool_pre_ping`` does the same with a ``SELECT 1`` on every checkout: one round trip per
    transaction.)"""
    try:
        readable, _, _ = select.select([dbapi_conn.pgconn.socket], [], [], 0)
    except Exception as exc:  # the socket is already closed (psycopg or the OS says so)
        raise DisconnectionError("the database connection is closed") from exc
    if readable:
        raise DisconnectionError("the database server ended this connection")


def _leave_autocommit(conn: Connection, driver: Any) -> None:
    """Back to transactions before the pool takes the connection again; one that cannot switch
    (its server went away) is dropped, never handed out in autocommit."""
    try:
        driver.autocommit = False
    except Exception:
        conn.invalidate()


def gate_options(idle_seconds: float) -> str:
    """The scan gate's session settings (docs/design.md#the-scan-gate-and-wake-marks): server-side
    TCP keepalives and a user timeout drop the session of a host that lost power or its network, and
    ``idle_session_timeout`` the session of a process that hangs (a scan keeps its session busy
    by checking its lock every ``idle_seconds``/3). ``idle_session_timeout`` needs PostgreSQL 14."""
    settings = {
        "tcp_keepalives_idle": "10",
        "tcp_keepalives_interval": "5",
        "tcp_keepalives_count": "3",
        "tcp_user_timeout": "30000",
        "idle_session_timeout": str(max(1, int(idle_seconds * 1000))),
    }
    return " ".join(f"-c {k}={v}" for k, v in settings.items())


class Database:
    """The process's engine (a small pool) and its session factory."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._engine: Engine | None = None
        self._sessions: sessionmaker[Session] | None = None
        # How many times a connection of this process was found dead (met_dead).
        self.deaths = 0

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
            self._engine = engine_for(
                self.config.database_url,
                name="mediator",
                on_dead=self.met_dead,
                # A statement's own timeout, and a while for its answer to come back.
                deadline=self.config["database.statement_timeout_seconds"] + 5,
                pool_size=self.config["database.pool_size"],
                max_overflow=0,
                # A request that gets no connection in time is a 503, never a hang
                # (docs/configuration.md#keys, ``database.pool_timeout``).
                pool_timeout=self.config["database.pool_timeout"],
                json_serializer=compact,  # jsonb parameters (SQLAlchemy hands it to psycopg)
            )
            event.listen(self._engine, "checkout", _drop_if_server_spoke)
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
    def transaction(self) -> Iterator[Connection]:
        """``with db.transaction() as conn:`` one transaction on a pooled connection, committed on
        success, rolled back on error: :meth:`begin` without the ORM session, for the hot paths
        whose statements run on the driver path (``app.store.pipeline``), where the session's
        bookkeeping around each statement was a tenth of a placed submit's CPU.

        The transaction begins with its first write, a statement the store sends with
        ``begin=True``, which carries BEGIN in that write's round trip; the reads before it run
        in autocommit, each with its own snapshot as every statement has in READ COMMITTED (so a
        lock one of them took would end with it: a locking read belongs after the first write).
        A placed submit pays no round trip for BEGIN. ORM work inside it (after that write) joins
        the transaction through ``Session(bind=conn)``. The connection leaves autocommit before
        it returns to the pool."""
        with self.engine.connect() as conn:
            driver = conn.connection.driver_connection
            assert driver is not None
            # psycopg's own switch: SQLAlchemy's isolation-level option costs as much again as
            # the rest of the checkout, on the hottest path.
            driver.autocommit = True
            try:
                with conn.begin():
                    yield conn.execution_options(**{LATE_BEGIN: True})
            finally:
                _leave_autocommit(conn, driver)

    @contextmanager
    def read(self, *, snapshot: bool = False) -> Iterator[Session]:
        """A read-only unit of work; the transaction is rolled back at the end. ``snapshot``:
        every statement sees one snapshot (REPEATABLE READ), for views that count across tables
        (docs/queue.md#what-a-queued-runs-view-explains); the pool restores the level when the
        connection returns."""
        with self.sessions() as s:
            if snapshot:
                s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            yield s

    @contextmanager
    def autocommit(self) -> Iterator[Connection]:
        """A pooled connection in autocommit, for one statement that needs no transaction (a
        NOTIFY): no BEGIN and no COMMIT round trip."""
        with self.engine.connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    def dedicated_connection(
        self, *, options: str | None = None, name: str = "mediator-gate"
    ) -> Connection:
        """A connection outside the request pool, in autocommit, for session-level advisory locks
        and LISTEN, or the claim notifications; the caller owns it and closes it. ``options``:
        libpq's server-side settings of the session (:func:`gate_options`); ``name``: its
        ``application_name``."""
        engine = engine_for(
            self.config.database_url,
            name=name,
            options=options,
            on_dead=self.met_dead,
            deadline=self.config["gate.idle_seconds"],
            poolclass=pool.NullPool,
        )
        return engine.connect().execution_options(isolation_level="AUTOCOMMIT")

    def met_dead(self) -> None:
        """A connection of this process was found dead
        (docs/deploy.md#11-a-database-with-a-standby): the pool is invalidated by SQLAlchemy;
        the sessions outside it (the gate's, the listener's) see :attr:`deaths` move and close
        theirs."""
        with self._lock:
            self.deaths += 1

    def dispose(self) -> None:
        with self._lock:
            if self._engine is not None and self._pid == os.getpid():
                self._engine.dispose()
            self._engine = None
            self._sessions = None
            self._pid = None
