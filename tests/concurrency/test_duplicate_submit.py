"""The run_id is the idempotency key (docs/contract.md#top-level,
docs/design.md#submit-and-dry-run). Submits of one run_id at the same moment make one run row (the
``runs`` primary key decides), one Record, and every request is answered with the same run — the
winner 201/202, the others 200 — never a 500."""

from __future__ import annotations

import json

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.concurrency import apps_on, connect, race
from tests.support.contracts import slotted_two_steps
from tests.support.submitter import submit

ROUNDS = 10
SENDERS = 4  # two per app: two threads of each of two worker processes


def _send_together(apps, doc):
    clients = [apps.client(k % 2) for k in range(SENDERS)]
    return race(*((lambda c=c: c.post("/v1/runs", json=doc)) for c in clients))


def _assert_one_run(sql, records, run_id, state):
    assert sql.execute("select state from runs where run_id = %s", (run_id,)).fetchall() == [
        (state,)
    ]
    assert sql.execute(
        "select count(*) from run_events where run_id = %s and cause = 'submit'", (run_id,)
    ).fetchone() == (1,)
    assert sql.execute(
        "select seq, step_id from steps where run_id = %s order by seq", (run_id,)
    ).fetchall() == [(1, "flash"), (2, "boot")]
    manifest = json.loads((records / run_id / "manifest.json").read_text())
    assert manifest["run_id"] == run_id and manifest["state"] == state


def test_simultaneous_submits_of_one_run_id_placed_make_one_run_and_one_record(
    fresh_db_url, tmp_path
):
    records = tmp_path / "records"
    with apps_on(fresh_db_url, records, 2) as apps, connect(fresh_db_url) as sql:
        admin = apps.client(0)
        advertise(admin, "n1", cap("board", slot="s"))
        for i in range(ROUNDS):
            run_id = f"placed-{i}"
            resps = _send_together(apps, slotted_two_steps(run_id))
            answers = [(r.status_code, r.get_json()) for r in resps]
            assert sorted(code for code, _ in answers) == [200] * (SENDERS - 1) + [201], answers
            assert {(body["run_id"], body["state"]) for _, body in answers} == {(run_id, "RUNNING")}
            _assert_one_run(sql, records, run_id, "RUNNING")
            assert sql.execute("select node_id, run_id from leases").fetchall() == [("n1", run_id)]
            assert admin.post(f"/v1/runs/{run_id}/cancel").status_code == 200
        # One Record directory per run id, nothing else under the root.
        assert sorted(p.name for p in records.iterdir()) == sorted(
            f"placed-{i}" for i in range(ROUNDS)
        )


def test_simultaneous_submits_of_one_run_id_queued_make_one_run_and_one_record(
    fresh_db_url, tmp_path
):
    records = tmp_path / "records"
    with apps_on(fresh_db_url, records, 2) as apps, connect(fresh_db_url) as sql:
        admin = apps.client(0)
        advertise(admin, "n1", cap("board", slot="s"))
        submit(admin, slotted_two_steps("holder"), 201)
        for i in range(ROUNDS):
            run_id = f"queued-{i}"
            resps = _send_together(apps, slotted_two_steps(run_id))
            answers = [(r.status_code, r.get_json()) for r in resps]
            assert sorted(code for code, _ in answers) == [200] * (SENDERS - 1) + [202], answers
            assert {(body["run_id"], body["state"]) for _, body in answers} == {(run_id, "QUEUED")}
            _assert_one_run(sql, records, run_id, "QUEUED")
        assert sql.execute("select node_id, run_id from leases").fetchall() == [("n1", "holder")]
        assert sorted(p.name for p in records.iterdir()) == sorted(
            ["holder"] + [f"queued-{i}" for i in range(ROUNDS)]
        )


def test_simultaneous_submits_of_one_rejected_run_id_store_one_failed_run_and_no_record(
    fresh_db_url, tmp_path
):
    records = tmp_path / "records"
    with apps_on(fresh_db_url, records, 2) as apps, connect(fresh_db_url) as sql:
        advertise(apps.client(0), "n1", cap("board", slot="other"))
        resps = _send_together(apps, slotted_two_steps("never-fits"))
        answers = sorted((r.status_code, r.get_json()) for r in resps)
        assert [code for code, _ in answers] == [200] * (SENDERS - 1) + [422], answers
        assert answers[-1][1] == {
            "error": {"code": 422, "reason": "need 1, fleet has 0 - board slot=s"}
        }
        assert {body["state"] for code, body in answers if code == 200} == {"FAILED"}
        assert sql.execute(
            "select state, reject->>'Code' from runs where run_id = 'never-fits'"
        ).fetchall() == [("FAILED", "422")]
        assert not records.exists() or list(records.iterdir()) == []
