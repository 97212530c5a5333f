"""What the reaper owes, and what it does not (docs/queue.md, "Which commit frees, and its mark"):
a run whose promotion raises every time is no reason to scan at every pass (that would be a
polling loop), and a reservation-age scan that the gate skips leaves a mark that the next pass
pays."""

from __future__ import annotations

from app.services.queue import wake_queued
from app.services.reaper import reap_pass
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import app_on, client_of
from tests.support.concurrency import connect, states, waiting_lock_held
from tests.support.contracts import contract, role
from tests.support.invariants import marks
from tests.support.submitter import submit


def test_a_run_whose_promotion_always_raises_does_not_make_every_reaper_pass_scan(
    fresh_db_url, tmp_path
):
    with app_on(fresh_db_url, tmp_path / "r") as app, connect(fresh_db_url) as sql:
        client = client_of(app)
        ctx = app.extensions["mediator"]
        advertise(client, "s1", cap("scope"))
        submit(client, contract("holder", role("m", "scope")), 201)
        submit(client, contract("poisoned", role("m", "scope")), 202)
        # Written by hand or by an older release: requirements that no longer decode.
        sql.execute("update runs set requires = '[{\"as\": \"m\"}]' where run_id = 'poisoned'")
        sql.execute("delete from leases where run_id = 'holder'")  # s1 is free
        assert wake_queued(ctx, "s1 freed").errors == 1
        woke = [reap_pass(ctx).woke for _ in range(4)]
        # The first pass pays the debt the promotion left; its scan meets the same error and
        # owes nothing new; the passes after it have nothing to pay.
        assert woke == [True, False, False, False]
        assert states(sql, ["poisoned"]) == {"poisoned": "QUEUED"}
        mark, covered = marks(sql)
        assert covered >= mark


def test_a_reservation_age_scan_skipped_by_the_gate_leaves_a_mark_the_next_pass_pays(
    fresh_db_url, tmp_path
):
    keys = {"queue.reserve_after_seconds": 60}
    with app_on(fresh_db_url, tmp_path / "r", **keys) as app, connect(fresh_db_url) as sql:
        client = client_of(app)
        ctx = app.extensions["mediator"]
        advertise(client, "n1", cap("board"))
        advertise(client, "n2", cap("board"))
        submit(client, contract("holder"), 201)
        submit(client, contract("wide", role("duts", count=2)), 202)
        reap_pass(ctx)  # the reaper's first pass: its previous pass is now known
        # The wide run crossed the reservation age since that pass (the database's clock, moved
        # by hand: the pass 90 s ago, the run submitted 70 s ago).
        sql.execute("update reaper_state set last_pass_at = now() - interval '90 s'")
        sql.execute("update runs set created_at = now() - interval '70 s' where run_id = 'wide'")
        before, _ = marks(sql)
        with waiting_lock_held(sql):
            # A waiter that never scans: the reaper's reservation-age scan is skipped.
            report = reap_pass(ctx)
            assert report.crossed_age and not report.woke
        mark, covered = marks(sql)
        assert mark > before and covered < mark
        # A pass sees the marks its predecessor read: within two passes the mark is found
        # uncovered and paid with the reaper's direct turn, and the reservation is written.
        assert [reap_pass(ctx).woke for _ in range(2)] == [False, True]
        reserved = sql.execute("select run_id from reservations").fetchall()
        assert {r[0] for r in reserved} == {"wide"}
        assert marks(sql)[1] >= mark
