"""The hot statements of a placed submit, sent on the session's own psycopg connection (a placed
submit's server CPU is what limits its rate: docs/design.md#targets).

A statement is still built with SQLAlchemy (or written as ``text()``) and compiled once; what is
skipped is SQLAlchemy's per-execution work: compiling the parameters, and the result object it
sets up around every cursor. Each statement is prepared on the connection and its rows come back
as tuples. It runs in the caller's transaction, and everything else stays as SQLAlchemy does it:
the engine's ``before_cursor_execute`` listeners see each statement, and a database error goes
through the connection's own error handling (``handle_error`` listeners, a lost connection
invalidated), so the caller gets SQLAlchemy's ``DBAPIError`` subclasses — ``IntegrityError``
with its constraint name, a deadlock's SQLSTATE for ``retrying`` — as from ``Session.execute``.
"""

from __future__ import annotations

import inspect
import select
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import psycopg
import psycopg.errors
import sqlalchemy
from psycopg import adapt, pq
from psycopg.abc import Transformer
from psycopg.pq.abc import PGconn, PGresult
from sqlalchemy import ClauseElement, Connection, Dialect
from sqlalchemy.orm import Session
from sqlalchemy.sql.compiler import SQLCompiler

try:  # psycopg's private query conversion: a release without it is named by driver_problem()
    from psycopg._queries import PostgresQuery
except ImportError:  # pragma: no cover (the installed, tested psycopg has it)
    PostgresQuery = None  # type: ignore[assignment,misc]

Row = tuple[Any, ...]


@dataclass(frozen=True)
class _Compiled:
    statement: ClauseElement
    sql: str
    fixed: dict[str, Any]  # values the statement carries itself (its literals)
    processors: dict[str, Callable[[Any], Any]]  # the bind types' conversions (JSONB, …)

    def values(self, params: Mapping[str, Any]) -> dict[str, Any]:
        values = {**self.fixed, **params}
        for name, process in self.processors.items():
            values[name] = process(values[name])
        return values


_compiled: dict[tuple[int, str], _Compiled] = {}
_compiling = threading.Lock()


def _compile(statement: ClauseElement, dialect: Dialect) -> _Compiled:
    """Once per statement: the statements given here are built once and live as long as the
    process (module constants, or cached by shape)."""
    key = (id(statement), dialect.name)
    found = _compiled.get(key)
    if found is not None and found.statement is statement:
        return found
    compiled = statement.compile(dialect=dialect)
    assert isinstance(compiled, SQLCompiler)
    # An expanding IN would be rendered per call: these statements take arrays (``= ANY``).
    assert "POSTCOMPILE" not in compiled.string, "a statement with an expanding parameter"
    fixed: dict[str, Any] = {}
    processors: dict[str, Callable[[Any], Any]] = {}
    for bind, name in compiled.bind_names.items():
        if not bind.required:
            fixed[name] = bind.effective_value
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            processors[name] = process
    found = _Compiled(statement, compiled.string, fixed, processors)
    with _compiling:
        _compiled[key] = found
    return found


def _connection(s: Session | Connection) -> Connection:
    return s.connection() if isinstance(s, Session) else s


# The execution option of a connection whose transaction begins with its first write
# (``Database.transaction``): its driver connection is in autocommit until a statement sent with
# ``begin=True`` sends BEGIN itself, in that statement's round trip.
LATE_BEGIN = "mediator_late_begin"
_BEGIN = b"BEGIN ISOLATION LEVEL READ COMMITTED"


def fetch(
    s: Session | Connection,
    statement: ClauseElement,
    params: Mapping[str, Any],
    *,
    begin: bool = False,
) -> list[Row]:
    """Run one statement in the caller's transaction; its rows (none for a statement that
    returns none). ``begin``: see :func:`pipelined`."""
    return pipelined(s, (statement, params), begin=begin)[0]


def pipelined(
    s: Session | Connection,
    *statements: tuple[ClauseElement, Mapping[str, Any]],
    begin: bool = False,
) -> list[list[Row]]:
    """Run statements one after another in the caller's transaction, sent together (libpq's
    pipeline mode: one round trip for all of them); the rows of each. The server still runs
    each as its own statement, after the previous one finished: in READ COMMITTED each takes its
    own snapshot, so a statement sees what committed while an earlier one waited on a lock. The
    first error ends the batch: nothing after it runs.

    ``begin``: the statements write. On a connection whose transaction begins with its first
    write (``Database.transaction``) and has not begun yet, BEGIN is sent ahead of them in the
    same round trip. On a connection outside autocommit whose transaction has not begun, the
    BEGIN psycopg would send goes ahead of them in the same way (its isolation level with it)."""
    conn = _connection(s)
    driver = _driver(conn)
    idle = driver.pgconn.transaction_status == pq.TransactionStatus.IDLE
    opening: bytes | None = None
    if idle and begin and conn.get_execution_options().get(LATE_BEGIN):
        opening = _BEGIN
    elif idle and not driver.autocommit:
        opening = driver._get_tx_start_command()
    sent = _compiled_batch(conn, statements)
    try:
        return exchange(driver, opening, sent)
    except psycopg.Error as exc:
        _reraise(conn, exc, sent)


def commit_then(
    s: Session | Connection, *statements: tuple[ClauseElement, Mapping[str, Any]]
) -> Exception | None:
    """Commit the caller's transaction, then run ``statements`` after the commit in a transaction
    of their own (committed at the batch's end), all in one round trip: what must follow a
    commit (a NOTIFY that wakes a claim to read what it wrote) without a round trip of its own.
    The COMMIT's error is raised (nothing after it ran, the transaction is gone); an error of the
    statements after it is returned (their transaction rolled back, the commit stands). The
    caller's transaction manager finds the connection idle and sends no COMMIT of its own."""
    conn = _connection(s)
    driver = _driver(conn)
    sent = _compiled_batch(conn, statements)
    after: list[psycopg.Error] = []
    try:
        exchange(driver, b"COMMIT", sent, after_opening=after)
    except psycopg.Error as exc:
        _reraise(conn, exc, [("COMMIT", {}), *sent])
    return after[0] if after else None


def _driver(conn: Connection) -> psycopg.Connection[Any]:
    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    return driver


def _compiled_batch(
    conn: Connection, statements: tuple[tuple[ClauseElement, Mapping[str, Any]], ...]
) -> list[tuple[str, dict[str, Any]]]:
    """Each statement's SQL and values, as the engine's ``before_cursor_execute`` listeners see
    them."""
    sent: list[tuple[str, dict[str, Any]]] = []
    for statement, params in statements:
        compiled = _compile(statement, conn.dialect)
        values = compiled.values(params)
        for listen in conn.dispatch.before_cursor_execute:
            listen(conn, None, compiled.sql, values, None, False)
        sent.append((compiled.sql, values))
    return sent


def _reraise(
    conn: Connection, exc: psycopg.Error, sent: list[tuple[str, dict[str, Any]]]
) -> NoReturn:
    """A batch's error, which arrives when the whole batch is read, reported with the batch
    through the connection's own error handling (SQLAlchemy's exception classes)."""
    sql, values = sent[0] if len(sent) == 1 else ("; ".join(q for q, _ in sent), {})
    conn._handle_dbapi_exception(exc, sql, values, None, None)
    raise AssertionError("not reached: SQLAlchemy raises its own")


def exchange(
    driver: psycopg.Connection[Any],
    opening: bytes | None,
    sent: list[tuple[str, dict[str, Any]]],
    *,
    after_opening: list[psycopg.Error] | None = None,
) -> list[list[Row]]:
    """One round trip: ``opening`` (a BEGIN or a COMMIT, or None) and the statements, each
    prepared on the connection the first time it runs there, sent in one write and read back in
    one pass; the rows of each statement. On libpq directly (psycopg's ``PGconn``): psycopg's own pipeline
    writes and polls once per statement and keeps a cursor per statement, which cost this
    batch two to three times the Python a single statement costs. The parameters are converted
    by psycopg's adapters and the rows by its loaders, as its cursors do. The first error is
    raised as psycopg raises it (its SQLSTATE class, its diagnostics), after the whole batch was
    read, so the connection is ready for the ROLLBACK. ``after_opening``: an error of the
    statements after an opening that succeeded is appended there instead of raised."""
    pgconn = driver.pgconn
    state = _state_of(driver)
    # What each result answers, in order: a statement (True) or not, and the (key, name) a
    # PREPARE's result records once it succeeded.
    commands: list[tuple[bool, tuple[tuple[bytes, tuple[int, ...]], bytes] | None]] = []
    queries = []
    for sql, values in sent:
        query = PostgresQuery(state.adapters)
        query.convert(sql, values)
        queries.append(query)
    pgconn.enter_pipeline_mode()
    try:
        if opening is not None:
            pgconn.send_query_params(opening, None)
            commands.append((False, None))
        for query in queries:
            key = (query.query, query.types)
            name = state.prepared.get(key)
            if name is None and len(state.prepared) < _MAX_PREPARED:
                state.names += 1
                name = b"_mediator_%d" % state.names
                pgconn.send_prepare(name, query.query, param_types=query.types)
                commands.append((False, (key, name)))
            if name is None:  # too many shapes on this connection: an unnamed statement
                pgconn.send_query_params(
                    query.query, query.params, param_types=query.types, param_formats=query.formats
                )
            else:
                pgconn.send_query_prepared(name, query.params, param_formats=query.formats)
            commands.append((True, None))
        pgconn.pipeline_sync()
        seconds = getattr(driver, "deadline", None)  # app.db.BoundedConnection's
        deadline = time.monotonic() + seconds if seconds else None
        _flush(pgconn, deadline)
        results = _read_until_sync(pgconn, len(commands), deadline)
    except BaseException:
        # Part of a batch on the wire and its results unread (the connection failed, or the
        # thread was interrupted): nothing can bring the session back to a known state. Closed,
        # it is dropped by the pool instead of serving the next unit of work.
        driver.close()
        raise
    pgconn.exit_pipeline_mode()
    error: PGresult | None = None
    rows: list[list[Row]] = []
    for result, (is_statement, named) in zip(results, commands, strict=True):
        status = result.status
        if status == pq.ExecStatus.FATAL_ERROR:
            error = error or result
        elif status == pq.ExecStatus.PIPELINE_ABORTED:
            continue
        elif named is not None:
            state.prepared[named[0]] = named[1]  # prepared, whatever follows
        elif is_statement:
            rows.append(_rows(state.loaders, result))
    if error is not None:
        if error.error_field(pq.DiagnosticField.SQLSTATE) in _PREPARED_LOST:
            state.prepared.clear()  # prepared again on the next use
        exc = psycopg.errors.error_from_result(error, encoding=driver.info.encoding)
        opened = opening is not None and results[0].status != pq.ExecStatus.FATAL_ERROR
        if after_opening is None or not opened:
            raise exc
        after_opening.append(exc)
    # A COMMIT answered with the WARNING of a cancelled wait for the standby
    # (app.db.BoundedConnection.check_replicated): its outcome is unknown.
    check = getattr(driver, "check_replicated", None)
    if check is not None:
        check()
    return rows


def _rows(loaders: Transformer, result: PGresult) -> list[Row]:
    if result.status != pq.ExecStatus.TUPLES_OK:
        return []
    loaders.set_pgresult(result)
    return loaders.load_rows(0, result.ntuples, tuple)


def _flush(pgconn: PGconn, deadline: float | None) -> None:
    while pgconn.flush():
        _wait(pgconn, select.POLLOUT, deadline)


def _read_until_sync(pgconn: PGconn, count: int, deadline: float | None) -> list[PGresult]:
    """The results of ``count`` commands sent before a sync, then the sync's: every result of
    the batch is read, whatever failed."""
    results: list[PGresult] = []
    while True:
        while pgconn.is_busy():
            _wait(pgconn, select.POLLIN, deadline)
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:  # the end of one command's results
            continue
        if result.status == pq.ExecStatus.PIPELINE_SYNC:
            if len(results) != count:
                raise psycopg.InternalError(f"expected {count} results, got {len(results)}")
            return results
        results.append(result)


def _wait(pgconn: PGconn, events: int, deadline: float | None) -> None:
    """Until the connection's socket is ready (poll: any descriptor number, unlike select), at
    most until ``deadline`` (``time.monotonic()``; None: no end): a server that stopped
    answering enforces no timeout of its own (app.db.BoundedConnection)."""
    poller = select.poll()
    poller.register(pgconn.socket, events)
    while True:
        if deadline is None:
            ready = poller.poll()
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                raise psycopg.OperationalError("the database did not answer in time")
            ready = poller.poll(max(1, int(left * 1000)))
        if ready:
            return


@dataclass
class _State:
    """What a connection keeps for :func:`exchange`: the statements prepared on it, and the
    adapters that convert parameters and rows (psycopg's, with what they worked out for the
    types seen so far)."""

    adapters: Transformer
    loaders: Transformer
    prepared: dict[tuple[bytes, tuple[int, ...]], bytes]
    names: int = 0  # names given so far (one that failed to prepare is not given again)


def _state_of(driver: psycopg.Connection[Any]) -> _State:
    state: _State | None = getattr(driver, _STATE, None)
    if state is None:
        state = _State(adapt.Transformer(driver), adapt.Transformer(driver), {})
        setattr(driver, _STATE, state)
    return state


_STATE = "_mediator_driver_state"
# Prepared statements a connection keeps at most (they live as long as it): the driver path's
# statements are a few dozen, and each shape of parameter types is one more.
_MAX_PREPARED = 200
# The server no longer has a statement as it was prepared: dropped by someone else's DEALLOCATE
# (26000), or a table changed under it by a migration (0A000, "cached plan must not change
# result type"). The batch fails; the connection's statements are prepared again.
_PREPARED_LOST = (b"26000", b"0A000")


# ------------------------------------------------------------------ what this module assumes

# The runtime versions this module was last tested with (constraints/runtime.txt pins them).
TESTED = {"psycopg": "3.3", "sqlalchemy": "2.1"}


def driver_problem() -> str | None:
    """None when the installed psycopg and SQLAlchemy still have the parts of their private API
    this module uses (psycopg's ``PostgresQuery`` and a connection's ``_get_tx_start_command``,
    SQLAlchemy's ``Connection._handle_dbapi_exception``; and psycopg's ``_WaitTimeout``, which
    app/db.py's deadlines catch), else one line saying what is missing
    and what to install. Checked when the app is built: a newer release that moved one fails
    at start-up, not inside a submit."""
    missing: list[str] = []
    try:
        query = PostgresQuery(adapt.Transformer())
        query.convert("SELECT %(a)s", {"a": 1})
        for attr in ("query", "params", "types", "formats"):
            if not hasattr(query, attr):
                missing.append(f"psycopg._queries.PostgresQuery.{attr}")
    except Exception as exc:
        missing.append(f"psycopg._queries.PostgresQuery ({type(exc).__name__})")
    if not callable(getattr(psycopg.Connection, "_get_tx_start_command", None)):
        missing.append("psycopg.Connection._get_tx_start_command")
    # app.db.BoundedConnection's deadline: psycopg's own timeout of a wait.
    if getattr(psycopg.errors, "_WaitTimeout", None) is None:
        missing.append("psycopg.errors._WaitTimeout")
    handle = getattr(Connection, "_handle_dbapi_exception", None)
    if handle is None:
        missing.append("sqlalchemy.Connection._handle_dbapi_exception")
    else:
        params = list(inspect.signature(handle).parameters)[1:6]
        if params != ["e", "statement", "parameters", "cursor", "context"]:
            missing.append("sqlalchemy.Connection._handle_dbapi_exception(e, statement, …)")
    if not missing:
        return None
    installed = f"psycopg {psycopg.__version__}, SQLAlchemy {sqlalchemy.__version__}"
    tested = ", ".join(f"{k} {v}" for k, v in TESTED.items())
    return (
        f"the statement pipeline (app/store/pipeline.py) needs {', '.join(missing)}, which "
        f"{installed} lack; install the versions of constraints/runtime.txt (tested: {tested})"
    )
