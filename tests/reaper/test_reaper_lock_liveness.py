"""The reaper's own lock lives like the scan gate's (docs/queue.md, "The reaper"): its session is
dropped by PostgreSQL when its process hangs, so a hung reaper keeps the other reapers from
passing for at most ``gate.idle_seconds`` plus a period; during a pass the session is never left
idle that long, even in a long row; and a pass that finds its lock gone finishes the row in hand
and ends.

Nothing here sleeps for an event: states are awaited on the database, and the only times are
PostgreSQL's own ``idle_session_timeout`` and the bounds asserted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.services.reaper import reap_pass
from app.store.gate import SCANNING_LOCK
from app.store.reaper import REAPER_LOCK
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import ROOT, TOKEN
from tests.support.clock import LEASE_EXPIRED, expire_leases
from tests.support.concurrency import (
    Background,
    apps_on,
    await_condition,
    backends_waiting_on_locks,
    connect,
    lock_holders,
    lock_waiters,
    states,
)
from tests.support.contracts import contract, role
from tests.support.rows import run_row, scalar
from tests.support.submitter import submit

IDLE = 3.0  # gate.idle_seconds: PostgreSQL drops an idle reaper-lock session after this
RENEW = 1  # lease.renew_seconds: the reaper's period
MARGIN = 60.0  # a safety net for a busy 2-core machine, never a wait for an event
# Adverts stay live for renew × factor: long enough for every test here.
KEYS = {"gate.idle_seconds": IDLE, "lease.renew_seconds": RENEW, "lease.not_after_factor": 300}

# The session advisory lock's own backend, by its key (the lock's pg_locks row).
_HOLDER = (
    "select pid from pg_locks where locktype = 'advisory' and granted"
    " and ((classid::bigint << 32) | objid::bigint) = %s"
    " and database = (select oid from pg_database where datname = current_database())"
)


@contextmanager
def reaper_process(url: str, records: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``mediator reaper`` on ``url``, configured by its environment as ops deploy it; stopped
    (SIGCONT, in case the test stopped it, then SIGTERM, and SIGKILL if that is not enough) when
    the block ends."""
    env = dict(os.environ)
    env.update(
        {
            "MEDIATOR_DATABASE_URL": url,
            "MEDIATOR_RECORDS_ROOT": str(records),
            "MEDIATOR_TOKEN": TOKEN,
            "MEDIATOR_LOG_LEVEL": "info",
            "MEDIATOR_GATE_IDLE_SECONDS": str(IDLE),
            "MEDIATOR_LEASE_RENEW_SECONDS": str(RENEW),
            "MEDIATOR_LEASE_NOT_AFTER_FACTOR": "300",
        }
    )
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.commands.main", "reaper"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        yield proc
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def _await(check: Any, what: str, timeout: float, *logs: Path) -> None:
    """:func:`await_condition`, with the reapers' own lines when it times out."""
    try:
        await_condition(check, what, timeout=timeout)
    except AssertionError as exc:
        said = "".join(
            f"\n--- {log.name}:\n{log.read_text(errors='replace')[-3000:]}"
            for log in logs
            if log.exists()
        )
        raise AssertionError(f"{exc}{said}") from None


def _passed(sql: Any) -> bool:
    """Whether a reaper has made a pass on this database."""
    return bool(scalar(sql, "select count(*) from reaper_state where last_pass_at is not null"))


def _stop_while_it_holds_the_reaper_lock(
    sql: Any, proc: subprocess.Popen[bytes], *logs: Path
) -> None:
    """SIGSTOP the only reaper while its pass holds the reaper's lock: the pass waits for the
    scanning lock the test holds (it pays an uncovered mark), which it does under a
    ``lock_timeout`` of ``gate.idle_seconds``. Should that time out between the look and the
    stop, the process is let go and caught at its next pass."""
    deadline = time.monotonic() + 4 * IDLE + MARGIN
    while True:
        _await(
            lambda: lock_holders(sql, REAPER_LOCK) == 1 and lock_waiters(sql, SCANNING_LOCK) == 1,
            "the reaper's pass waiting for the scanning lock",
            max(0.0, deadline - time.monotonic()),
            *logs,
        )
        os.kill(proc.pid, signal.SIGSTOP)
        if lock_holders(sql, REAPER_LOCK) == 1 and lock_waiters(sql, SCANNING_LOCK) == 1:
            return
        os.kill(proc.pid, signal.SIGCONT)
        assert time.monotonic() < deadline, "never caught the reaper inside its pass"


def test_a_reaper_hung_inside_its_pass_keeps_the_other_reaper_waiting_at_most_idle_seconds(
    fresh_db_url, tmp_path
):
    records = tmp_path / "records"
    logs = (tmp_path / "hung.log", tmp_path / "other.log")
    with (
        apps_on(fresh_db_url, records, 1, **KEYS) as apps,
        connect(fresh_db_url) as sql,
        connect(fresh_db_url) as scanner,
        reaper_process(fresh_db_url, records, logs[0]) as hung,
    ):
        # The first reaper alone, once its start-up (its wake included) is over and it passes.
        _await(lambda: _passed(sql), "the first reaper's first pass", MARGIN, *logs)
        # A scan of another process runs (the test holds the scanning lock), and a mark nobody
        # covers: the reaper's second pass from now pays it and waits for the scanning lock.
        scanner.execute("select pg_advisory_lock(%s)", (SCANNING_LOCK,))
        sql.execute("select nextval('wake_mark')")
        _stop_while_it_holds_the_reaper_lock(sql, hung, *logs)
        stopped = time.monotonic()
        # Its wait for the scanning lock ends by its lock_timeout; then the scan that ran ends.
        await_condition(
            lambda: lock_waiters(sql, SCANNING_LOCK) == 0, "the hung wait ends", timeout=MARGIN
        )
        scanner.execute("select pg_advisory_unlock(%s)", (SCANNING_LOCK,))

        # Work for a reaper, made while the first one is stopped: a run whose node stopped
        # renewing, and a run queued past its queue.timeout.
        c = apps.client(0)
        advertise(c, "n1", cap("board"))
        advertise(c, "x1", cap("scope"))
        submit(c, contract("lapsed"), 201)
        submit(c, contract("holder", role("probe", "scope")), 201)
        submit(c, contract("impatient", role("probe", "scope"), queue={"timeout": "1m"}), 202)
        expire_leases(sql, "lapsed")
        sql.execute(
            "update runs set created_at = now() - interval '2 min' where run_id = 'impatient'"
        )

        with reaper_process(fresh_db_url, records, logs[1]):
            # The hung reaper's idle session is dropped after gate.idle_seconds, its lock with
            # it; the other reaper's next pass reaps.
            bound = IDLE + 2 * RENEW + MARGIN
            _await(
                lambda: (
                    states(sql, ["lapsed", "impatient"])
                    == {"lapsed": "FAILED", "impatient": "FAILED"}
                ),
                "the other reaper's pass",
                max(0.0, stopped + bound - time.monotonic()),
                *logs,
            )
            assert run_row(sql, "lapsed")["reject"] == {"Code": 410, "Reason": LEASE_EXPIRED}
            assert [c["note"] for c in run_row(sql, "impatient")["verdict"]["checks"]] == [
                "queue timeout"
            ]
            # And it goes on passing: a mark taken by hand, covered by no scan, is paid.
            mark = scalar(sql, "select nextval('wake_mark')")
            _await(
                lambda: scalar(sql, "select last_value from wake_covered") >= mark,
                "the uncovered mark paid",
                2 * RENEW + IDLE + MARGIN,
                *logs,
            )
        assert hung.poll() is None  # still there, stopped: nothing of it ended by itself


def _lapsed_runs_and_a_timed_out_one(client: Any, sql: Any) -> None:
    """run-a RUNNING on n1 with its lease lapsed; run-c QUEUED for a board; run-d QUEUED for
    the scope x1 (held by run-x) and past its queue.timeout."""
    advertise(client, "n1", cap("board"))
    advertise(client, "x1", cap("scope"))
    submit(client, contract("run-a"), 201)
    submit(client, contract("run-x", role("probe", "scope")), 201)
    submit(client, contract("run-c"), 202)
    submit(client, contract("run-d", role("probe", "scope"), queue={"timeout": "1m"}), 202)
    expire_leases(sql, "run-a")
    sql.execute("update runs set created_at = now() - interval '2 min' where run_id = 'run-d'")


def test_a_pass_that_finds_its_lock_gone_finishes_the_row_in_hand_and_ends(fresh_db_url, tmp_path):
    with (
        apps_on(fresh_db_url, tmp_path / "records", 1, **KEYS) as apps,
        connect(fresh_db_url) as sql,
        connect(fresh_db_url) as blocker,
    ):
        ctx = apps.ctx(0)
        _lapsed_runs_and_a_timed_out_one(apps.client(0), sql)
        # The pass's row for run-a waits on the run's lock, held by the test.
        blocker.execute("begin")
        blocker.execute("select 1 from runs where run_id = 'run-a' for update")
        reaping = Background(lambda: reap_pass(ctx))
        await_condition(lambda: backends_waiting_on_locks(sql) == 1, "the pass's row waiting")
        # Meanwhile its session is dropped (an administrator, a network cut), its lock with it.
        [(pid,)] = sql.execute(_HOLDER, (REAPER_LOCK,)).fetchall()
        assert scalar(sql, "select pg_terminate_backend(%s, 30000)", pid) is True
        state_before = sql.execute("select * from reaper_state").fetchall()
        blocker.execute("rollback")

        report = reaping.result(timeout=MARGIN)

        assert report.lost and report.lease_expired == ["run-a"]  # the row in hand, finished
        assert report.queue_timeouts == []  # and nothing after it
        assert run_row(sql, "run-a")["reject"] == {"Code": 410, "Reason": LEASE_EXPIRED}
        assert states(sql, ["run-d"]) == {"run-d": "QUEUED"}
        assert sql.execute("select * from reaper_state").fetchall() == state_before
        # What the row freed is still woken for: n1 goes to the run waiting for a board.
        assert states(sql, ["run-c"]) == {"run-c": "RUNNING"}
        # The next pass, whoever makes it, does the rest.
        assert reap_pass(ctx).queue_timeouts == ["run-d"]


def test_a_row_longer_than_idle_seconds_leaves_the_reaper_lock_session_never_idle_that_long(
    fresh_db_url, tmp_path
):
    idle = 1.5
    keys = {**KEYS, "gate.idle_seconds": idle}
    with (
        apps_on(fresh_db_url, tmp_path / "records", 1, **keys) as apps,
        connect(fresh_db_url) as sql,
        connect(fresh_db_url) as blocker,
    ):
        ctx = apps.ctx(0)
        _lapsed_runs_and_a_timed_out_one(apps.client(0), sql)
        blocker.execute("begin")
        blocker.execute("select 1 from runs where run_id = 'run-a' for update")
        reaping = Background(lambda: reap_pass(ctx))
        await_condition(lambda: backends_waiting_on_locks(sql) == 1, "the pass's row waiting")
        blocked_at = scalar(sql, "select clock_timestamp()")

        def session_busy_until_three_idle_periods_passed() -> bool:
            # The reaper-lock session is there, and its last statement ended less than
            # idle_session_timeout ago: a look from the pass's thread, not the pass's row.
            row = sql.execute(
                "select extract(epoch from clock_timestamp() - a.state_change),"
                " extract(epoch from clock_timestamp() - %s)"
                " from pg_stat_activity a where a.pid = (" + _HOLDER + ")",
                (blocked_at, REAPER_LOCK),
            ).fetchone()
            assert row is not None, "the reaper's lock session was dropped"
            idle_for, blocked_for = row
            assert idle_for < idle, f"the session was idle for {idle_for} s"
            return blocked_for > 3 * idle

        await_condition(
            session_busy_until_three_idle_periods_passed,
            "a row three idle periods long",
            timeout=3 * idle + MARGIN,
            interval=0.05,
        )
        blocker.execute("rollback")

        report = reaping.result(timeout=MARGIN)

        assert report.lost is None
        assert report.lease_expired == ["run-a"] and report.queue_timeouts == ["run-d"]
