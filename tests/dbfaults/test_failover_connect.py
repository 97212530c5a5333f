"""Connecting as a lab with a standby does (docs/deploy.md#11-a-database-with-a-standby):
``database.url`` in libpq's multi-host form reaches the host that accepts, for the app's pool
and for ``mediator db upgrade``'s migrations alike; a server that stops taking writes (SQLSTATE
25006, as a primary demoted to a standby answers) is a dead connection: the request is 503
``database unavailable, try again`` with ``Retry-After: 1``, nothing is stored, the process's
sessions outside the pool (the claim listener's) are opened again, and once a server takes
writes again the next request is answered normally. On a server of the tests' own."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from flask import Flask
from psycopg.conninfo import conninfo_to_dict

from app.config import to_libpq_url
from app.migrate import database_problem, server_reached, upgrade
from app.services.reaper import reap_once, reap_pass
from tests.dbfaults.server import RestartablePostgres
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import app_on, client_of
from tests.support.concurrency import await_condition
from tests.support.contracts import one_step
from tests.support.processes import children_of, free_port


def two_hosts(url: str) -> str:
    """``url`` as a multi-host URL whose first host refuses connections."""
    parts = conninfo_to_dict(to_libpq_url(url))
    user = parts.get("user", "postgres")
    return (
        f"postgresql://{user}@127.0.0.1:{free_port()},{parts['host']}:{parts['port']}"
        f"/{parts['dbname']}"
    )


def admin(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(to_libpq_url(url), autocommit=True)


def test_a_multi_host_url_reaches_the_host_that_accepts(
    own_server: RestartablePostgres, tmp_path: Path
) -> None:
    fresh = own_server.new_database(migrated=False)
    url = two_hosts(fresh)
    # SQLAlchemy's own URL parser refuses "h1:p1,h2:p2"; the migrations connect as the app does.
    upgrade(url)
    assert database_problem(url) is None
    port = conninfo_to_dict(to_libpq_url(fresh))["port"]
    assert server_reached(url).startswith(f"server 127.0.0.1:{port}, the primary (PostgreSQL ")
    with app_on(url, tmp_path / "records") as app:
        client = client_of(app)
        advertise(client, "n1", cap("board"))
        resp = client.post("/v1/runs", json=one_step("run-a"))
        assert resp.status_code == 201, resp.get_json()
    with admin(fresh) as conn:
        state = conn.execute("select state from runs where run_id = 'run-a'").fetchone()
    assert state == ("RUNNING",)


@pytest.fixture
def app(clean_db: str, tmp_path: Path) -> Iterator[Flask]:
    with app_on(clean_db, tmp_path / "records", **{"database.pool_size": 1}) as application:
        yield application


def _backends(url: str, name: str) -> list[int]:
    with admin(url) as conn:
        rows = conn.execute(
            "select pid from pg_stat_activity where datname = current_database()"
            " and application_name = %s",
            (name,),
        ).fetchall()
    return [r[0] for r in rows]


def _read_only(url: str, on: bool) -> None:
    """The test's own database takes no writes in new sessions (``on``), as a standby."""
    with admin(url) as conn:
        conn.execute("set default_transaction_read_only = off")  # this session writes
        dbname = conn.execute("select current_database()").fetchone()[0]
        setting = "on" if on else "off"
        conn.execute(f'alter database "{dbname}" set default_transaction_read_only = {setting}')
        if on:
            # The pool's session began before: end it, so the next one begins read-only.
            conn.execute(
                "select pg_terminate_backend(pid) from pg_stat_activity"
                " where datname = current_database() and application_name = 'mediator'"
            )


def test_a_server_that_takes_no_writes_is_a_dead_connection_answered_503_with_retry_after(
    app: Flask, clean_db: str
) -> None:
    client = client_of(app)
    advertise(client, "n1", cap("board"))
    ctx = app.extensions["mediator"]
    # The claim listener's session, opened by a first claim.
    assert client.post("/v1/nodes/n1/claim?wait=0").status_code == 204
    await_condition(
        lambda: len(_backends(clean_db, "mediator-listener")) == 1, "the listener's session", 30
    )
    listener = _backends(clean_db, "mediator-listener")
    deaths = ctx.db.deaths

    _read_only(clean_db, True)
    try:
        resp = client.post("/v1/runs", json=one_step("run-a"))
        assert resp.status_code == 503, resp.get_json()
        assert resp.get_json() == {
            "error": {"code": 503, "reason": "database unavailable, try again"}
        }
        assert resp.headers["Retry-After"] == "1"
        assert ctx.db.deaths == deaths + 1
        assert ctx.owed.is_set()  # a mark and a scan, paid at the next request that succeeds
    finally:
        _read_only(clean_db, False)
    with admin(clean_db) as conn:
        assert conn.execute("select count(*) from runs").fetchone() == (0,)

    # The listener's session was opened again (on whatever server is the primary now).
    await_condition(
        lambda: bool(now := _backends(clean_db, "mediator-listener")) and now != listener,
        "the listener's session opened again",
        30,
        interval=0.05,
    )
    # The pool was invalidated: the next request connects again and is answered.
    resp = client.post("/v1/runs", json=one_step("run-b"))
    assert resp.status_code == 201, resp.get_json()
    assert not ctx.owed.is_set()


def test_a_server_that_stops_answering_is_given_up_at_the_clients_deadline(
    own_server: RestartablePostgres, clean_db: str, tmp_path: Path
) -> None:
    """Its processes stopped (SIGSTOP), the server enforces no timeout and its kernel still
    acknowledges: the request ends at the client's own deadline (the statement timeout, 1 s
    here, plus 5 s) with 503, not never; once the server answers again, so does the next."""
    keys = {"database.pool_size": 1, "database.statement_timeout_seconds": 1}
    with app_on(clean_db, tmp_path / "records", **keys) as app:
        client = client_of(app)
        advertise(client, "n1", cap("board"))  # the pool's one session is open
        assert own_server.pg._proc is not None
        # The postmaster and its children: each backend is a session of its own, so a signal
        # to the postmaster's group would miss them.
        postmaster = own_server.pg._proc.pid
        server = [postmaster, *children_of(postmaster)]
        for pid in server:
            os.kill(pid, signal.SIGSTOP)
        try:
            resp = client.post("/v1/runs", json=one_step("run-a"))
        finally:
            for pid in server:
                os.kill(pid, signal.SIGCONT)
        assert resp.status_code == 503, resp.get_json()
        assert resp.headers["Retry-After"] == "1"
        resp = client.post("/v1/runs", json=one_step("run-b"))
        assert resp.status_code == 201, resp.get_json()


def test_a_reaper_pass_after_one_that_could_not_use_the_database_gives_every_lease_a_window(
    app: Flask, clean_db: str
) -> None:
    """A switch shorter than a lease window still cost renewals (adverts failed meanwhile): the
    pass after one that failed on a dead connection gives every lease a full window first, as
    after an outage, though the server did not restart; the next pass does not again."""
    client = client_of(app)
    ctx = app.extensions["mediator"]
    advertise(client, "n1", cap("board"))
    assert client.post("/v1/runs", json=one_step("run-a")).status_code == 201

    _read_only(clean_db, True)  # as a demoted primary answers: every write is refused
    try:
        assert reap_once(ctx, previous_failed=False) is True  # the pass failed
    finally:
        _read_only(clean_db, False)
    with admin(clean_db) as conn:
        # The node could not renew meanwhile: its lease ran out.
        conn.execute("update leases set not_after = now() - interval '1 second'")

    report = reap_pass(ctx, previous_failed=True)

    assert report.extended == 1 and report.lease_expired == [], report
    with admin(clean_db) as conn:
        (state,) = conn.execute("select state from runs where run_id = 'run-a'").fetchone()
        (left,) = conn.execute("select not_after > now() from leases").fetchone()
    assert state == "RUNNING" and left
    assert reap_pass(ctx).extended == 0
