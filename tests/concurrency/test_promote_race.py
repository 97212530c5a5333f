"""Promotion (docs/design.md#promotion): two scans that see the same QUEUED run — the second waits
on the row lock, re-checks ``state = 'QUEUED'`` after the first commits and gets 0 rows. Exactly one
promotion, exactly its leases, one event."""

from __future__ import annotations

from app.services.queue import Outcome, promote
from app.store.nodes import live_adverts, unavailable_node_ids
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.concurrency import apps_on, connect, queued_run, race, waiting_lock_held
from tests.support.contracts import contract
from tests.support.submitter import submit

ROUNDS = 20


def _snapshot(ctx):
    with ctx.db.read() as s:
        return live_adverts(s), unavailable_node_ids(s)


def test_two_concurrent_promotions_of_one_queued_run_promote_it_exactly_once(
    fresh_db_url, tmp_path
):
    with apps_on(fresh_db_url, tmp_path / "records", 2) as apps, connect(fresh_db_url) as sql:
        c = apps.client(0)
        advertise(c, "n1", cap("board"))
        for i in range(ROUNDS):
            holder, waiter = f"holder-{i}", f"waiter-{i}"
            with waiting_lock_held(sql):
                # Every wake skips while we hold the gate's waiting lock: the cancel frees n1
                # and leaves waiter-i QUEUED next to it, for the two promotions below.
                assert submit(c, contract(holder), 201).get_json()["state"] == "RUNNING"
                doc = contract(
                    waiter,
                    steps=[
                        {"id": "one", "uses": "dut", "run": ["true"]},
                        {"id": "two", "uses": "dut", "run": ["true"]},
                    ],
                )
                assert submit(c, doc, 202).get_json()["state"] == "QUEUED"
                assert c.post(f"/v1/runs/{holder}/cancel").status_code == 200
            run = queued_run(sql, waiter)
            snaps = [_snapshot(apps.ctx(k)) for k in (0, 1)]
            results = race(
                *(
                    (lambda k=k: promote(apps.ctx(k), run, snaps[k][0], set(snaps[k][1]), "race"))
                    for k in (0, 1)
                )
            )
            outcomes = sorted(o.value for o, *_ in results)
            assert outcomes == sorted([Outcome.PROMOTED.value, Outcome.NOT_QUEUED.value]), results
            winner_nodes = [nodes for o, nodes, *_ in results if o is Outcome.PROMOTED][0]
            assert winner_nodes == ["n1"]
            assert sql.execute(
                "select state from runs where run_id = %s", (waiter,)
            ).fetchone() == ("RUNNING",)
            assert sql.execute("select node_id, run_id from leases").fetchall() == [("n1", waiter)]
            assert sql.execute(
                "select count(*) from run_events where run_id = %s and cause like 'promoted:%%'",
                (waiter,),
            ).fetchone() == (1,)
            # Its steps exist once each, bound to the node once.
            assert sql.execute(
                "select seq, state, node_id from steps where run_id = %s order by seq", (waiter,)
            ).fetchall() == [(1, "PENDING", "n1"), (2, "PENDING", "n1")]
            assert c.post(f"/v1/runs/{waiter}/cancel").status_code == 200
        assert sql.execute("select count(*) from leases").fetchone() == (0,)
