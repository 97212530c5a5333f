"""Reservations (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits) on a database
of its own: the reservation/lease race closed on the ``nodes`` rows, "overtaken" read from the
record of placements, and one undecodable ``requires`` that must not stall the reservation step of
every scan."""

from __future__ import annotations

from typing import Any

from app.services.queue import wake_queued
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import app_on, client_of
from tests.support.concurrency import (
    Background,
    apps_on,
    await_condition,
    connect,
    states,
    waiting_lock_held,
)
from tests.support.contracts import single, wide
from tests.support.invariants import check
from tests.support.rows import reservations
from tests.support.submitter import submit


def _waiting_on_a_lock(sql: Any) -> int:
    return sql.execute(
        "select count(*) from pg_stat_activity where datname = current_database()"
        " and wait_event_type = 'Lock'"
    ).fetchone()[0]


def test_a_submit_does_not_take_a_node_reserved_after_its_read(fresh_db_url, tmp_path):
    with app_on(fresh_db_url, tmp_path / "r") as app, connect(fresh_db_url) as sql:
        c = client_of(app)
        advertise(c, "n1", cap())
        advertise(c, "n2", cap())
        submit(c, single("busy"), 201)  # on n1
        submit(c, wide("holder"), 202)  # needs both boards
        with connect(fresh_db_url) as writer:
            # A scan's reservation writer, half-way: the node's row locked, the row written,
            # not yet committed. The submit reads n2 free and unreserved.
            writer.execute("begin")
            writer.execute("select node_id from nodes where node_id = 'n2' for no key update")
            writer.execute("insert into reservations (node_id, run_id) values ('n2', 'holder')")
            placing = Background(lambda: submit(c, single("late")))
            await_condition(lambda: _waiting_on_a_lock(sql) >= 1, "the submit's lease insert")
            writer.execute("commit")
            resp = placing.result(timeout=30)
        # Its lease insert waited on the row, then saw the reservation: it queued.
        assert resp.status_code == 202, resp.get_json()
        assert states(sql, ["late"]) == {"late": "QUEUED"}
        assert sql.execute("select run_id from leases where node_id = 'n2'").fetchall() == []
        assert check(sql) == []


def test_a_narrow_run_that_already_ended_still_makes_a_higher_priority_run_reserve(
    fresh_db_url, tmp_path
):
    with app_on(fresh_db_url, tmp_path / "r") as app, connect(fresh_db_url) as sql:
        c = client_of(app)
        advertise(c, "n1", cap())
        advertise(c, "n2", cap())
        submit(c, single("x"), 201)
        submit(c, single("y"), 201)
        submit(c, wide("top", priority=10), 202)
        submit(c, single("z"), 202)
        # n1 frees: top needs both, z (priority 0) is placed on n1 after top arrived...
        assert c.post("/v1/runs/x/cancel").status_code == 200
        assert states(sql, ["z", "top"]) == {"z": "RUNNING", "top": "QUEUED"}
        # ...and ends before any scan looked at top again. It still counts (placements).
        assert c.post("/v1/runs/z/cancel").status_code == 200
        assert reservations(sql) == {"n1": "top", "n2": "top"}
        assert check(sql) == []


def test_an_undecodable_requires_does_not_stall_the_reservation_step(fresh_db_url, tmp_path):
    with app_on(fresh_db_url, tmp_path / "r") as app, connect(fresh_db_url) as sql:
        c = client_of(app)
        advertise(c, "n1", cap())
        advertise(c, "n2", cap())
        submit(c, single("a0"), 201)
        submit(c, single("b0"), 201)
        submit(c, single("bad", priority=5), 202)
        # A row written by an older release, or by hand: its requirements no longer decode.
        sql.execute("""update runs set requires = '[{"nope": 1}]' where run_id = 'bad'""")
        assert c.post("/v1/runs/a0/cancel").status_code == 200
        submit(c, single("c0"), 201)  # placed on n1 after bad arrived: bad is overtaken
        submit(c, single("good"), 202)
        assert c.post("/v1/runs/b0/cancel").status_code == 200
        assert states(sql, ["good", "bad"]) == {"good": "RUNNING", "bad": "QUEUED"}


def test_every_overtaken_run_of_a_shape_reserves_not_only_its_first(fresh_db_url, tmp_path):
    with (
        apps_on(fresh_db_url, tmp_path / "r", 1) as apps,
        connect(fresh_db_url) as sql,
    ):
        c = apps.client(0)
        advertise(c, "n1", cap())
        advertise(c, "n2", cap())
        submit(c, single("x"), 201)
        submit(c, single("y"), 201)
        submit(c, single("top1", priority=10), 202)
        submit(c, single("top2", priority=10), 202)
        with waiting_lock_held(sql):
            # n1 frees with no scan after it, and a priority-0 submit is placed there at once:
            # both waiting priority-10 runs were overtaken on a candidate of theirs.
            assert c.post("/v1/runs/x/cancel").status_code == 200
            submit(c, single("z"), 201)
        wake_queued(apps.ctx(0), "test")
        assert reservations(sql) == {"n1": "top1", "n2": "top2"}
        assert check(sql) == []


def test_a_reserved_node_its_holder_left_goes_to_the_oldest_run_that_wants_it(
    fresh_db_url, tmp_path
):
    """A holder promoted on another node leaves its reserved node in the middle of a scan: the
    older run the reservation kept from it gets it, not the next run of the pass."""
    with (
        apps_on(fresh_db_url, tmp_path / "r", 1) as apps,
        connect(fresh_db_url) as sql,
    ):
        c = apps.client(0)
        advertise(c, "b1", cap())
        advertise(c, "bx", cap(slot="x"))
        submit(c, single("r1"), 201)  # on b1 (fewer attributes first)
        submit(c, single("r2", slot="x"), 201)  # on bx
        submit(c, single("old", slot="x"), 202)  # only bx fits it
        submit(c, single("holder"), 202)  # any board
        with waiting_lock_held(sql):
            assert c.post("/v1/runs/r1/cancel").status_code == 200
            submit(c, single("neg", priority=-5), 201)  # on b1: overtakes holder
            advertise(c, "b1", cap(), policy={"drain": "graceful"})
        submit(c, single("young"), 202)  # any board, after holder (and not overtaken)
        wake_queued(apps.ctx(0), "test")
        assert reservations(sql) == {"bx": "holder"}  # b1 drains: holder reserves bx
        with waiting_lock_held(sql):
            # Both boards free at once, the drain lifted, no scan yet.
            assert c.post("/v1/runs/r2/cancel").status_code == 200
            assert c.post("/v1/runs/neg/cancel").status_code == 200
            advertise(c, "b1", cap(), policy={"drain": ""})
        wake_queued(apps.ctx(0), "test")
        # holder takes b1 (first in candidate order) and leaves bx: old, kept from it by the
        # reservation and older than young, gets it.
        assert states(sql, ["holder", "old", "young"]) == {
            "holder": "RUNNING",
            "old": "RUNNING",
            "young": "QUEUED",
        }
        assert check(sql) == []
