"""The scan gate (docs/design.md#the-scan-gate-and-wake-marks): a requester skips its scan only
while another scan is *waiting* (it will start after the requester's commit); a scan that is
*running* is waited for, never skipped; and no freeing commit is left without a scan that starts
after it — so after a storm of frees no queued run is left next to a free node that fits it, with no
reaper involved."""

from __future__ import annotations

import threading

from app.services.queue import wake_queued
from app.store.gate import SCANNING_LOCK, WAITING_LOCK
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.concurrency import (
    JOIN_TIMEOUT,
    apps_on,
    await_condition,
    connect,
    lock_holders,
    lock_waiters,
    queued_runs_that_fit_free_nodes,
    race,
    scanning_lock_held,
    states,
    waiting_lock_held,
)
from tests.support.contracts import contract, role
from tests.support.scenes import holder_and_waiter
from tests.support.submitter import submit


def test_a_wake_skips_its_scan_while_another_scan_is_waiting_and_scans_once_none_waits(
    fresh_db_url, tmp_path
):
    with apps_on(fresh_db_url, tmp_path / "records", 1) as apps, connect(fresh_db_url) as sql:
        c = apps.client(0)
        holder_and_waiter(c)
        with waiting_lock_held(sql):
            assert c.post("/v1/runs/holder/cancel").get_json()["state"] == "FAILED"
            report = wake_queued(apps.ctx(0), "test")
            assert report.skipped is True and report.promoted == []
            assert states(sql, ["waiter"]) == {"waiter": "QUEUED"}
        report = wake_queued(apps.ctx(0), "test")
        assert report.skipped is False and report.promoted == ["waiter"]
        assert sql.execute("select node_id, run_id from leases").fetchall() == [("n1", "waiter")]


def test_a_wake_waits_behind_a_running_scan_and_its_scan_sees_the_node_freed_before_it(
    fresh_db_url, tmp_path
):
    with apps_on(fresh_db_url, tmp_path / "records", 2) as apps, connect(fresh_db_url) as sql:
        c = apps.client(0)
        holder_and_waiter(c)
        answer: dict[str, object] = {}
        with scanning_lock_held(sql):
            # A scan of "another process" is running. The cancel commits, then its wake takes the
            # waiting lock and waits for the scanning lock: it must not skip.
            t = threading.Thread(
                target=lambda: answer.update(resp=c.post("/v1/runs/holder/cancel")), daemon=True
            )
            t.start()
            await_condition(
                lambda: (
                    lock_waiters(sql, SCANNING_LOCK) == 1 and lock_holders(sql, WAITING_LOCK) == 1
                ),
                "the cancel's wake waiting for the scanning lock",
            )
            assert states(sql, ["holder", "waiter"]) == {"holder": "FAILED", "waiter": "QUEUED"}
            # A scan is waiting now: other requesters, in this process and in another, skip.
            assert wake_queued(apps.ctx(1), "other process").skipped is True
            assert wake_queued(apps.ctx(0), "same process").skipped is True
        t.join(JOIN_TIMEOUT)
        assert not t.is_alive()
        assert answer["resp"].status_code == 200
        assert answer["resp"].get_json() == {"run_id": "holder", "state": "FAILED"}
        assert states(sql, ["waiter"]) == {"waiter": "RUNNING"}
        assert sql.execute("select node_id, run_id from leases").fetchall() == [("n1", "waiter")]
        assert lock_holders(sql, WAITING_LOCK) == 0 and lock_holders(sql, SCANNING_LOCK) == 0


NODES = 8
ROUNDS = 3


def test_concurrent_cancels_in_several_processes_leave_no_queued_run_next_to_a_free_node(
    fresh_db_url, tmp_path
):
    with apps_on(fresh_db_url, tmp_path / "records", 4) as apps, connect(fresh_db_url) as sql:
        admin = apps.client(0)
        for i in range(NODES):
            advertise(admin, f"n{i}", cap("board", slot=f"s{i}"))
        for rnd in range(ROUNDS):
            holders = [f"h{rnd}-{i}" for i in range(NODES)]
            with waiting_lock_held(sql):
                for i, h in enumerate(holders):
                    submit(admin, contract(h, role("dut", slot=f"s{i}")), 201)
                # Behind them, in arrival order: runs for any board and runs for one slot each,
                # more than there are nodes, so some must stay QUEUED at the end.
                for i in range(NODES):
                    submit(admin, contract(f"any{rnd}-{i}"), 202)
                    if i % 2:
                        submit(admin, contract(f"slot{rnd}-{i}", role("dut", slot=f"s{i}")), 202)
            clients = [apps.client(k % 4) for k in range(NODES)]
            resps = race(
                *(
                    (lambda c=c, h=h: c.post(f"/v1/runs/{h}/cancel"))
                    for c, h in zip(clients, holders, strict=True)
                )
            )
            assert [r.status_code for r in resps] == [200] * NODES
            assert queued_runs_that_fit_free_nodes(apps.ctx(0)) == []
            # Every node is held again, each by one RUNNING run.
            rows = sql.execute(
                "select l.node_id, r.state from leases l join runs r using (run_id) order by 1"
            ).fetchall()
            assert rows == [(f"n{i}", "RUNNING") for i in range(NODES)]
            assert sql.execute("select count(*) from runs where state = 'RUNNING'").fetchone() == (
                NODES,
            )
            with waiting_lock_held(sql):
                # Clean up for the next round without promoting anything.
                alive = sql.execute(
                    "select run_id from runs where state in ('QUEUED', 'RUNNING')"
                ).fetchall()
                for (run_id,) in alive:
                    assert admin.post(f"/v1/runs/{run_id}/cancel").status_code == 200
            assert sql.execute("select count(*) from leases").fetchone() == (0,)
