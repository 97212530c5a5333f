"""Reservations (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits) with
``queue.reserve_after_seconds`` = 1: a run that waited that long reserves the nodes it needs;
reserved nodes are kept from runs of equal or lower priority at promotion, submit and dry-run; the
reservation goes with the holder's promotion, cancel or queue timeout, and that same request (or
reaper pass) hands the freed nodes on."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.services.reaper import reap_pass
from app.store.queue import aged_queued_runs
from tests.support.actors import cap
from tests.support.agent import advertise, run_step
from tests.support.clock import has_waited
from tests.support.contracts import acquire_step, contract, role, single, wide
from tests.support.invariants import check
from tests.support.rows import events_like, leases_of, reservations, run_row, run_state
from tests.support.submitter import submit


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"queue.reserve_after_seconds": 1}


def two_busy_boards_and_a_reserving_wide_run(client, ctx, sql, **queue: Any) -> None:
    """Boards n1 (run a) and n2 (run b) busy; w needs both, has waited a second, and the
    reaper's pass has written its reservation of n1 and n2."""
    advertise(client, "n1", cap())
    advertise(client, "n2", cap())
    submit(client, single("a"), 201)
    submit(client, single("b"), 201)
    submit(client, wide("w", **queue), 202)
    assert reservations(sql) == {}
    has_waited(sql, "w", 1)
    reap_pass(ctx)
    assert reservations(sql) == {"n1": "w", "n2": "w"}


def test_a_run_that_waited_reserves_and_its_view_says_so(client, ctx, sql):
    two_busy_boards_and_a_reserving_wide_run(client, ctx, sql)

    assert events_like(sql, "w", "reserv%") == ["reserving: n1, n2"]
    view = client.get("/v1/runs/w").get_json()
    assert view["priority"] == 0
    assert view["reserving"] is True and view["reserved"] == ["n1", "n2"]
    # Its own reservation is not reserved against it.
    assert view["requires"][0]["candidates"]["reserved"] == 0
    assert view["requires"][0]["reserved_by"] == []

    submit(client, single("c"), 202)
    other = client.get("/v1/runs/c").get_json()
    assert other["reserving"] is False and "reserved" not in other
    line = other["requires"][0]
    assert line["candidates"] == {
        "live": 2,
        "busy": 2,
        "draining": 0,
        "quarantined": 0,
        "reserved": 2,
    }
    assert line["reserved_by"] == ["w"]
    assert check(sql) == []


def test_a_reserved_node_goes_to_a_higher_priority_run_never_to_an_equal_one(client, ctx, sql):
    two_busy_boards_and_a_reserving_wide_run(client, ctx, sql)
    submit(client, single("q-equal"), 202)
    submit(client, single("q-higher", priority=3), 202)

    # n1 frees: w still cannot start (n2 busy); the higher-priority run passes the reservation
    # in the cancel's own scan, the equal one does not.
    assert client.post("/v1/runs/a/cancel").status_code == 200
    assert run_state(sql, "q-higher") == "RUNNING" and leases_of(sql, "q-higher") == ["n1"]
    assert run_state(sql, "q-equal") == "QUEUED"
    assert reservations(sql) == {"n1": "w", "n2": "w"}  # kept: w's clock never restarts

    # n1 frees again and stays idle for w, at promotion and at submit alike.
    assert client.post("/v1/runs/q-higher/cancel").status_code == 200
    assert run_state(sql, "q-equal") == "QUEUED"
    assert submit(client, single("new-equal")).status_code == 202
    assert submit(client, single("new-lower", priority=-1)).status_code == 202
    resp = submit(client, single("new-higher", priority=1))
    assert resp.status_code == 201 and leases_of(sql, "new-higher") == ["n1"]

    # Dry-run assigns as if reserved nodes were free, and says which are reserved against it.
    assert client.post("/v1/runs/new-higher/cancel").status_code == 200
    dry = client.post("/v1/runs/dry-run", json=single("d")).get_json()
    assert dry["assigned"][0]["nodes"][0]["node"] == "n1"
    assert dry["warnings"] == ["node n1 is reserved by run w (priority 0)"]
    dry_high = client.post("/v1/runs/dry-run", json=single("d", priority=1)).get_json()
    assert dry_high["warnings"] == []
    assert check(sql) == []

    # n2 frees: w takes both, its reservation goes with its promotion.
    assert client.post("/v1/runs/b/cancel").status_code == 200
    assert run_state(sql, "w") == "RUNNING" and sorted(leases_of(sql, "w")) == ["n1", "n2"]
    assert reservations(sql) == {}
    assert events_like(sql, "w", "reserv%") == ["reserving: n1, n2", "reservation released"]
    assert check(sql) == []


def test_cancelling_a_holder_hands_its_free_node_on_in_the_same_request(client, ctx, sql):
    two_busy_boards_and_a_reserving_wide_run(client, ctx, sql)
    assert client.post("/v1/runs/a/cancel").status_code == 200  # n1 free, reserved for w
    submit(client, single("c"), 202)

    assert client.post("/v1/runs/w/cancel").status_code == 200

    assert reservations(sql) == {}
    assert run_state(sql, "c") == "RUNNING" and leases_of(sql, "c") == ["n1"]
    assert events_like(sql, "w", "reserv%") == ["reserving: n1, n2", "reservation released"]
    assert check(sql) == []


def test_a_queue_timeout_of_a_holder_hands_its_free_node_on_in_the_same_reaper_pass(
    client, ctx, sql
):
    two_busy_boards_and_a_reserving_wide_run(client, ctx, sql, timeout="3s")
    assert client.post("/v1/runs/a/cancel").status_code == 200
    submit(client, single("c"), 202)
    assert run_state(sql, "c") == "QUEUED"
    has_waited(sql, "w", 3)

    report = reap_pass(ctx)

    assert report.queue_timeouts == ["w"]
    assert run_state(sql, "w") == "FAILED"
    assert reservations(sql) == {}
    assert run_state(sql, "c") == "RUNNING" and leases_of(sql, "c") == ["n1"]
    assert check(sql) == []


def test_a_promoted_holder_hands_the_reserved_node_it_did_not_take_on_in_the_same_scan(
    client, ctx, sql
):
    # b1 (no attribute: first in candidate order) is draining when w reserves, so w reserves b2.
    advertise(client, "b1", cap(), policy={"drain": "graceful"})
    advertise(client, "b2", cap(slot="2"))
    advertise(client, "h1", cap("host"))
    submit(client, contract("x", role("host", "host")), 201)
    submit(client, contract("w", role("dut"), role("host", "host")), 202)
    has_waited(sql, "w", 1)
    reap_pass(ctx)
    assert reservations(sql) == {"b2": "w", "h1": "w"}
    submit(client, single("e", slot="2"), 202)  # b2 is reserved against it

    advertise(client, "b1", cap())  # the drain is lifted: w still waits for h1
    assert run_state(sql, "w") == "QUEUED" and run_state(sql, "e") == "QUEUED"

    # h1 frees: w takes b1 and h1; b2, which it held but did not take, goes on to e in the same
    # request.
    assert client.post("/v1/runs/x/cancel").status_code == 200
    assert run_state(sql, "w") == "RUNNING" and sorted(leases_of(sql, "w")) == ["b1", "h1"]
    assert run_state(sql, "e") == "RUNNING" and leases_of(sql, "e") == ["b2"]
    assert reservations(sql) == {}
    assert check(sql) == []


def test_the_reapers_next_pass_writes_the_reservation_of_a_run_that_crossed_the_age(
    client, ctx, sql
):
    advertise(client, "n1", cap())
    submit(client, single("a"), 201)
    submit(client, single("w"), 202)
    first = reap_pass(ctx)
    assert not first.woke and reservations(sql) == {}

    has_waited(sql, "w", 1)  # nothing frees meanwhile
    crossed = reap_pass(ctx)

    assert crossed.woke
    assert reservations(sql) == {"n1": "w"}
    assert events_like(sql, "w", "reserv%") == ["reserving: n1"]
    # Time passing is not a timer: the next pass, with nothing crossed since, does not scan.
    assert not reap_pass(ctx).woke
    # The reservation holds n1 for w when a then ends, also against a newcomer.
    assert client.post("/v1/runs/a/cancel").status_code == 200
    assert run_state(sql, "w") == "RUNNING"


def acquiring(run_id: str, priority: int = 0) -> dict[str, Any]:
    """A host run whose second step grabs one more board (docs/contract.md#acquire)."""
    doc = contract(
        run_id,
        role("host", "host"),
        steps=[
            {"id": "prep", "uses": "host", "run": ["prep"]},
            acquire_step("grab", "extra", "board", "measure", "fallback"),
            {"id": "measure", "uses": "extra", "run": ["measure"]},
            {"id": "fallback", "uses": "host", "run": ["fallback"], "needs": ["grab"]},
        ],
    )
    if priority:
        doc["queue"] = {"priority": priority}
    return doc


@pytest.mark.parametrize(("priority", "got"), [(0, "unavailable"), (1, "acquired")])
def test_acquire_honours_a_reservation_like_a_submit(client, ctx, sql, priority, got):
    advertise(client, "n1", cap())
    advertise(client, "n2", cap())
    advertise(client, "h1", cap("host"))
    submit(client, single("a"), 201)
    submit(client, wide("w"), 202)
    has_waited(sql, "w", 1)
    reap_pass(ctx)
    assert reservations(sql) == {"n1": "w", "n2": "w"}  # n2 is free, held for w

    submit(client, acquiring("r", priority), 201)
    run_step(client, "h1", "r", 1)

    blob = client.get("/v1/runs/r/blob/grab")
    assert blob.status_code == 200
    assert json.loads(blob.data)["state"] == got
    assert leases_of(sql, "r") == (["h1"] if got == "unavailable" else ["h1", "n2"])
    assert check(sql) == []


def test_the_reservation_step_reads_a_shape_only_as_far_as_its_candidates_allow(client, ctx, sql):
    """Eight aged single-board runs wait for two busy boards: each scan's reservation step reads
    only the first runs of the shape (its holders, one run per candidate and one more), and the
    reservations are those of reading every run: the first two in queue order."""
    advertise(client, "n1", cap())
    advertise(client, "n2", cap())
    submit(client, single("a"), 201)
    submit(client, single("b"), 201)
    waiting = [f"q{i}" for i in range(1, 9)]
    for run_id in waiting:
        submit(client, single(run_id), 202)
    has_waited(sql, waiting[-1], 1)
    key = run_row(sql, "q1")["requires_key"]
    with ctx.db.read() as s:
        assert [r.run_id for r in aged_queued_runs(s, 1, {key: 3})] == ["q1", "q2", "q3"]
        assert [r.run_id for r in aged_queued_runs(s, 1, {key: 100})] == waiting
        assert aged_queued_runs(s, 1, {"another shape": 5}) == []

    reap_pass(ctx)

    assert reservations(sql) == {"n1": "q1", "n2": "q2"}
    # The next scan keeps them (holders count towards what it reads) and adds nothing.
    assert client.post("/v1/runs/q8/cancel").status_code == 200
    assert reservations(sql) == {"n1": "q1", "n2": "q2"}
    # A board frees: its holder takes it and its reservation goes with the promotion; the next
    # run of the shape reserves at the next scan (the reservation step runs first in a scan),
    # here the one after a cancel of a waiting run.
    assert client.post("/v1/runs/a/cancel").status_code == 200
    assert run_state(sql, "q1") == "RUNNING" and leases_of(sql, "q1") == ["n1"]
    assert reservations(sql) == {"n2": "q2"}
    assert client.post("/v1/runs/q7/cancel").status_code == 200
    assert reservations(sql) == {"n1": "q3", "n2": "q2"}
    assert check(sql) == []
