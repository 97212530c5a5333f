"""Two submits racing for one free node (docs/design.md#transactions-conflicts-and-retries,
docs/design.md#submit-and-dry-run). ``leases.node_id`` is the primary key: never two leases on a
node. The loser of the insert (``IntegrityError`` on ``pk_leases`` -> ``NodeTaken``) rolls its whole
transaction back and is then queued (202) like any QUEUED run: its steps exist exactly once,
PENDING, bound to no node, and it holds nothing."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

from app.models import LEASES_PKEY
from app.store import constraint_name
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.concurrency import apps_on, connect, race
from tests.support.contracts import slotted_two_steps
from tests.support.submitter import submit

ROUNDS = 20


def test_two_submits_racing_for_one_node_place_one_and_queue_the_other_whole(
    fresh_db_url, tmp_path
):
    with apps_on(fresh_db_url, tmp_path / "records", 2) as apps, connect(fresh_db_url) as sql:
        admin = apps.client(0)
        for i in range(ROUNDS):
            advertise(admin, f"n{i:02d}", cap("board", slot=f"s{i}"))
        # The lease-key conflicts the database reported to either app (the NodeTaken path).
        conflicts: list[str] = []

        def on_error(context: Any) -> None:
            if constraint_name(context.sqlalchemy_exception) == LEASES_PKEY:
                conflicts.append(context.statement)

        for i in range(2):
            event.listen(apps.ctx(i).db.engine, "handle_error", on_error)
        for i in range(ROUNDS):
            node, slot = f"n{i:02d}", f"s{i}"
            ids = (f"left-{i}", f"right-{i}")
            clients = (apps.client(0), apps.client(1))
            resps = race(
                *(
                    (lambda k=k: clients[k].post("/v1/runs", json=slotted_two_steps(ids[k], slot)))
                    for k in (0, 1)
                )
            )
            codes = sorted(r.status_code for r in resps)
            assert codes == [201, 202], [(r.status_code, r.get_json()) for r in resps]
            by_code = {r.status_code: r.get_json() for r in resps}
            winner, loser = by_code[201]["run_id"], by_code[202]["run_id"]
            assert by_code[201]["state"] == "RUNNING" and by_code[202]["state"] == "QUEUED"
            assert sql.execute(
                "select run_id, state from runs where run_id = any(%s) order by state",
                (list(ids),),
            ).fetchall() == [(loser, "QUEUED"), (winner, "RUNNING")]
            # Never both holding it: one lease row on the node, the winner's.
            assert sql.execute(
                "select node_id, run_id from leases where node_id = %s or run_id = any(%s)",
                (node, list(ids)),
            ).fetchall() == [(node, winner)]
            # The loser's steps exist exactly once each, as for any QUEUED run.
            assert sql.execute(
                "select seq, step_id, state, node_id from steps where run_id = %s order by seq",
                (loser,),
            ).fetchall() == [(1, "flash", "PENDING", None), (2, "boot", "PENDING", None)]
            assert sql.execute(
                "select seq, state, node_id from steps where run_id = %s order by seq", (winner,)
            ).fetchall() == [(1, "PENDING", node), (2, "PENDING", node)]
            assert sql.execute(
                "select from_state, to_state, cause from run_events where run_id = %s", (loser,)
            ).fetchall() == [(None, "QUEUED", "submit")]
        assert sql.execute("select count(*) from leases").fetchone() == (ROUNDS,)
        # The rounds are racy by nature; with both threads released at a Barrier the lease-key
        # conflict path is taken in many of them. At least one round must have exercised it, or
        # this test did not test what it says.
        assert len(conflicts) >= 1


def test_a_queued_loser_of_a_node_race_is_promoted_when_the_winner_is_cancelled(
    fresh_db_url, tmp_path
):
    with apps_on(fresh_db_url, tmp_path / "records", 2) as apps, connect(fresh_db_url) as sql:
        admin = apps.client(0)
        advertise(admin, "n1", cap("board", slot="s"))
        clients = (apps.client(0), apps.client(1))
        resps = race(
            *(
                (lambda k=k: clients[k].post("/v1/runs", json=slotted_two_steps(f"r{k}", "s")))
                for k in (0, 1)
            )
        )
        by_code = {r.status_code: r.get_json()["run_id"] for r in resps}
        assert sorted(by_code) == [201, 202]
        assert admin.post(f"/v1/runs/{by_code[201]}/cancel").get_json()["state"] == "FAILED"
        assert submit(admin, slotted_two_steps("probe", "s"), 202)  # the loser now holds n1
        assert sql.execute("select node_id, run_id from leases").fetchall() == [
            ("n1", by_code[202])
        ]
        assert sql.execute(
            "select seq, state, node_id from steps where run_id = %s order by seq", (by_code[202],)
        ).fetchall() == [(1, "PENDING", "n1"), (2, "PENDING", "n1")]
