"""Statements per request: each route of the hot path issues at most the number of SQL statements
recorded below, counted on the app's engine with SQLAlchemy's ``before_cursor_execute`` event.

Counts are exact and repeatable, unlike timings: a change that adds a round trip to a request
fails here, on any machine. Only the request's own statements are counted: the wake scan's gate
(advisory locks on a connection of its own), the claim listener (LISTEN on its own connection) and
the claim notifier (the NOTIFY after a commit, sent by the process's notifier thread on its own
connection) are not on the app's engine. An ``executemany`` (several rows of one INSERT) counts
once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from flask import Flask
from psycopg._connection_base import BaseConnection
from sqlalchemy import event

from app.services.expected import QueuedShapes
from app.store import pipeline
from tests.support.actors import cap
from tests.support.agent import advertise, claim, claimed, report
from tests.support.apps import client_of
from tests.support.contracts import contract, two_steps
from tests.support.submitter import submit

# The most statements each request may issue. When a change makes a route cheaper, record its
# lower count here in the same change: a limit only ever goes down.
#
# Every route that wakes the queue pays three statements for the wake marks of
# docs/design.md#the-scan-gate-and-wake-marks (a waiter that never scans must not strand a freed
# node): ``nextval('wake_mark')`` after the freeing commit, the scan's read of the last mark before
# its first queue read, and its ``setval('wake_covered')`` when it succeeds. They were added with
# the marks, which is why those limits went up by three. Every lease insert (a placed submit, a
# promotion, an acquire) pays two for the reservations of
# docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits, with them on: ``FOR SHARE``
# on its nodes' rows, then one statement that re-checks no reservation is held against the run and
# records the placements (the race with a reservation written after the read is closed on the
# ``nodes`` rows); those limits went up by two. The two travel in one round trip (pipelined), and
# count here as the two statements they are. A request that notifies claims no longer sends the
# NOTIFY itself: it hands the nodes to the process's notifier
# (docs/design.md#claims-and-the-long-poll, app/listener.py); those limits went down by one.
MAX_STATEMENTS: dict[str, int] = {
    # The candidates, the insert (run, first event, steps), the nodes' lock, the reservation
    # check with the placements and then the leases (docs/queue.md, "Lock order"), and after the
    # commit, in its round trip, the claims' NOTIFY (which no other thread sends for it).
    "submit placed": 5,
    # The candidates, the last wake mark and every candidate with its holders (only a run that
    # queues pays these two: docs/queue.md#on-submit-placed-queued-or-rejected), the insert, then
    # its place in the queue with the marks: no scan when nothing was freed since the read (it was
    # 16 with the scan every queued submit ran). The 202 explains from placement's read (it read
    # the candidates once more, and was 8). The 202's
    # expected start adds two (it was 6): the steps of the candidates' holders and the medians of
    # their recorded durations (docs/queue.md, "What a QUEUED run's view explains"). One more
    # (it was 7): the place in the queue is two statements in one round trip, the run's place,
    # then the clock, the mark and the reservation probes, which have no parameter and are
    # planned once a connection instead of at every submit (half of the place's planning).
    "submit queued": 8,
    # The next queued submit of a shape that queued last time reads the mark first: one read of
    # every candidate, which its 202 explains from (it was 9). Its expected start adds three (it
    # was 5, then 4): the runs of the sharing shapes ahead of it, then the steps of the holders
    # and those runs, and the medians. The queued shapes are read once a second at most by a
    # process (docs/queue.md, "What a QUEUED run's view explains"), not by each request. The
    # place in the queue is two statements in one round trip, as above.
    "submit queued, its shape queued before": 8,
    "dry-run": 1,
    # One statement: the restart look, the node row's lock, the lease renewal and the upsert
    # together (an advert that changes nothing costs one small statement: docs/design.md#targets).
    "advert heartbeat": 1,
    "advert new node": 7,
    "claim with work": 5,
    # Its one look: the step its instance holds, the next claimable one, and whether the node has
    # a live advert (a claim for a node without one waits at most 1 s,
    # docs/security.md#input-and-load).
    "claim empty": 3,
    "result, run goes on": 11,
    # One more (it was 24): the reporting node's drain, hold and strikes read in one statement
    # even when the run ends, since a DONE step resets strikes (docs/operators.md).
    "result, run ends": 25,
    # The run's lock, then one statement that ends it (run, steps, leases, event: it was four),
    # after the commit the wake mark, the seal's lock with its reads in one round trip (three
    # statements: it was four, and five with the lock) and its mark, then the wake: on an empty
    # queue, one statement reads the last mark with whether any run is QUEUED and covers it (it
    # was two, and before the scan's four and the gate). It was 15, then 9;
    # docs/design.md#targets asks a placed submit's five and its wake.
    "cancel": 8,
    "cancel promoting a queued run": 27,
}

one_app_per_module = True

# the safety net's period in this module's app (docs/design.md#claims-and-the-long-poll)
RECHECK_SECONDS = 0.2


@pytest.fixture(scope="module")
def module_config() -> dict[str, Any]:
    return {"claim.recheck_seconds": RECHECK_SECONDS}


INSTANCE = {"X-Enode-Instance": "boot-1"}


@contextmanager
def counting(app: Flask, *, any_thread: bool = False) -> Iterator[list[str]]:
    """The statements the app's engine sends while the block runs: from this thread only (the
    Flask test client serves the request in it; the claims' safety net runs in the listener's
    thread, whenever a claim waits), or from every thread with ``any_thread``."""
    engine = app.extensions["mediator"].db.engine
    seen: list[str] = []
    here = threading.get_ident()

    def on_execute(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> None:
        if any_thread or threading.get_ident() == here:
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


def one_queued(client: Any) -> None:
    """Node n1 held by r1, and r2 queued behind it."""
    fleet_of_one(client)
    placed(client)
    submit(client, two_steps("r2"), 202)


def test_a_placed_submit_stays_within_its_statements(app: Flask, client: Any) -> None:
    fleet_of_one(client)
    with counting(app) as seen:
        submit(client, two_steps("r1"), 201)
    assert_within("submit placed", seen)


def test_a_queued_submit_stays_within_its_statements(app: Flask, client: Any) -> None:
    fleet_of_one(client)
    placed(client)
    with counting(app) as seen:
        submit(client, two_steps("r2"), 202)
    assert_within("submit queued", seen)


def test_a_queued_submit_whose_shape_queued_before_stays_within_its_statements(
    app: Flask, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # However slow the machine, the list read for r3 is still fresh for r4.
    monkeypatch.setattr(
        app.extensions["mediator"], "estimate_shapes", QueuedShapes(fresh_seconds=3600)
    )
    one_queued(client)
    submit(client, two_steps("r3"), 202)  # reads the process's list of queued shapes
    with counting(app) as seen:
        submit(client, two_steps("r4"), 202)
    assert_within("submit queued, its shape queued before", seen)


# The candidate reads' first words: the bounded one (app.store.nodes.first_candidates) and the
# one of every candidate (candidate_adverts).
CANDIDATE_READS = ("SELECT f.key_no, f.node_id", "SELECT nodes.node_id, nodes.capabilities")


@pytest.mark.parametrize("before", ["r2 placed", "r2 queued"])
def test_a_queued_submit_reads_every_candidate_once_and_its_202_explains_from_that_read(
    app: Flask, client: Any, before: str
) -> None:
    """docs/queue.md#what-a-queued-runs-view-explains: the 202's candidates come from the read
    placement made, not from a read of their own (a run whose shape queued last time reads them
    once in all; one whose shape did not reads the first candidates, then every one)."""
    # A shape of this case's own: the process remembers which shapes queued last time.
    uses = "queued-before" if before == "r2 queued" else "placed-before"
    fleet_of_one(client)
    placed(client)
    if before == "r2 queued":
        submit(client, two_steps("r2", uses), 202)
    with counting(app) as seen:
        body = submit(client, two_steps("r3", uses), 202).get_json()
    reads = [st for st in seen if st.startswith(CANDIDATE_READS)]
    whole = [st for st in reads if st.startswith(CANDIDATE_READS[1])]
    assert len(whole) == 1, reads
    assert len(reads) == (1 if before == "r2 queued" else 2), reads
    (line,) = body["requires"]
    assert line["candidates"]["live"] == 1 and line["candidates"]["busy"] == 1, line
    assert line["held_by"] == ["r1"], line


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


def test_an_advert_that_changes_nothing_is_one_round_trip_without_begin_or_commit(
    app: Flask, client: Any
) -> None:
    """Its one statement commits by itself (autocommit), so no BEGIN goes ahead of it and no
    COMMIT after it (an advert that changes nothing costs one small statement:
    docs/design.md#targets)."""
    fleet_of_one(client)
    placed(client)
    with exchanges() as seen:
        advertise(client, "n1", cap(), instance="boot-1")
    trips = round_trips(seen)
    assert len(trips) == 1 and len(trips[0]) == 1, trips
    assert trips[0][0].startswith("WITH prev AS"), trips


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
    one_queued(client)
    with counting(app) as seen:
        resp = client.post("/v1/runs/r1/cancel")
    assert resp.status_code == 200, resp.get_json()
    assert client.get("/v1/runs/r2").get_json()["state"] == "RUNNING"
    assert_within("cancel promoting a queued run", seen)


def test_a_heartbeat_of_a_node_without_leases_is_one_statement(app: Flask, client: Any) -> None:
    fleet_of_one(client)
    with counting(app) as seen:
        advertise(client, "n1", cap(), instance="boot-1")
    assert_within("advert heartbeat", seen)


def test_waiting_claims_cost_one_safety_net_statement_a_period_whatever_their_number(
    app: Flask, client: Any
) -> None:
    """After its first look a waiting claim does no database work of its own
    (docs/design.md#claims-and-the-long-poll); the process's safety net asks once a period for all
    of them. Twelve claims wait over three periods: at most one statement a period is sent, and no
    claim looks again."""
    nodes = [f"w{i:02d}" for i in range(12)]
    for node in nodes:
        advertise(client, node, cap(), instance="boot-1")
    listener = app.extensions["mediator"].claims
    answers: list[int] = []

    def wait_for_work(node: str) -> None:
        answers.append(claim(client_of(app), node, "boot-1", wait=120).status_code)

    threads = [threading.Thread(target=wait_for_work, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for _ in range(200):  # a period at a time until every claim has had its first look
        if listener.waiting() == len(nodes) and listener.looks() == len(nodes):
            break
        assert listener.await_passes(listener.passes + 1, timeout=30)
    assert listener.looks() == len(nodes)
    with counting(app, any_thread=True) as seen:
        start = listener.passes
        assert listener.await_passes(start + 3, timeout=30)
        end = listener.passes
    assert listener.looks() == len(nodes), "a waiting claim looked again by itself"
    assert all(st.startswith("SELECT DISTINCT steps.node_id FROM steps") for st in seen), seen
    assert 1 <= len(seen) <= end - start + 1, seen
    # Work for every node (each run takes a free board): the submits' notifications wake the
    # claims, which take their steps.
    for node in nodes:
        submit(client, contract(f"run-{node}"), 201)
    for t in threads:
        t.join(timeout=60)
    assert sorted(answers) == [200] * len(nodes)


@contextmanager
def exchanges() -> Iterator[list[tuple[str, int | None]]]:
    """What this thread sends to the database, in order: each statement and each transaction
    command, with the number of the round trip it went in when it went with others (a batch of
    ``app.store.pipeline.exchange``), None when it went alone (psycopg's own BEGIN or COMMIT, a
    statement through a psycopg cursor). The real calls run; this only records them."""
    seen: list[tuple[str, int | None]] = []
    batches = [0]
    here = threading.get_ident()
    execute, command, batch_of = (
        psycopg.Cursor.execute,
        BaseConnection._exec_command,
        pipeline.exchange,
    )

    def on_execute(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == here:
            seen.append((" ".join(str(query).split())[:60], None))
        return execute(cursor, query, *args, **kwargs)

    def on_command(conn: Any, cmd: bytes, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == here:
            seen.append((cmd.decode(), None))
        return command(conn, cmd, *args, **kwargs)

    def on_exchange(
        conn: Any, opening: bytes | None, sent: list[tuple[str, Any]], **kwargs: Any
    ) -> Any:
        if threading.get_ident() == here:
            batches[0] += 1
            texts = ([opening.decode()] if opening else []) + [sql for sql, _ in sent]
            seen.extend((" ".join(t.split())[:60], batches[0]) for t in texts)
        return batch_of(conn, opening, sent, **kwargs)

    psycopg.Cursor.execute = on_execute  # type: ignore[method-assign]
    BaseConnection._exec_command = on_command  # type: ignore[method-assign]
    pipeline.exchange = on_exchange
    try:
        yield seen
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
        BaseConnection._exec_command = command  # type: ignore[method-assign]
        pipeline.exchange = batch_of


def round_trips(seen: list[tuple[str, int | None]]) -> list[list[str]]:
    """``seen`` grouped into round trips: what went in one batch shares one."""
    trips: list[list[str]] = []
    for i, (sent, batch) in enumerate(seen):
        if batch is not None and i and seen[i - 1][1] == batch:
            trips[-1].append(sent)
        else:
            trips.append([sent])
    return trips


def test_a_placed_submit_takes_three_round_trips_its_begin_going_with_its_write(
    app: Flask, client: Any
) -> None:
    """The candidate read before BEGIN (autocommit: its own snapshot, as in READ COMMITTED), then
    BEGIN with the insert and the reservation check in one batch, then COMMIT with the claims'
    NOTIFY after it: no round trip of its own for BEGIN, nor for the NOTIFY (a placed submit
    costs little more than its SQL: docs/design.md#targets)."""
    fleet_of_one(client)
    placed(client, "warm")
    client.post("/v1/runs/warm/cancel", json={})
    with exchanges() as seen:
        submit(client, two_steps("r1"), 201)
    trips = round_trips(seen)
    heads = [[sent.split()[0] for sent in trip] for trip in trips]
    assert heads == [["SELECT"], ["BEGIN", "WITH", "SELECT", "WITH"], ["COMMIT", "WITH"]], trips
    assert trips[2][1].startswith("WITH soft AS (SELECT set_config('synchronous_commit'"), trips


def test_a_queued_submits_place_in_the_queue_is_one_round_trip(app: Flask, client: Any) -> None:
    one_queued(client)
    with exchanges() as seen:
        submit(client, two_steps("r3"), 202)
    trips = round_trips(seen)
    places = [trip for trip in trips if any("runs.state" in sent for sent in trip)]
    assert len(places) == 1 and len(places[0]) == 2, trips
    assert places[0][1].startswith("SELECT now()"), trips


def test_a_queued_submit_begins_its_transaction_with_its_insert(app: Flask, client: Any) -> None:
    one_queued(client)
    with exchanges() as seen:
        submit(client, two_steps("r3"), 202)
    trips = round_trips(seen)
    assert not any(sent.startswith("BEGIN") and len(trip) == 1 for trip in trips for sent in trip)
    begins = [trip for trip in trips if trip[0].startswith("BEGIN")]
    assert len(begins) == 1 and begins[0][1].startswith("WITH new_run AS"), trips
