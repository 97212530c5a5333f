"""The reaper sees the database restarted or switched (docs/queue.md, "Crashes and restarts"): the
server's start time differs from the one its previous pass stored, or the row it writes in an
UNLOGGED table is gone (crash recovery empties it and keeps the start time). The pass then scans
the queue once, which pays a wake mark the outage swallowed, and gives every lease the outage
grace. A restart is simulated here by changing what the previous pass stored;
tests/dbfaults/test_reaper_restart.py restarts a real server."""

from __future__ import annotations

from app.services.reaper import reap_pass
from tests.support.rows import leases, run_row, scalar
from tests.support.scenes import running_on_n1_and_one_queued


def _freed_without_a_mark(sql) -> None:
    """n1's lease goes without a wake mark (the mark the outage swallowed)."""
    sql.execute("delete from leases where run_id = 'run-a'")


def test_the_first_pass_stores_the_server_start_time_and_is_no_restart(client, ctx, sql):
    running_on_n1_and_one_queued(client)
    _freed_without_a_mark(sql)

    report = reap_pass(ctx)

    assert scalar(sql, "select server_started_at = pg_postmaster_start_time() from reaper_state")
    assert scalar(sql, "select count(*) from reaper_marker") == 1
    assert report.restarted is False and report.woke is False and report.extended == 0
    assert run_row(sql, "run-b")["state"] == "QUEUED"


def test_another_server_start_time_is_a_restart_and_the_pass_scans_the_queue(client, ctx, sql):
    running_on_n1_and_one_queued(client)
    reap_pass(ctx)  # the first: it stores the start time and writes its marker row
    _freed_without_a_mark(sql)
    # The previous pass ran on a server that started at another time.
    sql.execute("update reaper_state set server_started_at = server_started_at - interval '1 h'")

    report = reap_pass(ctx)

    assert leases(sql) == [("n1", "run-b")]
    assert report.restarted is True and report.woke is True
    assert scalar(sql, "select count(*) from wake_debt") == 0  # the scan paid what it owed
    assert scalar(sql, "select server_started_at = pg_postmaster_start_time() from reaper_state")
    assert reap_pass(ctx).restarted is False  # once


def test_a_marker_row_gone_with_the_same_start_time_is_a_restart(client, ctx, sql):
    running_on_n1_and_one_queued(client)
    reap_pass(ctx)  # the first: it stores the start time and writes its marker row
    _freed_without_a_mark(sql)
    sql.execute("delete from reaper_marker")  # what crash recovery does to an UNLOGGED table

    report = reap_pass(ctx)

    assert leases(sql) == [("n1", "run-b")]
    assert report.restarted is True and report.woke is True
    assert scalar(sql, "select count(*) from reaper_marker") == 1
    assert reap_pass(ctx).restarted is False  # once


def test_a_restart_gives_every_lease_a_full_window_before_anything_is_reaped(client, ctx, sql):
    running_on_n1_and_one_queued(client)
    reap_pass(ctx)  # the first: it stores the start time and writes its marker row
    # n1 could not renew while the database was down: its lease lapsed meanwhile, though the
    # previous pass is recent (a restart shorter than a lease window).
    sql.execute("update leases set not_after = now() - interval '1 s'")
    sql.execute("update reaper_state set server_started_at = server_started_at - interval '1 h'")

    report = reap_pass(ctx)

    assert run_row(sql, "run-a")["state"] == "RUNNING"
    assert report.restarted is True and report.extended == 1 and report.lease_expired == []
    # One lease window from the database's now(), give or take the time since the pass.
    ends_in = float(
        scalar(
            sql, "select extract(epoch from not_after - now()) from leases where run_id = 'run-a'"
        )
    )
    assert ctx.lease_window_seconds - 60 < ends_in <= ctx.lease_window_seconds
