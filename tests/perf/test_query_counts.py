"""Statements per request: each route of the hot path issues at most the number of SQL statements
recorded below, counted on the app's engine with SQLAlchemy's ``before_cursor_execute`` event.

Counts are exact and repeatable, unlike timings: a change that adds a round trip to a request
fails here, on any machine. Only the request's own statements are counted: the wake scan's gate
(advisory locks on a connection of its own) and the claim listener (LISTEN on its own connection)
are not on the app's engine. An ``executemany`` (several rows of one INSERT) counts once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask import Flask
from sqlalchemy import event

from tests.agent import claim, claimed, report
from tests.helpers import advertise, cap, submit, two_steps

# The most statements each request may issue. When a change makes a route cheaper, record its
# lower count here in the same change: a limit only ever goes down.
#
# Every route that wakes the queue pays three statements for SPEC §7's wake marks (a waiter that
# never scans must not strand a freed node): ``nextval('wake_mark')`` after the freeing commit,
# the scan's read of the last mark before its first queue read, and its ``setval('wake_covered')``
# when it succeeds. They were added with the marks, which is why those limits went up by three.
# Every lease insert (a placed submit, a promotion, an acquire) pays two for SPEC §7a, with
# reservations on: ``FOR SHARE`` on its nodes' rows, then one statement that re-checks no
# reservation is held against the run and records the placements (the race with a reservation
# written after the read is closed on the ``nodes`` rows); those limits went up by two.
MAX_STATEMENTS: dict[str, int] = {
    "submit placed": 5,
    "submit queued": 16,
    "dry-run": 1,
    "advert heartbeat": 2,
    "advert new node": 8,
    "claim with work": 5,
    # Its one look: the step its instance holds, the next claimable one, and whether the node has
    # a live advert (a claim for a node without one waits at most 1 s, SPEC §20.6).
    "claim empty": 3,
    "result, run goes on": 12,
    "result, run ends": 24,
    "cancel": 15,
    "cancel promoting a queued run": 28,
}

one_app_per_module = True

INSTANCE = {"X-Enode-Instance": "boot-1"}


@contextmanager
def counting(app: Flask) -> Iterator[list[str]]:
    """The statements the app's engine sends while the block runs."""
    engine = app.extensions["mediator"].db.engine
    seen: list[str] = []

    def on_execute(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> None:
        seen.append(" ".join(statement.split())[:160])

    event.listen(engine, "before_cursor_execute", on_execute)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", on_execute)


def assert_within(route: str, seen: list[str]) -> None:
    limit = MAX_STATEMENTS[route]
    listing = "\n".join(f"  {i + 1}. {s}" for i, s in enumerate(seen))
    assert len(seen) <= limit, f"{route}: {len(seen)} statements, at most {limit}:\n{listing}"


def fleet_of_one(client: Any) -> None:
    """Node n1 (a board) advertised, with a heartbeat after it so the request path is warm."""
    advertise(client, "n1", cap(), instance="boot-1")
    advertise(client, "n1", cap(), instance="boot-1")


def placed(client: Any, run_id: str = "r1") -> None:
    submit(client, two_steps(run_id), 201)


def test_a_placed_submit_stays_within_its_statements(app: Flask, client: Any) -> None:
    fleet_of_one(client)
    with counting(app) as seen:
        submit(client, two_steps("r1"), 201)
    assert_within("submit placed", seen)


def test_a_queued_submit_with_its_scan_stays_within_its_statements(app: Flask, client: Any) -> None:
    fleet_of_one(client)
    placed(client)
    with counting(app) as seen:
        submit(client, two_steps("r2"), 202)
    assert_within("submit queued", seen)


def test_a_dry_run_stays_within_its_statements(app: Flask, client: Any) -> None:
    fleet_of_one(client)
    with counting(app) as seen:
        resp = client.post("/v1/runs/dry-run", json=two_steps("d1"))
    assert resp.status_code == 200, resp.get_json()
    assert_within("dry-run", seen)


def test_a_heartbeat_stays_within_its_statements(app: Flask, client: Any) -> None:
    fleet_of_one(client)
    placed(client)
    with counting(app) as seen:
        advertise(client, "n1", cap(), instance="boot-1")
    assert_within("advert heartbeat", seen)


def test_the_first_advert_of_a_node_stays_within_its_statements(app: Flask, client: Any) -> None:
    fleet_of_one(client)
    with counting(app) as seen:
        advertise(client, "n2", cap(), instance="boot-2")
    assert_within("advert new node", seen)


def test_a_claim_that_gets_a_step_stays_within_its_statements(app: Flask, client: Any) -> None:
    fleet_of_one(client)
    placed(client)
    with counting(app) as seen:
        resp = claim(client, "n1", "boot-1")
    assert resp.status_code == 200, resp.get_json()
    assert_within("claim with work", seen)


def test_a_claim_with_nothing_to_do_stays_within_its_statements(app: Flask, client: Any) -> None:
    fleet_of_one(client)
    with counting(app) as seen:
        resp = claim(client, "n1", "boot-1")
    assert resp.status_code == 204
    assert_within("claim empty", seen)


def test_a_result_the_run_goes_on_after_stays_within_its_statements(
    app: Flask, client: Any
) -> None:
    fleet_of_one(client)
    placed(client)
    claimed(client, "n1", "boot-1")
    with counting(app) as seen:
        resp = report(client, "r1", 1, "n1")
    assert resp.status_code == 200, resp.get_json()
    assert_within("result, run goes on", seen)


def test_a_result_that_ends_the_run_stays_within_its_statements(app: Flask, client: Any) -> None:
    fleet_of_one(client)
    placed(client)
    claimed(client, "n1", "boot-1")
    assert report(client, "r1", 1, "n1").status_code == 200
    claimed(client, "n1", "boot-1")
    with counting(app) as seen:
        resp = report(client, "r1", 2, "n1")
    assert resp.status_code == 200, resp.get_json()
    assert client.get("/v1/runs/r1").get_json()["state"] == "SUCCEEDED"
    assert_within("result, run ends", seen)


def test_a_cancel_stays_within_its_statements(app: Flask, client: Any) -> None:
    fleet_of_one(client)
    placed(client)
    with counting(app) as seen:
        resp = client.post("/v1/runs/r1/cancel")
    assert resp.status_code == 200, resp.get_json()
    assert_within("cancel", seen)


def test_a_cancel_that_promotes_a_queued_run_stays_within_its_statements(
    app: Flask, client: Any
) -> None:
    fleet_of_one(client)
    placed(client)
    submit(client, two_steps("r2"), 202)
    with counting(app) as seen:
        resp = client.post("/v1/runs/r1/cancel")
    assert resp.status_code == 200, resp.get_json()
    assert client.get("/v1/runs/r2").get_json()["state"] == "RUNNING"
    assert_within("cancel promoting a queued run", seen)
