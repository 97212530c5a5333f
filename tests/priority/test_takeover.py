"""Takeover (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits): a high-priority
wide run is never starved behind a lower-priority reservation while narrow runs of a middle priority
keep every board busy.

Four boards; ``low`` (priority 0, two boards) has waited ``queue.reserve_after_seconds`` and holds
a reservation; a feeder keeps single-board runs of priority 5 on every board (each result submits
the next one; priority 5 passes the priority-0 reservation); then ``top`` (priority 10, all four
boards) arrives. A priority-5 run placed after it overtakes it, so it reserves at once, taking
over ``low``'s nodes. Its bound
(docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits, counted in results rather
than seconds, since every result wakes the queue): one result places the run that overtakes it, the
next one's scan writes its reservation (D), and each board then finishes the one run it had (T): at
most 2 + BOARDS results after its submit.

The scenario repeats ``STARVATION_REPEAT`` times (3 in CI; ``STARVATION_REPEAT=20`` is the long
mode of tests/README.md), each on a database of its own.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from app import create_app
from tests.support.actors import cap
from tests.support.agent import advertise, done
from tests.support.apps import client_of, make_config
from tests.support.clock import has_waited
from tests.support.concurrency import connect
from tests.support.contracts import single, wide
from tests.support.invariants import check
from tests.support.rows import reservations, run_state
from tests.support.submitter import submit

BOARDS = 4
RESERVE_AFTER = 1
BOUND = 2 + BOARDS  # results after top's submit (see the module docstring)
REPEAT = int(os.environ.get("STARVATION_REPEAT", "3"))


class Fleet:
    """Four board agents driven in turn by the test: each turn, the board whose run was placed
    first reports its step done, and the feeder submits the next priority-5 single run."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.fed = 0
        self.order: list[str] = []  # boards in the order their current run was placed
        self.pending: dict[str, Any] = {}  # board -> the step it claimed and has not reported

    def feed(self) -> None:
        self.fed += 1
        submit(self.client, single(f"s{self.fed}", priority=5))

    def turn(self) -> str:
        """The oldest busy board reports its run's step done; returns that run."""
        for node in list(self.order):
            step = self.pending.pop(node, None)
            if step is None:
                continue
            self.order.remove(node)
            done(self.client, step["run_id"], step["seq"], node)
            return step["run_id"]
        raise AssertionError("no board has a step to report")

    def claim_all(self) -> None:
        for i in range(1, BOARDS + 1):
            node = f"b{i}"
            if node in self.pending:
                continue
            resp = self.client.post(
                f"/v1/nodes/{node}/claim?wait=0", headers={"X-Enode-Instance": node}
            )
            if resp.status_code == 200:
                self.pending[node] = resp.get_json()
                self.order.append(node)


@pytest.mark.parametrize("attempt", range(REPEAT))
def test_a_top_priority_wide_run_takes_over_a_low_reservation_and_starts_within_its_bound(
    fresh_db_url, tmp_path, attempt
):
    app = create_app(
        make_config(
            fresh_db_url,
            tmp_path / "records",
            **{"queue.reserve_after_seconds": RESERVE_AFTER, "lease.not_after_factor": 100},
        )
    )
    try:
        client = client_of(app)
        fleet = Fleet(client)
        with connect(fresh_db_url) as sql:
            for i in range(1, BOARDS + 1):
                advertise(client, f"b{i}", cap())
            for _ in range(BOARDS):
                fleet.feed()
            fleet.claim_all()
            submit(client, wide("low", count=2), 202)
            fleet.feed()  # one queued behind, so every freed board has a taker
            has_waited(sql, "low", RESERVE_AFTER)
            # A result's scan writes low's reservation; priority 5 passes it.
            for _ in range(2):
                fleet.turn()
                fleet.feed()
                fleet.claim_all()
            assert set(reservations(sql).values()) == {"low"}
            assert run_state(sql, "low") == "QUEUED"

            submit(client, wide("top", count=BOARDS, priority=10), 202)
            results = 0
            while run_state(sql, "top") == "QUEUED":
                assert results < BOUND, (results, reservations(sql))
                fleet.turn()
                results += 1
                fleet.feed()
                fleet.claim_all()
                assert check(sql) == []
            assert run_state(sql, "top") == "RUNNING"
            assert results <= BOUND
            # low's reservation was taken over, not lost for good: it is reserving again.
            assert run_state(sql, "low") == "QUEUED"
            assert check(sql) == []
    finally:
        app.extensions["mediator"].close()
