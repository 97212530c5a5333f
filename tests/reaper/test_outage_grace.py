"""The reaper's outage grace (docs/queue.md#crashes-and-restarts): after a pass older than a lease
window, every lease of an unfinished run ends no sooner than one window from now — a node that is
alive has a full window to re-advertise, and one that really died is reaped one window after the
outage, however long the outage was. Time passes only in the database: the last pass and the leases
are moved with SQL."""

from __future__ import annotations

from app.services.reaper import reap_pass
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.clock import LEASE_EXPIRED
from tests.support.contracts import contract, role
from tests.support.rows import run_row, scalar
from tests.support.submitter import submit


def outage(sql, last_pass_ago: str) -> None:
    """The reaper's last pass was ``last_pass_ago`` ago (the API kept serving meanwhile)."""
    sql.execute(
        "insert into reaper_state (id, last_pass_at) values (1, now() - %s::interval)"
        " on conflict (id) do update set last_pass_at = excluded.last_pass_at",
        (last_pass_ago,),
    )


def lease_ends_in(sql, run_id: str) -> float:
    """Seconds from the database's now() to the lease's not_after."""
    return float(
        scalar(
            sql,
            "select extract(epoch from not_after - now()) from leases where run_id = %s",
            run_id,
        )
    )


def ends_one_window_from_now(ctx, sql, run_id: str) -> bool:
    """The lease ends one lease window (renew x factor) from the database's now(), give or take
    the time the test took since the pass."""
    return ctx.lease_window_seconds - 60 < lease_ends_in(sql, run_id) <= ctx.lease_window_seconds


def running(client, run_id: str, node: str, capability: str = "board") -> None:
    advertise(client, node, cap(capability))
    submit(client, contract(run_id, role("dut", capability)), 201)


def test_after_a_long_reaper_outage_a_lapsed_lease_ends_one_window_from_now_not_a_gap_later(
    client, ctx, sql
):
    running(client, "run-a", "n1")
    outage(sql, "1 day")
    sql.execute("update leases set not_after = now() - interval '1 hour'")  # n1 died an hour ago

    report = reap_pass(ctx)

    assert report.extended == 1 and report.lease_expired == []
    assert ends_one_window_from_now(ctx, sql, "run-a")


def test_a_node_that_really_died_is_reaped_one_window_after_the_outage(client, ctx, sql):
    running(client, "run-a", "n1")
    outage(sql, "1 day")
    sql.execute("update leases set not_after = now() - interval '1 hour'")
    assert reap_pass(ctx).extended == 1

    # One window later, with passes every renew_seconds meanwhile, n1 has not re-advertised.
    outage(sql, f"{ctx.config['lease.renew_seconds']} s")
    sql.execute(
        "update leases set not_after = not_after - %s::interval", (f"{ctx.lease_window_seconds} s",)
    )
    report = reap_pass(ctx)

    assert report.extended == 0 and report.lease_expired == ["run-a"]
    assert run_row(sql, "run-a")["reject"] == {"Code": 410, "Reason": LEASE_EXPIRED}


def test_a_lease_that_ends_later_than_one_window_keeps_its_not_after(client, ctx, sql):
    running(client, "run-a", "n1")  # a fresh lease: lease.ttl_seconds (3600 s) from now
    before = scalar(sql, "select not_after from leases where run_id = 'run-a'")
    outage(sql, "1 day")

    report = reap_pass(ctx)

    assert report.extended == 0
    assert scalar(sql, "select not_after from leases where run_id = 'run-a'") == before


def test_only_leases_of_unfinished_runs_are_extended(client, ctx, sql):
    running(client, "run-a", "n1")
    running(client, "run-b", "n2", "scope")
    sql.execute("update leases set not_after = now() - interval '1 hour'")
    sql.execute("update runs set state = 'SUCCEEDED', ended_at = now() where run_id = 'run-b'")
    outage(sql, "2 hours")

    report = reap_pass(ctx)

    assert report.extended == 1 and report.leases_deleted == 1
    assert scalar(sql, "select array_agg(run_id) from leases") == ["run-a"]
    assert ends_one_window_from_now(ctx, sql, "run-a")


def test_a_short_gap_is_no_outage_and_extends_nothing(client, ctx, sql):
    running(client, "run-a", "n1")
    sql.execute("update leases set not_after = now() + interval '5 s'")
    outage(sql, f"{ctx.lease_window_seconds - 5} s")

    report = reap_pass(ctx)

    assert report.extended == 0
    assert lease_ends_in(sql, "run-a") <= 5
