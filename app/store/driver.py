"""The hot statements of a placed submit, sent on the session's own psycopg connection (SPEC §16:
a placed submit's server CPU is what limits its rate).

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

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq
from sqlalchemy import ClauseElement, Connection, Dialect
from sqlalchemy.orm import Session
from sqlalchemy.sql.compiler import SQLCompiler

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
_BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"


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
    """Run statements one after another in the caller's transaction, sent together (psycopg's
    pipeline mode: one round trip for all of them when there are several); the rows of each.
    The server still runs each as its own statement, after the previous one finished: in READ
    COMMITTED each takes its own snapshot, so a statement sees what committed while an earlier
    one waited on a lock. The first error ends the batch: nothing after it runs.

    ``begin``: the statements write. On a connection whose transaction begins with its first
    write (``Database.transaction``) and has not begun yet, BEGIN is sent ahead of them in the
    same round trip; on any other connection the driver has begun the transaction already or
    begins it as usual."""
    conn = _connection(s)
    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    sent: list[tuple[str, dict[str, Any] | None]] = []
    if begin and _begins_late(conn, driver):
        sent.append((_BEGIN, None))
    for statement, params in statements:
        compiled = _compile(statement, conn.dialect)
        sent.append((compiled.sql, compiled.values(params)))
    cursors: list[psycopg.Cursor[Any]] = []
    try:
        if len(sent) == 1:
            _send(conn, driver, cursors, *sent[0])
        else:
            with driver.pipeline():
                for sql, values in sent:
                    _send(conn, driver, cursors, sql, values)
        rows = [c.fetchall() if _has_rows(c) else [] for c in cursors]
        return rows[len(sent) - len(statements) :]
    except psycopg.Error as exc:
        # A batch's error arrives when the batch is read: it is reported with the whole batch.
        sql, values = sent[0] if len(sent) == 1 else ("; ".join(q for q, _ in sent), {})
        conn._handle_dbapi_exception(exc, sql, values, None, None)


def _begins_late(conn: Connection, driver: psycopg.Connection[Any]) -> bool:
    return driver.pgconn.transaction_status == pq.TransactionStatus.IDLE and bool(
        conn.get_execution_options().get(LATE_BEGIN)
    )


def _has_rows(cursor: psycopg.Cursor[Any]) -> bool:
    """Whether the statement returned rows (what ``cursor.description`` tells, without building
    its column objects)."""
    result = cursor.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK


def _send(
    conn: Connection,
    driver: psycopg.Connection[Any],
    cursors: list[psycopg.Cursor[Any]],
    sql: str,
    values: dict[str, Any] | None,
) -> None:
    cursor = _cursor(driver, sql, cursors)
    cursors.append(cursor)
    if values is None:
        # BEGIN, the only statement without parameters here: transaction control, which the
        # listeners never see from SQLAlchemy either; it cannot be prepared.
        cursor.execute(sql, prepare=False)
        return
    for listen in conn.dispatch.before_cursor_execute:
        listen(conn, cursor, sql, values, None, False)
    cursor.execute(sql, values, prepare=True)


def _cursor(
    driver: psycopg.Connection[Any], sql: str, taken: list[psycopg.Cursor[Any]]
) -> psycopg.Cursor[Any]:
    """The connection's cursor for ``sql``, kept open while the connection lives: psycopg keeps
    what it worked out for the last query a cursor ran (the conversion of its parameters: a new
    cursor or another query builds it again, for an array parameter a new dumper each time),
    and these statements are few and run over and over. Its last rows stay with it until it runs
    again; the statements here fetch a few rows each. A statement twice in one batch gets a
    cursor of its own for the second."""
    kept: dict[str, psycopg.Cursor[Any]] | None = getattr(driver, _CURSORS, None)
    if kept is None:
        kept = {}
        setattr(driver, _CURSORS, kept)
    cursor = kept.get(sql)
    if cursor is None or cursor.closed:
        cursor = kept[sql] = driver.cursor()
    elif any(c is cursor for c in taken):
        return driver.cursor()
    return cursor


_CURSORS = "_mediator_cursors"
