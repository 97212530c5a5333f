"""Concurrency for the tests: several apps on one fresh database (each app is what one gunicorn
worker process has: its own pool and its own scan-gate connection), threads released together at
a Barrier, a submit held inside its transaction, waiting (with a bounded deadline) for what only
another connection or process can show, and what the database shows of them: locks held and
waited for, listening sessions, deadlocks, run states.

Nothing here mocks the database or the clock: every thread commits for real on its own
connection, and "time passes" only by SQL on the database's own timestamps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from sqlalchemy import text

from app import create_app
from app.config import to_libpq_url
from app.contract.types import role_from_wire
from app.match import Reject, match
from app.store.gate import SCANNING_LOCK, WAITING_LOCK
from app.store.nodes import live_adverts, unavailable_node_ids
from app.store.queue import QueuedRun
from tests.support.apps import client_of, make_config

JOIN_TIMEOUT = 30.0
T = TypeVar("T")


class Apps:
    """``n`` Mediator apps on one database, like ``n`` worker processes."""

    def __init__(self, url: str, records: Any, n: int = 2, **keys: Any) -> None:
        keys.setdefault("database.pool_size", 10)
        self.records = records
        self.apps = [create_app(make_config(url, records, **keys)) for _ in range(n)]

    def __getitem__(self, i: int) -> Any:
        return self.apps[i]

    def ctx(self, i: int = 0) -> Any:
        return self.apps[i].extensions["mediator"]

    def client(self, i: int = 0) -> Any:
        return client_of(self.apps[i])

    def close(self) -> None:
        for a in self.apps:
            a.extensions["mediator"].close()


@contextmanager
def apps_on(url: str, records: Any, n: int = 2, **keys: Any) -> Iterator[Apps]:
    apps = Apps(url, records, n, **keys)
    try:
        yield apps
    finally:
        apps.close()


@contextmanager
def connect(url: str) -> Iterator[psycopg.Connection[Any]]:
    """An operator's autocommit psycopg connection to the database ``url`` (a SQLAlchemy or
    libpq URL)."""
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
        yield conn


def race(*calls: Callable[[], Any], timeout: float = JOIN_TIMEOUT) -> list[Any]:
    """Run each call in its own thread, released together by one Barrier; returns their results
    in order and re-raises the first exception. A thread still running after ``timeout`` fails
    the test (a hang is a defect, never a reason to wait longer)."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException | None] = [None] * len(calls)

    def body(i: int, fn: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout)
            results[i] = fn()
        except BaseException as exc:
            errors[i] = exc

    threads = [
        threading.Thread(target=body, args=(i, fn), daemon=True) for i, fn in enumerate(calls)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"threads still running after {timeout}s: {hung}"
    for exc in errors:
        if exc is not None:
            raise exc
    return results


class Background:
    """One call in a thread of its own, started at once; its result or exception is kept."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def result(self, timeout: float = 20.0) -> Any:
        assert self.done.wait(timeout), "the call never returned"
        if self.error is not None:
            raise self.error
        return self.value


@contextmanager
def waiting_lock_held(sql: Any) -> Iterator[None]:
    """Hold the scan gate's *waiting* lock from an operator connection: every wake point then
    skips its scan ("another scan is waiting", docs/design.md#the-scan-gate-and-wake-marks). Used
    only to build a starting picture (a QUEUED run next to a free node) through the real API,
    without any scan promoting it."""
    assert sql.execute("select pg_try_advisory_lock(%s)", (WAITING_LOCK,)).fetchone()[0]
    try:
        yield
    finally:
        sql.execute("select pg_advisory_unlock(%s)", (WAITING_LOCK,))


@contextmanager
def scanning_lock_held(sql: Any) -> Iterator[None]:
    """Hold the gate's *scanning* lock: as if a scan of another process were running."""
    sql.execute("select pg_advisory_lock(%s)", (SCANNING_LOCK,))
    try:
        yield
    finally:
        sql.execute("select pg_advisory_unlock(%s)", (SCANNING_LOCK,))


def await_condition(
    check: Callable[[], Any],
    what: str,
    timeout: float = 10.0,
    interval: float = 0.005,
    explain: Callable[[], Any] | None = None,
) -> None:
    """Wait for a state that only the database can show (a backend waiting on a lock), or another
    process (a live server, a database server of the test's): there is no event to subscribe to
    across connections, so look with a bounded deadline, every ``interval`` seconds (longer for a
    look that is a request). ``explain``: what to add to the failure, read when it fails."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            detail = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}{detail}")
        time.sleep(interval)


def await_value(look: Callable[[], T | None], what: str, timeout: float = 20.0) -> T:
    """Look until ``look`` answers something (not None, not False) or the deadline passes: what
    another process did shows only in what it serves, and there is no event to subscribe to."""
    deadline = time.monotonic() + timeout
    while True:
        value = look()
        if value is not None and value is not False:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.05)


def lock_holders(sql: Any, key: int) -> int:
    """Sessions holding the advisory lock ``key`` (granted)."""
    return sql.execute(
        "select count(*) from pg_locks where locktype = 'advisory' and granted"
        " and ((classid::bigint << 32) | objid::bigint) = %s and database = "
        "(select oid from pg_database where datname = current_database())",
        (key,),
    ).fetchone()[0]


def lock_waiters(sql: Any, key: int) -> int:
    return sql.execute(
        "select count(*) from pg_locks where locktype = 'advisory' and not granted"
        " and ((classid::bigint << 32) | objid::bigint) = %s and database = "
        "(select oid from pg_database where datname = current_database())",
        (key,),
    ).fetchone()[0]


def backends_waiting_on_locks(sql: Any, application_name: str = "mediator") -> int:
    return sql.execute(
        "select count(*) from pg_stat_activity where datname = current_database()"
        " and application_name = %s and wait_event_type = 'Lock'",
        (application_name,),
    ).fetchone()[0]


def session_pids(sql: Any, application_name: str) -> list[int]:
    """The backends of this database's sessions named ``application_name`` (``mediator-gate``,
    ``mediator-listener``, …), sorted: the same list twice is the same sessions."""
    rows = sql.execute(
        "select pid from pg_stat_activity where datname = current_database()"
        " and application_name = %s",
        (application_name,),
    ).fetchall()
    return sorted(r[0] for r in rows)


def listeners(sql: Any) -> int:
    """Sessions of the Mediator's claim listeners (``mediator-listener``) that are listening."""
    return sql.execute(
        "select count(*) from pg_stat_activity where datname = current_database()"
        " and application_name = 'mediator-listener' and query ilike 'LISTEN%%'"
    ).fetchone()[0]


# How many times :func:`deadlocks` looks for the database's other sessions to have ended, 0.1 s
# apart: a safety net of 60 s, far more than a session takes to end once its client has gone.
SESSIONS_GONE_LOOKS = 600


def deadlocks(url: str) -> int:
    """``pg_stat_database.deadlocks`` of the database ``url``, once no other session is connected
    to it (close the apps first). The count is kept by the session that detected the deadlock
    and reaches the shared statistics when that session flushes them (at a transaction's end, at
    most once a second, and always when it exits): read after every other session has ended, it
    is complete."""
    with connect(url) as sql:
        for _ in range(SESSIONS_GONE_LOOKS):
            others = sql.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()[0]
            if others == 0:
                break
            time.sleep(0.1)  # a server process ending has no event a client can await
        sql.execute("SELECT pg_stat_clear_snapshot()")
        row = sql.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        return int(row[0] or 0) if row is not None else 0


def queued_run(sql: Any, run_id: str) -> QueuedRun:
    row = sql.execute(
        "select run_id, created_at, requires_key, requires from runs where run_id = %s", (run_id,)
    ).fetchone()
    assert row is not None, run_id
    return QueuedRun(*row)


def states(sql: Any, run_ids: Sequence[str]) -> dict[str, str]:
    rows = sql.execute(
        "select run_id, state from runs where run_id = any(%s)", (list(run_ids),)
    ).fetchall()
    return dict(rows)


def lease_runs(sql: Any, run_id: str) -> list[str]:
    return [r[0] for r in sql.execute("select node_id from leases where run_id = %s", (run_id,))]


def queued_runs_that_fit_free_nodes(ctx: Any) -> list[str]:
    """The invariant of docs/reliability.md#the-invariant-checker: after the storm has quiesced, no
    QUEUED run whose requirements fit the free live nodes (the matcher itself decides "fits")."""
    with ctx.db.read() as s:
        adverts = live_adverts(s)
        unavailable = unavailable_node_ids(s)
        rows = s.execute(
            text("select run_id, requires from runs where state = 'QUEUED' order by created_at")
        ).all()
    left = []
    for run_id, requires in rows:
        roles = [role_from_wire(r) for r in requires]
        if not isinstance(match(roles, adverts, unavailable), Reject):
            left.append(run_id)
    return left


@contextmanager
def submit_held_after_its_read(
    app: Any, sql: Any, db_url: str, doc: dict[str, Any], *, others_waiting: int = 0
) -> Iterator[dict[str, Any]]:
    """Submit ``doc`` in a thread and hold it right after it has read the fleet and the
    unavailable set: an uncommitted row with the same run_id (on ``sql``) makes its insert of the
    run row wait. The body of the ``with`` runs while it waits; on leaving, that row is rolled
    back, the submit goes on, and the dict holds its response under ``resp``.
    ``others_waiting``: the Mediator's backends already waiting on a lock of the test's."""
    other = client_of(app)
    answer: dict[str, Any] = {}
    t = threading.Thread(
        target=lambda: answer.update(resp=other.post("/v1/runs", json=doc)), daemon=True
    )
    with connect(db_url) as watcher:
        with sql.transaction():
            sql.execute(
                "insert into runs (run_id, state, contract, requires, requires_key)"
                " values (%s, 'FAILED', '{}', '[]', 'blocker')",
                (doc["run_id"],),
            )
            t.start()
            await_condition(
                lambda: backends_waiting_on_locks(watcher) == others_waiting + 1,
                "the submit's insert waiting on the uncommitted run row",
            )
            answer["watcher"] = watcher
            yield answer
            raise psycopg.Rollback()
    t.join(JOIN_TIMEOUT)
    assert not t.is_alive()
