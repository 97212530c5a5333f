"""A team's max_nodes under a storm (docs/teams.md, "Quotas"): two apps (two worker processes'
pools and scan gates) on one database, threads submitting, cancelling and acquiring for a team
with a quota and one without. The quota'd team's leases, sampled from the table throughout, never
exceed max_nodes; once quiet, no queued run fits a free node within its team's quota (work
conservation), every invariant holds, and no deadlock happened."""

from __future__ import annotations

import itertools
import threading

import pytest

from app.services.reaper import reap_pass
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import client_of
from tests.support.concurrency import JOIN_TIMEOUT, apps_on, connect, deadlocks, race
from tests.support.contracts import contract, probing_run, role
from tests.support.invariants import check_settled

MAX_NODES = 2
TEAMS = [{"name": "capped", "max_nodes": MAX_NODES}, {"name": "kernel"}]
BOARDS = 5
ROUNDS = 12  # per thread: a bound by count, not by time


@pytest.mark.parametrize(
    "reserve_after",
    [
        0,  # no reservations
        # Reservations on: the quota'd team's runs have the higher priority, so a placement of
        # the other team overtakes them and they reserve at once (docs/priorities.md), unless
        # quota-blocked.
        3600,
    ],
)
def test_a_team_never_holds_more_than_max_nodes_under_a_storm_of_two_apps(
    fresh_db_url, tmp_path, reserve_after
):
    keys = {"teams": TEAMS, "queue.reserve_after_seconds": reserve_after}
    with apps_on(fresh_db_url, tmp_path / "r", n=2, **keys) as apps, connect(fresh_db_url) as sql:
        admin = apps.client(0)
        for i in range(BOARDS):
            advertise(admin, f"b{i}", cap("board"))
        advertise(admin, "s1", cap("scope"))
        advertise(admin, "s2", cap("scope"))

        stop = threading.Event()
        seen: list[int] = []

        def sample() -> None:
            with connect(fresh_db_url) as probe:
                while not stop.is_set():
                    (n,) = probe.execute(
                        "select count(*) from leases where team = 'capped'"
                    ).fetchone()
                    seen.append(n)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        ids = itertools.count()

        def worker(w: int) -> None:
            client = client_of(apps[w % 2])
            mine: list[str] = []
            for k in range(ROUNDS):
                team = "capped" if (w + k) % 3 else "kernel"
                run_id = f"w{w}-{next(ids)}"
                priority = 5 if team == "capped" else 0
                doc = (
                    probing_run(run_id, queue={"team": team, "priority": priority})
                    if k % 4 == 0
                    else contract(run_id, role("dut"), queue={"team": team, "priority": priority})
                )
                resp = client.post("/v1/runs", json=doc)
                assert resp.status_code in (201, 202), resp.get_json()
                mine.append(run_id)
                if k % 2:
                    gone = mine.pop(0)
                    resp = client.post(f"/v1/runs/{gone}/cancel", json={})
                    assert resp.status_code == 200, resp.get_json()

        try:
            race(*(lambda w=w: worker(w) for w in range(4)), timeout=JOIN_TIMEOUT * 4)
        finally:
            stop.set()
            sampler.join(JOIN_TIMEOUT)
        reap_pass(apps.ctx(0))
        reap_pass(apps.ctx(1))
        assert seen and max(seen) <= MAX_NODES, max(seen)
        # The cap was reached, so it was what held runs back.
        assert max(seen) == MAX_NODES
        assert check_settled(sql, max_nodes={"capped": MAX_NODES}) == []
        (held,) = sql.execute("select count(*) from leases where team = 'capped'").fetchone()
        assert held <= MAX_NODES
    assert deadlocks(fresh_db_url) == 0
