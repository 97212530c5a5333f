"""One lock order (docs/queue.md, "Lock order"), on databases of their own: a lease insert takes
its nodes' rows, then its placements, then its leases; an acquire, which comes after its run's
own leases, never waits and leaves no placement of a node it did not get.

Each race is held open with row locks from a second connection, or a promotion held between its
placement and its leases by a hook on its statements; nothing waits on time. A deadlock is read
from ``pg_stat_database.deadlocks`` once every session has ended."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from app.services.queue import wake_queued
from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done
from tests.support.apps import app_on, client_of
from tests.support.concurrency import (
    JOIN_TIMEOUT,
    Background,
    apps_on,
    await_condition,
    backends_waiting_on_locks,
    connect,
    deadlocks,
    lease_runs,
    states,
    waiting_lock_held,
)
from tests.support.contracts import acquire_run, one_step
from tests.support.invariants import check
from tests.support.submitter import submit


def _placements(sql: Any, node: str) -> list[tuple[str, int]]:
    return sql.execute(
        "select node_id, priority from placements where node_id = %s", (node,)
    ).fetchall()


def _blob(client: Any, run_id: str, name: str) -> Any:
    resp = client.get(f"/v1/runs/{run_id}/blob/{name}")
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return json.loads(resp.data)


def test_an_acquire_whose_lease_insert_finds_the_node_taken_leaves_no_placement_of_it(
    fresh_db_url, tmp_path
):
    with (
        app_on(fresh_db_url, tmp_path / "r") as app,
        connect(fresh_db_url) as sql,
        connect(fresh_db_url) as taker,
    ):
        c = client_of(app)
        advertise(c, "n1", cap("board"))
        advertise(c, "n2", cap("board"))
        advertise(c, "s1", cap("scope"))
        submit(c, acquire_run("r1"), 201)  # on n1
        submit(c, one_step("other"), 201)  # on n2
        claimed(c, "n1")
        # Another run takes s1 and has not committed: the acquire reads s1 free, and its lease
        # insert waits on this one's.
        taker.execute("begin")
        taker.execute(
            "insert into leases (node_id, run_id, role, capability, nonce, not_after)"
            " values ('s1', 'other', 'extra', 'scope', 'n0nce', now() + interval '1 hour')"
        )
        result = Background(lambda: done(c, "r1", 1, "n1"))
        await_condition(
            lambda: result.done.is_set() or backends_waiting_on_locks(sql) == 1,
            "the acquire's lease insert waiting on the other run's",
        )
        taker.execute("commit")
        assert result.result(JOIN_TIMEOUT)["run_state"] == ""
        assert _blob(c, "r1", "grab") == {"state": "unavailable"}
        assert sorted(lease_runs(sql, "other")) == ["n2", "s1"]
        # The placement and the lease went together: no placement of s1 stands for r1 (a
        # phantom one would make a queued run of a higher priority count as overtaken).
        assert _placements(sql, "s1") == []


def test_an_acquire_takes_the_next_free_node_without_waiting_for_one_being_placed(
    fresh_db_url, tmp_path
):
    with (
        app_on(fresh_db_url, tmp_path / "r") as app,
        connect(fresh_db_url) as sql,
        connect(fresh_db_url) as placer,
    ):
        c = client_of(app)
        advertise(c, "n1", cap("board"))
        advertise(c, "n2", cap("board"))
        advertise(c, "s1", cap("scope"))
        advertise(c, "s2", cap("scope"))
        submit(c, acquire_run("r1"), 201)  # on n1
        submit(c, one_step("other"), 201)  # on n2
        claimed(c, "n1")
        # A lease insert in progress on s1, the acquire's first candidate: it holds the node's
        # row from before its placement to its commit, as every lease insert does.
        placer.execute("begin")
        placer.execute("select node_id from nodes where node_id = 's1' for share")
        placer.execute(
            "insert into leases (node_id, run_id, role, capability, nonce, not_after)"
            " values ('s1', 'other', 'extra', 'scope', 'n0nce', now() + interval '1 hour')"
        )
        try:
            result = Background(lambda: done(c, "r1", 1, "n1"))
            await_condition(
                lambda: result.done.is_set() or backends_waiting_on_locks(sql) == 1,
                "the result answered, or waiting on the lease insert in progress",
            )
            # It never waited: s1 is unavailable to it at this moment, and s2 is free.
            assert result.done.is_set(), "the acquire waited on a node another run was taking"
        finally:
            placer.execute("commit")
        assert result.result(JOIN_TIMEOUT)["run_state"] == ""
        assert _blob(c, "r1", "grab") == {"state": "acquired", "node": "s2"}
        assert sorted(lease_runs(sql, "r1")) == ["n1", "s2"]
        assert _placements(sql, "s1") == []
        assert _placements(sql, "s2") == [("s2", 0)]


@contextmanager
def held_before_its_leases(engine: Any) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold the first lease insert sent on ``engine`` (a promotion's, after its placements) until
    the second event is set; the first is set once it is held."""
    held, go = threading.Event(), threading.Event()

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "INSERT INTO leases" in statement and not held.is_set():
            held.set()
            assert go.wait(JOIN_TIMEOUT), "the promotion was never let go"

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield held, go
    finally:
        go.set()
        event.remove(engine, "before_cursor_execute", before)


def test_a_submit_that_waits_for_a_promotions_placement_holds_no_lease_of_that_node_yet(
    fresh_db_url, tmp_path
):
    """A promotion holds its run, its nodes' rows and its placements, and is about to insert its
    leases; a submit that read the same node free waits on the placement. Were the submit's
    lease written before its placement, the promotion's insert would wait on it in turn: a
    deadlock (the storm found it)."""
    before = deadlocks(fresh_db_url)
    with (
        apps_on(fresh_db_url, tmp_path / "r", 2) as apps,
        connect(fresh_db_url) as sql,
    ):
        c = apps.client(1)
        advertise(c, "n1", cap("board"))
        submit(c, one_step("x"), 201)
        submit(c, one_step("q"), 202)
        with waiting_lock_held(sql):
            assert c.post("/v1/runs/x/cancel").status_code == 200  # n1 free, q not promoted
        with held_before_its_leases(apps.ctx(0).db.engine) as (held, go):
            scan = Background(lambda: wake_queued(apps.ctx(0), "test"))
            assert held.wait(JOIN_TIMEOUT), "the promotion never reached its leases"
            placing = Background(lambda: submit(c, one_step("s")))
            await_condition(
                lambda: placing.done.is_set() or backends_waiting_on_locks(sql) == 1,
                "the submit waiting on the promotion's placement",
            )
            go.set()
            assert scan.result(JOIN_TIMEOUT).promoted == ["q"]
            resp = placing.result(JOIN_TIMEOUT)
        assert resp.status_code == 202, resp.get_json()
        assert states(sql, ["q", "s"]) == {"q": "RUNNING", "s": "QUEUED"}
        assert lease_runs(sql, "q") == ["n1"]
        assert check(sql) == []
    assert deadlocks(fresh_db_url) == before
