"""The run views (docs/api.md#readers): GET /v1/runs with its filters, limit and cursor, and GET
/v1/runs/{id} of a RUNNING run. Creation times are set with SQL on the database's own column, so
the order under test never depends on how fast the requests ran."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.contracts import contract, role
from tests.support.submitter import submit


def rejected(client: Any, run_id: str, **top: Any) -> None:
    """A run born FAILED (no node in the fleet): the cheapest row a submit makes."""
    resp = client.post("/v1/runs", json=contract(run_id, role("gpu", "gpu"), **top))
    assert resp.status_code == 422


def created(sql: Any, run_id: str, at: str) -> None:
    sql.execute("update runs set created_at = %s::timestamptz where run_id = %s", (at, run_id))


def bulk(sql: Any, n: int) -> None:
    """``n`` FAILED runs, bulk-0001 (oldest) .. bulk-n (newest), one second apart."""
    sql.execute(
        "insert into runs (run_id, state, contract, requires, requires_key, created_at)"
        " select 'bulk-' || lpad(g::text, 4, '0'), 'FAILED', '{}', '[]', 'k',"
        " timestamptz '2030-01-01 00:00:00+00' + g * interval '1 second'"
        " from generate_series(1, %s) g",
        (n,),
    )


def ids(resp: Any) -> list[str]:
    assert resp.status_code == 200, resp.get_json()
    return [r["run_id"] for r in resp.get_json()["runs"]]


def three_days(client: Any, sql: Any) -> None:
    """day-1, day-2, day-3 created at midnight UTC of 2030-01-01, -02, -03; submitted out of
    order."""
    for run_id in ("day-2", "day-3", "day-1"):
        rejected(client, run_id)
    created(sql, "day-1", "2030-01-01T00:00:00Z")
    created(sql, "day-2", "2030-01-02T00:00:00Z")
    created(sql, "day-3", "2030-01-03T00:00:00Z")


def bad_request(resp: Any, field: str) -> None:
    assert resp.status_code == 400, resp.get_json()
    body = resp.get_json()
    assert set(body) == {"error"} and body["error"]["code"] == 400
    assert field in body["error"]["reason"]


# ---------------------------------------------------------------- order and observed_at


def test_runs_are_listed_newest_first(client, sql):
    three_days(client, sql)

    assert ids(client.get("/v1/runs")) == ["day-3", "day-2", "day-1"]


def test_the_list_says_when_it_was_observed_by_the_database_clock(client, sql):
    rejected(client, "r1")

    body = client.get("/v1/runs").get_json()

    assert body["observed_at"].endswith("Z")
    at = datetime.fromisoformat(body["observed_at"].replace("Z", "+00:00"))
    now = sql.execute("select now()").fetchone()[0]
    assert abs(at - now) < timedelta(seconds=30)
    assert [(r["run_id"], r["state"]) for r in body["runs"]] == [("r1", "FAILED")]
    assert body["runs"][0]["created_at"].endswith("Z")


def test_an_empty_list_is_200_with_no_runs(client):
    body = client.get("/v1/runs").get_json()

    assert body["runs"] == [] and "observed_at" in body


# ---------------------------------------------------------------- filters


def test_the_state_filter_is_exact(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("running"), 201)
    submit(client, contract("queued"), 202)
    rejected(client, "failed")

    assert ids(client.get("/v1/runs?state=QUEUED")) == ["queued"]
    assert ids(client.get("/v1/runs?state=RUNNING")) == ["running"]
    assert ids(client.get("/v1/runs?state=FAILED")) == ["failed"]
    assert ids(client.get("/v1/runs?state=SUCCEEDED")) == []


def test_a_state_that_is_no_run_state_is_200_with_no_runs(client):
    rejected(client, "r1")

    resp = client.get("/v1/runs?state=BOGUS")

    assert resp.status_code == 200 and resp.get_json()["runs"] == []


@pytest.mark.parametrize(
    "since", ["2030-01-02T00:00:00Z", "2030-01-02T01:00:00+01:00"], ids=["utc", "offset"]
)
def test_since_is_inclusive_on_created_at(client, sql, since):
    three_days(client, sql)

    assert ids(client.get("/v1/runs", query_string={"since": since})) == ["day-3", "day-2"]


def test_a_since_that_is_not_rfc3339_is_400_naming_the_field(client):
    bad_request(client.get("/v1/runs?since=yesterday"), "since")


def test_the_work_filter_keeps_the_runs_of_that_work(client, sql):
    rejected(client, "w1", work={"id": {"system": "gerrit", "change_id": "4711"}})
    rejected(client, "w2", work={"system": "gerrit", "change_id": "4711"})
    rejected(client, "other", work={"id": {"system": "gerrit", "change_id": "4712"}})
    rejected(client, "none")
    created(sql, "w1", "2030-01-01T00:00:00Z")
    created(sql, "w2", "2030-01-02T00:00:00Z")

    assert ids(client.get("/v1/runs", query_string={"work": "gerrit:4711"})) == ["w2", "w1"]
    assert ids(client.get("/v1/runs", query_string={"work": "gerrit:4712"})) == ["other"]


def test_filters_combine(client, sql):
    advertise(client, "n1", cap("board"))
    work = {"id": {"system": "gerrit", "change_id": "1"}}
    submit(client, contract("running", work=work), 201)
    rejected(client, "failed", work=work)
    rejected(client, "failed-elsewhere")

    resp = client.get("/v1/runs", query_string={"work": "gerrit:1", "state": "FAILED"})

    assert ids(resp) == ["failed"]


def test_unknown_query_parameters_are_ignored(client, sql):
    three_days(client, sql)

    resp = client.get("/v1/runs?colour=blue&state=FAILED&page=7")

    assert ids(resp) == ["day-3", "day-2", "day-1"]


# ---------------------------------------------------------------- limit


def test_the_limit_defaults_to_100_newest_runs(client, sql):
    bulk(sql, 101)

    got = ids(client.get("/v1/runs"))

    assert got == [f"bulk-{i:04d}" for i in range(101, 1, -1)]


def test_a_limit_keeps_that_many_newest_runs(client, sql):
    bulk(sql, 5)

    assert ids(client.get("/v1/runs?limit=2")) == ["bulk-0005", "bulk-0004"]


def test_a_limit_over_1000_is_clamped_to_1000(client, sql):
    bulk(sql, 1001)

    got = ids(client.get("/v1/runs?limit=5000"))

    assert len(got) == 1000 and got[0] == "bulk-1001" and got[-1] == "bulk-0002"


@pytest.mark.parametrize("limit", ["0", "-1", "abc", "1.5", "1_000"])
def test_a_limit_that_is_not_a_positive_integer_is_400_naming_the_field(client, sql, limit):
    bulk(sql, 3)

    bad_request(client.get("/v1/runs", query_string={"limit": limit}), "limit")


# ---------------------------------------------------------------- the before cursor


def test_paging_with_the_before_cursor_visits_every_run_once_in_order(client, sql):
    for run_id in ("p1", "p2", "p3", "p4", "p5"):
        rejected(client, run_id)
    created(sql, "p1", "2030-01-01T00:00:00Z")
    # p2, p3 and p4 share one created_at: the cursor's run_id must break the tie.
    for run_id in ("p2", "p3", "p4"):
        created(sql, run_id, "2030-01-02T00:00:00.250000Z")
    created(sql, "p5", "2030-01-03T00:00:00Z")
    everything = ids(client.get("/v1/runs"))
    assert everything == ["p5", "p4", "p3", "p2", "p1"]

    seen: list[str] = []
    query: dict[str, str] = {"limit": "2"}
    for _ in range(10):
        page = client.get("/v1/runs", query_string=query).get_json()["runs"]
        if not page:
            break
        seen += [r["run_id"] for r in page]
        last = page[-1]
        query = {"limit": "2", "before": f"{last['created_at']},{last['run_id']}"}

    assert seen == everything


def test_the_before_cursor_combines_with_a_filter(client, sql):
    bulk(sql, 4)
    rejected(client, "x")
    created(sql, "x", "2031-01-01T00:00:00Z")
    sql.execute("update runs set state = 'SUCCEEDED' where run_id in ('bulk-0002', 'bulk-0004')")

    first = client.get("/v1/runs?state=FAILED&limit=1").get_json()["runs"]
    assert [r["run_id"] for r in first] == ["x"]
    cursor = f"{first[0]['created_at']},{first[0]['run_id']}"
    rest = client.get("/v1/runs", query_string={"state": "FAILED", "before": cursor})

    assert ids(rest) == ["bulk-0003", "bulk-0001"]


# ---------------------------------------------------------------- GET /v1/runs/{id}


def test_the_view_of_an_unknown_run_is_404_in_the_json_error_shape(client):
    resp = client.get("/v1/runs/no-such-run")

    assert resp.status_code == 404
    body = resp.get_json()
    assert set(body) == {"error"} and body["error"]["code"] == 404 and body["error"]["reason"]


def test_the_view_of_a_running_run_shows_its_assignment_and_steps(client):
    advertise(client, "n1", cap("board", soc="imx8mp"), label="Board 1")
    advertise(client, "h1", cap("agent.reason"), label="Host 1")
    doc = contract(
        "kernel-1",
        role("dut", soc="imx8mp"),
        role("host", "agent.reason"),
        steps=[
            {"id": "flash", "uses": "host", "run": ["flash-image"]},
            {"id": "boot", "uses": "dut", "run": ["boot-test"]},
            {
                "id": "sign-off",
                "ask": {"prompt": "Boot log looks right?"},
                "out": ["decision"],
                "schema": {
                    "decision": {"type": "object", "properties": {"ok": {"type": "boolean"}}}
                },
            },
        ],
        work={"id": {"system": "gerrit", "change_id": "4711"}},
    )
    submit(client, doc, 201)

    view = client.get("/v1/runs/kernel-1").get_json()

    assert view["run_id"] == "kernel-1" and view["state"] == "RUNNING"
    assert view["work_id"] == "gerrit:4711" and view["created_at"].endswith("Z")
    assert "ended_at" not in view and "reject" not in view
    assert view["assigned"] == [
        {"as": "dut", "nodes": [{"node": "n1", "label": "Board 1"}]},
        {"as": "host", "nodes": [{"node": "h1", "label": "Host 1"}]},
    ]
    keys = ("seq", "id", "kind", "state", "uses", "node", "needs", "chosen")
    assert [{k: st[k] for k in keys if k in st} for st in view["steps"]] == [
        {
            "seq": 1,
            "id": "flash",
            "kind": "run",
            "state": "PENDING",
            "uses": "host",
            "node": "h1",
            "needs": [],
            "chosen": False,
        },
        {
            "seq": 2,
            "id": "boot",
            "kind": "run",
            "state": "PENDING",
            "uses": "dut",
            "node": "n1",
            "needs": ["flash"],
            "chosen": False,
        },
        {
            "seq": 3,
            "id": "sign-off",
            "kind": "ask",
            "state": "PENDING",
            "needs": ["boot"],
            "chosen": False,
        },
    ]
    assert view["requires"] == [
        {"as": "dut", "capability": "board", "attrs": {"soc": "imx8mp"}},
        {"as": "host", "capability": "agent.reason", "attrs": {}},
    ]


def test_the_view_names_the_principal_recorded_at_submit(client):
    advertise(client, "n1", cap("board"))
    who = {"X-Enode-Principal": "dev@example.com"}
    resp = client.post("/v1/runs", json=contract("r1"), headers=who)
    assert resp.status_code == 201

    assert client.get("/v1/runs/r1").get_json()["principal"] == "dev@example.com"
