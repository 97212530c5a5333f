"""Several reapers at once (docs/queue.md#the-reaper): a pass that finds another reaper's pass
running skips whole, and two passes racing leave every run handled exactly once."""

from __future__ import annotations

from app.services.reaper import reap_pass
from app.store.reaper import REAPER_LOCK
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.clock import expire_leases
from tests.support.concurrency import apps_on, connect, race
from tests.support.contracts import contract, role
from tests.support.rows import count_events, leases, run_row
from tests.support.scenes import running_on_n1_and_one_queued
from tests.support.submitter import submit


def test_a_pass_skips_whole_while_another_reaper_holds_the_reaper_lock(client, ctx, sql, db_url):
    running_on_n1_and_one_queued(client)
    expire_leases(sql, "run-a")

    with connect(db_url) as other_reaper:
        assert other_reaper.execute("select pg_try_advisory_lock(%s)", (REAPER_LOCK,)).fetchone()[0]
        report = reap_pass(ctx)

    assert report.skipped and not report.lease_expired and not report.woke
    assert run_row(sql, "run-a")["state"] == "RUNNING"
    assert run_row(sql, "run-b")["state"] == "QUEUED"
    assert leases(sql) == [("n1", "run-a")]


def test_two_reapers_racing_fail_an_expired_run_once_and_promote_the_queued_run_once(
    fresh_db_url, tmp_path
):
    with apps_on(fresh_db_url, tmp_path / "records", n=2) as apps:
        client = apps.client(0)
        for n in ("n1", "n2"):
            advertise(client, n, cap("board"))
        for run_id in ("run-a", "run-b"):
            submit(client, contract(run_id, role("dut")), 201)
        for run_id in ("run-c", "run-d"):
            submit(client, contract(run_id, role("dut")), 202)
        with connect(fresh_db_url) as sql:
            expire_leases(sql, "run-a")
            expire_leases(sql, "run-b")

            reports = race(lambda: reap_pass(apps.ctx(0)), lambda: reap_pass(apps.ctx(1)))

            failed = sorted(r for rep in reports for r in rep.lease_expired)
            assert failed == ["run-a", "run-b"]
            for run_id in ("run-a", "run-b"):
                assert run_row(sql, run_id)["state"] == "FAILED"
                assert count_events(sql, run_id, "lease expired") == 1
            for run_id in ("run-c", "run-d"):
                assert run_row(sql, run_id)["state"] == "RUNNING"
            assert sorted(run for _, run in leases(sql)) == ["run-c", "run-d"]
