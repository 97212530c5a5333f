"""A run reserves at once, long before ``queue.reserve_after_seconds`` (the default 900 here), when
a run of lower priority is placed on a node that could fill one of its roles while it waits
(docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits): a high-priority wide run is
not starved by low-priority narrow ones."""

from __future__ import annotations

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.contracts import single, wide
from tests.support.invariants import check
from tests.support.rows import events_like, leases_of, reservations, run_state
from tests.support.submitter import submit


def test_a_lower_priority_placement_makes_a_waiting_higher_priority_run_reserve_at_once(
    client, sql
):
    advertise(client, "n1", cap())
    advertise(client, "n2", cap())
    submit(client, single("a"), 201)
    submit(client, single("b"), 201)
    submit(client, single("low", priority=-1), 202)
    submit(client, wide("w", priority=5), 202)
    assert reservations(sql) == {}  # a and b were placed before w queued

    # n1 frees: w cannot start (n2 busy), the low-priority run takes n1 while w waits.
    assert client.post("/v1/runs/a/cancel").status_code == 200
    assert run_state(sql, "low") == "RUNNING"

    # The next scan (this submit's) sees it: w reserves both boards, busy as they are.
    submit(client, single("c"), 202)
    assert reservations(sql) == {"n1": "w", "n2": "w"}
    assert events_like(sql, "w", "reserv%") == ["reserving: n1, n2"]
    assert client.get("/v1/runs/w").get_json()["reserving"] is True

    # n2 frees and stays idle for w; n1 frees and w starts on both.
    assert client.post("/v1/runs/b/cancel").status_code == 200
    assert run_state(sql, "c") == "QUEUED" and run_state(sql, "w") == "QUEUED"
    assert client.post("/v1/runs/low/cancel").status_code == 200
    assert run_state(sql, "w") == "RUNNING" and sorted(leases_of(sql, "w")) == ["n1", "n2"]
    assert reservations(sql) == {}
    assert check(sql) == []


def test_no_reservation_without_a_reserving_run(client, sql):
    advertise(client, "n1", cap())
    advertise(client, "n2", cap())
    submit(client, single("a"), 201)
    submit(client, wide("w"), 202)  # equal priority, young
    submit(client, single("b"), 201)  # placed after w queued, but not of lower priority
    submit(client, single("c"), 202)

    assert reservations(sql) == {}
    assert client.get("/v1/runs/w").get_json()["reserving"] is False
