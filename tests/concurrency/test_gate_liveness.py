"""A waiter that never scans (docs/design.md#the-scan-gate-and-wake-marks): a session that holds the
gate's waiting lock and never scans (its host lost power, its worker was killed, its process hangs)
makes every other wake skip; a freed node's queued run is then promoted by the reaper within two
reaper periods plus ``gate.idle_seconds``, on one app server or across two of one database.

The periods are counted, not timed: each reaper pass is called by the test, so "within two
periods" is "by the second pass after the skip". Only the hung process's session is timed, by
PostgreSQL's own ``idle_session_timeout``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import func
from sqlalchemy.exc import DBAPIError

from app.services.queue import wake_queued
from app.services.reaper import reap_pass
from app.store.gate import SCANNING_LOCK
from tests.support.apps import ROOT
from tests.support.concurrency import (
    Background,
    apps_on,
    await_condition,
    connect,
    lock_holders,
    session_pids,
    states,
    waiting_lock_held,
)
from tests.support.contracts import one_step
from tests.support.scenes import holder_and_waiter

IDLE = 2.0  # gate.idle_seconds: how long PostgreSQL keeps a hung process's idle gate session
RENEW = 1  # lease.renew_seconds: the reaper's period
# Adverts stay live for renew × factor: long enough for every test here.
KEYS = {"gate.idle_seconds": IDLE, "lease.renew_seconds": RENEW, "lease.not_after_factor": 300}


@pytest.mark.parametrize("servers", [1, 2], ids=["one server", "two servers"])
def test_a_run_freed_while_a_waiter_never_scans_is_promoted_by_the_second_reaper_pass(
    fresh_db_url, tmp_path, servers
):
    with (
        apps_on(fresh_db_url, tmp_path / "records", servers, **KEYS) as apps,
        connect(fresh_db_url) as sql,
    ):
        c = apps.client(0)
        reaper = apps.ctx(servers - 1)  # on the other server when there are two
        holder_and_waiter(c)
        # The first pass of the reaper, before anything happened: it has nothing to pay.
        assert reap_pass(reaper).woke is False
        with waiting_lock_held(sql):
            # A waiter that never scans: the cancel's wake skips, in good faith.
            assert c.post("/v1/runs/holder/cancel").get_json()["state"] == "FAILED"
            assert states(sql, ["waiter"]) == {"waiter": "QUEUED"}
            assert wake_queued(apps.ctx(0), "another request").skipped is True
            first = reap_pass(reaper)  # reads the mark the skip left
            assert first.woke is False
            assert states(sql, ["waiter"]) == {"waiter": "QUEUED"}
            second = reap_pass(reaper)  # the previous pass's mark is still uncovered: pays it
            assert second.uncovered is True and second.woke is True
            assert states(sql, ["waiter"]) == {"waiter": "RUNNING"}
            assert sql.execute("select node_id, run_id from leases").fetchall() == [
                ("n1", "waiter")
            ]
        # Covered now: the next passes scan no more (the reaper never polls the queue).
        assert reap_pass(reaper).woke is False
        assert reap_pass(reaper).woke is False


HOLD_SCANNING_LOCK = """
import sys
from app import create_app
from tests.support.apps import make_config
app = create_app(make_config(sys.argv[1], sys.argv[2], **{"gate.idle_seconds": float(sys.argv[3])}))
assert app.extensions["mediator"].gate.enter()
print("scanning", flush=True)
sys.stdin.read()
"""


def _hung_scanner(url, records):
    """A process that took the scanning lock through its own gate and then hangs (SIGSTOP)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_SCANNING_LOCK, url, str(records), str(IDLE)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "scanning"
    os.kill(proc.pid, signal.SIGSTOP)
    return proc


def _end(proc):
    os.kill(proc.pid, signal.SIGCONT)
    proc.kill()
    proc.wait(30)


@pytest.mark.parametrize("servers", [1, 2], ids=["one server", "two servers"])
def test_a_hung_scanner_loses_the_gate_after_idle_seconds_and_the_freed_run_is_promoted(
    fresh_db_url, tmp_path, servers
):
    with (
        apps_on(fresh_db_url, tmp_path / "records", servers, **KEYS) as apps,
        connect(fresh_db_url) as sql,
    ):
        c = apps.client(0)
        holder_and_waiter(c)
        proc = _hung_scanner(fresh_db_url, tmp_path / "records")
        try:
            assert lock_holders(sql, SCANNING_LOCK) == 1
            started = time.monotonic()
            # The cancel's wake waits behind the hung scan: PostgreSQL ends that idle session
            # after gate.idle_seconds, its lock goes with it, and the waiting wake scans.
            cancel = Background(lambda: c.post("/v1/runs/holder/cancel"))
            resp = cancel.result(timeout=60.0)
            elapsed = time.monotonic() - started
            assert resp.status_code == 200 and resp.get_json()["state"] == "FAILED"
            assert states(sql, ["waiter"]) == {"waiter": "RUNNING"}
            # The bound of docs/queue.md#guarantees-their-bounds-and-the-tests-that-prove-them, from
            # the configuration: two reaper periods plus idle_seconds.
            assert elapsed <= 2 * RENEW + IDLE + 30.0, elapsed  # + a safety net for a busy host
            await_condition(lambda: lock_holders(sql, SCANNING_LOCK) == 0, "the gate released")
            # Paid: the reaper on either server finds nothing owed.
            reaper = apps.ctx(servers - 1)
            assert reap_pass(reaper).woke is False
            assert reap_pass(reaper).woke is False
        finally:
            _end(proc)


def test_the_reaper_takes_the_scanning_lock_from_a_hung_scanner_within_idle_seconds(
    fresh_db_url, tmp_path
):
    with (
        apps_on(fresh_db_url, tmp_path / "records", 2, **KEYS) as apps,
        connect(fresh_db_url) as sql,
    ):
        c = apps.client(0)
        holder_and_waiter(c)
        reaper = apps.ctx(1)
        assert reap_pass(reaper).woke is False
        proc = _hung_scanner(fresh_db_url, tmp_path / "records")
        try:
            with waiting_lock_held(sql):
                # Both locks are held by sessions that never scan: the cancel's wake skips.
                assert c.post("/v1/runs/holder/cancel").get_json()["state"] == "FAILED"
                assert reap_pass(reaper).woke is False  # reads the mark
                # Pays it: takes the scanning lock directly under lock_timeout = idle_seconds,
                # which outlasts the hung session's idle_session_timeout.
                second = reap_pass(reaper)
                assert second.woke is True
                assert states(sql, ["waiter"]) == {"waiter": "RUNNING"}
        finally:
            _end(proc)


def test_a_failed_gate_statement_on_a_live_session_keeps_the_scanning_lock_of_a_running_scan(
    fresh_db_url, tmp_path
):
    with (
        apps_on(fresh_db_url, tmp_path / "records", 1, **KEYS) as apps,
        connect(fresh_db_url) as sql,
    ):
        gate = apps.ctx(0).gate
        assert gate.enter()  # a scan of this process is running
        try:
            # Another thread's statement on the shared session fails, the session lives on
            # (here: a key the database refuses).
            with pytest.raises(DBAPIError):
                gate._call(func.pg_try_advisory_lock, "not a key")
            assert lock_holders(sql, SCANNING_LOCK) == 1
            gate.check(now=True)  # the running scan still holds its turn
        finally:
            gate.leave()
        assert lock_holders(sql, SCANNING_LOCK) == 0


def test_the_gate_session_ended_by_its_idle_timeout_is_no_dead_database(fresh_db_url, tmp_path):
    """The gate's session outlives a quiet spell only until ``idle_session_timeout`` ends it
    (SQLSTATE 57P05): its expected end, not a server that went away. The next scan opens another
    and promotes, and nothing counts it as a dead connection: the claim listener keeps its session
    and the pool is not emptied (docs/deploy.md#11-a-database-with-a-standby)."""
    with (
        apps_on(fresh_db_url, tmp_path / "records", 1, **KEYS) as apps,
        connect(fresh_db_url) as sql,
    ):
        c, ctx = apps.client(0), apps.ctx(0)
        holder_and_waiter(c)
        assert c.post("/v1/nodes/n1/claim?wait=0").status_code == 200  # the holder's step
        await_condition(
            lambda: len(session_pids(sql, "mediator-listener")) == 1, "the listener", 30
        )
        listener = session_pids(sql, "mediator-listener")
        # A scan through the gate opens its session: the holder's cancel promotes the waiter.
        assert c.post("/v1/runs/holder/cancel").get_json()["state"] == "FAILED"
        assert states(sql, ["waiter"]) == {"waiter": "RUNNING"}
        assert len(session_pids(sql, "mediator-gate")) == 1
        assert c.post("/v1/runs", json=one_step("third")).status_code == 202
        deaths = ctx.db.deaths
        # PostgreSQL ends the idle session by itself after gate.idle_seconds.
        await_condition(
            lambda: not session_pids(sql, "mediator-gate"), "the idle gate session ended", 30
        )
        # The next scan meets the ended session, opens another and promotes.
        assert c.post("/v1/runs/waiter/cancel").get_json()["state"] == "FAILED"
        assert states(sql, ["third"]) == {"third": "RUNNING"}
        assert ctx.db.deaths == deaths
        assert session_pids(sql, "mediator-listener") == listener
