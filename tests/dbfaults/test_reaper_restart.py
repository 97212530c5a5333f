"""The reaper sees its database restarted (docs/queue.md, "Crashes and restarts"), on a server the
test started itself: a restart changes ``pg_postmaster_start_time()``, and crash recovery keeps
it but empties the reaper's UNLOGGED marker table. Either may have swallowed a wake mark: here a
node freed by a commit whose mark never came (written straight in SQL) just before the outage,
with runs queued for it. No wake point follows and no mark is uncovered, so only the reaper's
restart check can promote the run that fits: its next pass must."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from flask import Flask

from app.config import to_libpq_url
from app.services.reaper import reap_pass
from tests.dbfaults.server import RestartablePostgres
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import app_on, client_of
from tests.support.concurrency import await_condition, connect, states
from tests.support.contracts import one_step
from tests.support.rows import leases, scalar
from tests.support.submitter import submit
from tests.support.tables import empty_tables

WAITERS = ["waiter-1", "waiter-2", "waiter-3"]
RECOVERY_SECONDS = 60.0  # a safety net for crash recovery on a busy machine


@pytest.fixture
def db_url(own_server: RestartablePostgres, module_db: str) -> str:
    """The module's database on a running server, emptied."""
    if not own_server.is_up:  # an earlier test failed while the server was down
        own_server.up()
    with psycopg.connect(to_libpq_url(module_db), autocommit=True) as conn:
        empty_tables(conn)
    return module_db


@pytest.fixture
def app(db_url: str, tmp_path: Path) -> Iterator[Flask]:
    with app_on(db_url, tmp_path / "records") as application:
        yield application


def _backlog_behind_a_node_freed_without_a_mark(app: Flask, db_url: str) -> None:
    """x1 (a scope) held by ``holder``, three runs queued for it, the reaper's first pass made
    (it stores what it compares with); then the holder's lease goes by a commit that takes no
    wake mark: the mark the outage swallows."""
    client = client_of(app)
    advertise(client, "x1", cap("scope"))
    submit(client, one_step("holder", "probe", "scope"), 201)
    for run_id in WAITERS:
        submit(client, one_step(run_id, "probe", "scope"), 202)
    reap_pass(app.extensions["mediator"])
    with connect(db_url) as sql:
        sql.execute("delete from leases where run_id = 'holder'")


def _assert_the_oldest_waiter_was_promoted(db_url: str) -> None:
    with connect(db_url) as sql:
        assert leases(sql) == [("x1", "waiter-1")]
        assert states(sql, WAITERS) == {
            "waiter-1": "RUNNING",
            "waiter-2": "QUEUED",
            "waiter-3": "QUEUED",
        }


def test_after_a_restart_the_reapers_next_pass_promotes_the_run_that_fits(
    own_server: RestartablePostgres, app: Flask, db_url: str
):
    _backlog_behind_a_node_freed_without_a_mark(app, db_url)
    own_server.down()
    own_server.up()

    report = reap_pass(app.extensions["mediator"])

    _assert_the_oldest_waiter_was_promoted(db_url)
    assert report.restarted is True and report.woke is True


def _accepts_connections(db_url: str) -> bool:
    try:
        with psycopg.connect(to_libpq_url(db_url), connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False


def test_after_crash_recovery_with_the_same_start_time_the_next_pass_promotes_the_run_that_fits(
    own_server: RestartablePostgres, app: Flask, db_url: str
):
    _backlog_behind_a_node_freed_without_a_mark(app, db_url)
    with connect(db_url) as sql:
        started = scalar(sql, "select pg_postmaster_start_time()")
    # A backend killed: the postmaster ends every session and runs crash recovery, which
    # empties UNLOGGED tables; the postmaster itself goes on.
    victim = psycopg.connect(to_libpq_url(db_url), autocommit=True)
    os.kill(victim.info.backend_pid, signal.SIGKILL)
    victim.close()
    await_condition(
        lambda: _accepts_connections(db_url),
        "the server out of crash recovery",
        timeout=RECOVERY_SECONDS,
        interval=0.1,
    )
    with connect(db_url) as sql:
        assert scalar(sql, "select pg_postmaster_start_time()") == started  # the premise

    report = reap_pass(app.extensions["mediator"])

    _assert_the_oldest_waiter_was_promoted(db_url)
    assert report.restarted is True and report.woke is True
