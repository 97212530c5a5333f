"""Seeded random schedules of the queue with priorities and reservations
(docs/queue.md#promotion-the-request-that-frees-a-node-promotes,
docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits), checked by
:mod:`tests.support.invariants` after every operation: submits of several shapes and priorities,
results, cancels, drains and their lifting, node loss and return, reaper passes and time passing
(the queued runs' arrival moved back past ``queue.reserve_after_seconds``).

Every request here runs its own wake scan before it answers, so the system is quiet between two
operations, and after each one: no node leased twice, no node leased while reserved against the
run that took it (:func:`check`), and no QUEUED run that fits live, free, non-draining nodes not
reserved against it (:func:`check_quiet`). At the end the submits stop, every node comes back and
the runs are worked off: every queued run, reserving ones included, must start within a bounded
number of results (the runs there are, plus one per board), which is the count form of the bound of
docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits.

``INTERLEAVING_SCHEDULES`` schedules (12 by default, the CI size; tests/README.md) of
``INTERLEAVING_OPERATIONS`` operations each (40); ``INTERLEAVING_SEED`` replays one schedule.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from app.services.reaper import reap_pass
from tests.support.actors import Submitter, cap
from tests.support.agent import advertise, claim, done
from tests.support.apps import app_on, client_of
from tests.support.concurrency import connect
from tests.support.contracts import contract, role
from tests.support.invariants import check, check_quiet
from tests.support.submitter import submit

SCHEDULES = int(os.environ.get("INTERLEAVING_SCHEDULES", "12"))
OPERATIONS = int(os.environ.get("INTERLEAVING_OPERATIONS", "40"))
SEEDS = (
    [int(os.environ["INTERLEAVING_SEED"])]
    if "INTERLEAVING_SEED" in os.environ
    else [1000 + i for i in range(SCHEDULES)]
)
RESERVE_AFTER = 60
NODES = {
    "b1": cap("board"),
    "b2": cap("board"),
    "b3": cap("board", slot="x"),
    "b4": cap("board", slot="x"),
    "s1": cap("scope"),
}
SHAPES = [
    [role("dut")],
    [role("duts", count=2)],
    [role("dut", slot="x")],
    [role("duts", count=3)],
    [role("dut"), role("m", "scope")],
]
PRIORITIES = [-5, 0, 0, 5, 10]


class Schedule:
    def __init__(self, client: Any, ctx: Any, sql: Any, seed: int) -> None:
        self.client, self.ctx, self.sql = client, ctx, sql
        self.rnd = random.Random(seed)
        self.n = 0
        self.lost: set[str] = set()
        self.drained: set[str] = set()
        self.log: list[str] = []

    def advert(self, node: str, drain: str = "") -> None:
        advertise(self.client, node, NODES[node], policy={"drain": drain})

    def alive(self, *states: str) -> list[str]:
        return [
            r[0]
            for r in self.sql.execute(
                "select run_id from runs where state = any(%s) order by run_id", (list(states),)
            )
        ]

    def submit(self) -> None:
        self.n += 1
        roles = self.rnd.choice(SHAPES)
        priority = self.rnd.choice(PRIORITIES)
        doc = contract(f"r{self.n}", *roles)
        if priority:
            doc["queue"] = {"priority": priority}
        resp = submit(self.client, doc)
        assert resp.status_code in (201, 202, 422), resp.get_json()
        self.log.append(f"submit r{self.n} p{priority} -> {resp.status_code}")

    def result(self) -> bool:
        nodes = [n for n in NODES if n not in self.lost]
        self.rnd.shuffle(nodes)
        for node in nodes:
            resp = claim(self.client, node, node)
            if resp.status_code == 200:
                step = resp.get_json()
                done(self.client, step["run_id"], step["seq"], node)
                self.log.append(f"result {step['run_id']} on {node}")
                return True
        return False

    def cancel(self) -> None:
        runs = self.alive("QUEUED", "RUNNING")
        if runs:
            run = self.rnd.choice(runs)
            assert Submitter(self.client).cancel(run).status_code == 200
            self.log.append(f"cancel {run}")

    def drain(self) -> None:
        node = self.rnd.choice(sorted(set(NODES) - self.lost))
        if node in self.drained:
            self.drained.discard(node)
            self.advert(node)
        else:
            self.drained.add(node)
            self.advert(node, "graceful")
        self.log.append(f"drain toggled on {node}")

    def lose(self) -> None:
        if self.lost and self.rnd.random() < 0.5:
            node = self.rnd.choice(sorted(self.lost))
            self.lost.discard(node)
            self.drained.discard(node)
            self.advert(node)
            self.log.append(f"{node} back")
            return
        node = self.rnd.choice(sorted(set(NODES) - self.lost))
        self.lost.add(node)
        # The node went silent: its advert and its lease run out; the reaper reaps them.
        self.sql.execute(
            "update nodes set expires_at = now() - interval '1 s' where node_id = %s", (node,)
        )
        self.sql.execute(
            "update leases set not_after = now() - interval '1 s' where node_id = %s", (node,)
        )
        reap_pass(self.ctx)
        self.log.append(f"{node} lost")

    def age(self) -> None:
        # Time passes for the waiting runs and the placements made while they waited alike.
        shift = f"{RESERVE_AFTER + 1} seconds"
        self.sql.execute(
            "update runs set created_at = created_at - %s::interval where state = 'QUEUED'",
            (shift,),
        )
        self.sql.execute("update placements set last_at = last_at - %s::interval", (shift,))
        reap_pass(self.ctx)
        self.log.append("time passes")

    def step(self) -> None:
        op = self.rnd.choices(
            [self.submit, self.result, self.cancel, self.drain, self.lose, self.age, self.reap],
            weights=[8, 8, 2, 1, 1, 1, 1],
        )[0]
        op()

    def reap(self) -> None:
        reap_pass(self.ctx)
        self.log.append("reaper pass")

    def checked(self) -> None:
        found = check(self.sql) + check_quiet(self.sql)
        assert found == [], "\n".join(found + ["after:", *self.log[-8:]])


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_schedule_keeps_every_queue_invariant(fresh_db_url, tmp_path, seed):
    keys = {"queue.reserve_after_seconds": RESERVE_AFTER, "lease.not_after_factor": 1000}
    with app_on(fresh_db_url, tmp_path / "r", **keys) as app, connect(fresh_db_url) as sql:
        sched = Schedule(client_of(app), app.extensions["mediator"], sql, seed)
        for node in NODES:
            sched.advert(node)
        for _ in range(OPERATIONS):
            sched.step()
            sched.checked()
        # Quiesce: no more submits, every node back and undrained; then work the runs off.
        for node in NODES:
            sched.advert(node)
        sched.lost.clear()
        reap_pass(sched.ctx)
        sched.checked()
        bound = len(sched.alive("QUEUED", "RUNNING")) + len(NODES)
        results = 0
        while sched.alive("QUEUED"):
            assert results <= bound, (sched.alive("QUEUED"), sched.log[-8:])
            if not sched.result():
                reap_pass(sched.ctx)  # nothing claimable: let the reaper settle what is left
            results += 1
            sched.checked()
