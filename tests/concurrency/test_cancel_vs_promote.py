"""A cancel (docs/queue.md#leaving-the-queue) locks the run row and re-reads its state ("it may have
been promoted a moment ago"); promotion is guarded by ``state = 'QUEUED'``. Whatever the
interleaving, a cancel racing a promotion of the same run leaves it FAILED (cancelled) and holding
no lease."""

from __future__ import annotations

from app.services.queue import Outcome, promote, wake_queued
from app.store.nodes import live_adverts, unavailable_node_ids
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.concurrency import apps_on, connect, queued_run, race, waiting_lock_held
from tests.support.contracts import contract
from tests.support.submitter import submit

ROUNDS = 20


def _queued_next_to_free_n1(c, sql, i):
    with waiting_lock_held(sql):
        submit(c, contract(f"holder-{i}"), 201)
        submit(c, contract(f"target-{i}"), 202)
        assert c.post(f"/v1/runs/holder-{i}/cancel").status_code == 200
    assert sql.execute("select count(*) from leases").fetchone() == (0,)
    return f"target-{i}"


def _assert_cancelled_and_holding_nothing(sql, run_id):
    state, note = sql.execute(
        "select state, verdict->'checks'->0->>'note' from runs where run_id = %s", (run_id,)
    ).fetchone()
    assert (state, note) == ("FAILED", "cancelled by: token")
    assert sql.execute("select * from leases where run_id = %s", (run_id,)).fetchall() == []
    assert sql.execute("select count(*) from leases").fetchone() == (0,)
    assert sql.execute(
        "select count(*) from steps where run_id = %s and state in ('PENDING', 'CLAIMED', 'ASKED')",
        (run_id,),
    ).fetchone() == (0,)
    assert sql.execute(
        "select count(*) from run_events where run_id = %s and cause like 'cancelled by %%'",
        (run_id,),
    ).fetchone() == (1,)


def test_a_cancel_racing_a_promotion_of_the_same_run_leaves_no_lease_behind(fresh_db_url, tmp_path):
    with apps_on(fresh_db_url, tmp_path / "records", 2) as apps, connect(fresh_db_url) as sql:
        c, other = apps.client(0), apps.client(1)
        advertise(c, "n1", cap("board"))
        outcomes = set()
        for i in range(ROUNDS):
            run_id = _queued_next_to_free_n1(c, sql, i)
            run = queued_run(sql, run_id)
            ctx = apps.ctx(0)
            with ctx.db.read() as s:
                adverts, unavailable = live_adverts(s), unavailable_node_ids(s)
            promoted, cancelled = race(
                lambda: promote(ctx, run, adverts, set(unavailable), "race"),
                lambda: other.post(f"/v1/runs/{run_id}/cancel"),
            )
            assert cancelled.status_code == 200
            assert cancelled.get_json() == {"run_id": run_id, "state": "FAILED"}
            outcomes.add(promoted[0])
            assert promoted[0] in (Outcome.PROMOTED, Outcome.NOT_QUEUED)
            _assert_cancelled_and_holding_nothing(sql, run_id)
            trail = sql.execute(
                "select from_state, to_state from run_events where run_id = %s order by id",
                (run_id,),
            ).fetchall()
            if promoted[0] is Outcome.PROMOTED:
                assert trail == [(None, "QUEUED"), ("QUEUED", "RUNNING"), ("RUNNING", "FAILED")]
            else:
                assert trail == [(None, "QUEUED"), ("QUEUED", "FAILED")]


def test_a_cancel_racing_a_whole_wake_scan_leaves_no_lease_behind(fresh_db_url, tmp_path):
    with apps_on(fresh_db_url, tmp_path / "records", 2) as apps, connect(fresh_db_url) as sql:
        c, other = apps.client(0), apps.client(1)
        advertise(c, "n1", cap("board"))
        for i in range(ROUNDS):
            run_id = _queued_next_to_free_n1(c, sql, i)
            report, cancelled = race(
                lambda: wake_queued(apps.ctx(0), "race"),
                lambda: other.post(f"/v1/runs/{run_id}/cancel"),
            )
            assert cancelled.status_code == 200
            assert cancelled.get_json() == {"run_id": run_id, "state": "FAILED"}
            assert report.errors == 0
            _assert_cancelled_and_holding_nothing(sql, run_id)
