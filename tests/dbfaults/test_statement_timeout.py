"""A statement timeout inside a wake scan (docs/design.md#the-scan-gate-and-wake-marks: the scan
runs under a statement_timeout; a wake that fails after its freeing commit sets the wake-debt
marker, and the reaper's next pass scans and clears it). The lock the scan needs is held from a
second connection, as a long operator transaction or a stuck process would hold it; the scan's
statements run under a tiny ``database.statement_timeout_seconds``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from flask import Flask

from app.config import to_libpq_url
from app.services.queue import wake_after_commit
from app.services.reaper import reap_pass
from tests.support.actors import cap
from tests.support.agent import advertise, run_step
from tests.support.apps import app_on, client_of
from tests.support.concurrency import waiting_lock_held
from tests.support.contracts import one_step
from tests.support.rows import run_row
from tests.support.submitter import submit

STATEMENT_TIMEOUT = 0.3
# The freeing request waits at most for the scan's statements to time out (each under the
# timeout), plus what a busy 2-core machine adds.
ANSWER_BOUND = 5.0


@pytest.fixture
def db_url(clean_db: str) -> str:
    return clean_db


@pytest.fixture
def app(db_url: str, tmp_path: Path) -> Iterator[Flask]:
    with app_on(
        db_url, tmp_path / "records", **{"database.statement_timeout_seconds": STATEMENT_TIMEOUT}
    ) as application:
        yield application


@pytest.fixture
def client(app: Flask) -> Any:
    return client_of(app)


@pytest.fixture
def sql(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as conn:
        yield conn


@pytest.fixture
def holder(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A second connection, in a transaction, that holds the locks a test takes until it ends."""
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        yield conn
        conn.rollback()


def wake_debt(sql: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in sql.execute("select reason from wake_debt").fetchall()]


def test_a_promotion_that_times_out_on_a_locked_run_leaves_a_debt_the_reaper_pays(
    app: Flask, client: Any, sql: psycopg.Connection[Any], holder: psycopg.Connection[Any]
) -> None:
    advertise(client, "n1", cap("board"))
    submit(client, one_step("run-a"), 201)
    submit(client, one_step("run-b"), 202)
    # Another transaction holds run-b's row: the promotion's guarded UPDATE waits on it.
    holder.execute("select 1 from runs where run_id = 'run-b' for update")

    started = time.monotonic()
    run_step(client, "n1", "run-a", 1)  # frees n1; its wake tries run-b and times out
    took = time.monotonic() - started

    assert took < ANSWER_BOUND, took
    assert run_row(sql, "run-a")["state"] == "SUCCEEDED"
    assert run_row(sql, "run-b")["state"] == "QUEUED"
    assert len(wake_debt(sql)) == 1, "a scan with a failed promotion must leave a wake debt"

    holder.rollback()  # the lock goes; no request frees anything after it
    report = reap_pass(app.extensions["mediator"])

    assert report.woke
    assert run_row(sql, "run-b")["state"] == "RUNNING"
    assert wake_debt(sql) == []


def test_a_scan_whose_read_times_out_leaves_a_debt_the_reaper_pays(
    app: Flask, client: Any, sql: psycopg.Connection[Any], holder: psycopg.Connection[Any]
) -> None:
    advertise(client, "n1", cap("board"))
    submit(client, one_step("run-a"), 201)
    submit(client, one_step("run-b"), 202)
    with waiting_lock_held(sql):  # run-a ends and frees n1, but no wake scans
        run_step(client, "n1", "run-a", 1)
    assert run_row(sql, "run-b")["state"] == "QUEUED"
    # The scan reads the leases to know which nodes are busy: that read waits, then times out.
    holder.execute("lock table leases in access exclusive mode")

    started = time.monotonic()
    assert wake_after_commit(app.extensions["mediator"], "test: leases locked") is None
    took = time.monotonic() - started

    assert took < ANSWER_BOUND, took
    assert run_row(sql, "run-b")["state"] == "QUEUED"
    assert wake_debt(sql) == ["test: leases locked: OperationalError"]

    holder.rollback()
    report = reap_pass(app.extensions["mediator"])

    assert report.woke
    assert run_row(sql, "run-b")["state"] == "RUNNING"
    assert wake_debt(sql) == []


def test_a_debt_set_while_the_lock_is_still_held_stays_until_a_pass_succeeds(
    app: Flask, client: Any, sql: psycopg.Connection[Any], holder: psycopg.Connection[Any]
) -> None:
    """The reaper's own scan times out too while the lock is held: the debt stays, and the next
    pass after the lock is gone pays it."""
    advertise(client, "n1", cap("board"))
    submit(client, one_step("run-a"), 201)
    submit(client, one_step("run-b"), 202)
    holder.execute("select 1 from runs where run_id = 'run-b' for update")
    run_step(client, "n1", "run-a", 1)
    assert len(wake_debt(sql)) == 1

    reap_pass(app.extensions["mediator"])  # the lock is still held: its scan fails as well

    assert run_row(sql, "run-b")["state"] == "QUEUED"
    assert len(wake_debt(sql)) == 1

    holder.rollback()
    reap_pass(app.extensions["mediator"])

    assert run_row(sql, "run-b")["state"] == "RUNNING"
    assert wake_debt(sql) == []
