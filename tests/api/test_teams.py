"""A run's team (docs/teams.md): chosen at submit and dry-run from queue.team, the token's team,
membership by token name or by a vouched principal's glob, else default; refused with nothing
stored; kept on the run and shown in the view, the list (and its ?team= filter), the Record's
manifest, the submits' metric and GET /v1/teams."""

from __future__ import annotations

import io
import json
import tarfile
from typing import Any

import pytest

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import records_root
from tests.support.contracts import contract
from tests.support.metrics import scrape, value
from tests.support.tokens import sha256_entry, token_client
from tests.support.wire import snapshot

one_app_per_module = True

SECRETS = {
    "kern": "s3cret-kern",
    "qa-bot": "s3cret-qa-bot",
    "bridge": "s3cret-bridge",
    "plain": "s3cret-plain",
    "alice": "s3cret-alice",
    "op": "s3cret-op",
    "reader": "s3cret-reader",
}
ENTRIES = [
    sha256_entry("kern", SECRETS["kern"], "submitter", team="kernel", teams=["release"]),
    sha256_entry("qa-bot", SECRETS["qa-bot"], "submitter"),
    sha256_entry("bridge", SECRETS["bridge"], "submitter", vouches_for_principals=True),
    sha256_entry("plain", SECRETS["plain"], "submitter"),
    sha256_entry("alice", SECRETS["alice"], "submitter", principal="alice@ai.example.com"),
    sha256_entry("op", SECRETS["op"], "operator"),
    sha256_entry("reader", SECRETS["reader"], "reader"),
]
TEAMS = [
    {"name": "kernel", "weight": 3, "max_nodes": 4},
    {"name": "release"},
    {"name": "qa", "members": ["qa-bot"], "max_queued": 10},
    {"name": "ai", "members": ["*@ai.example.com"]},
]


@pytest.fixture(scope="module")
def module_config() -> dict[str, Any]:
    return {"tokens": ENTRIES, "teams": TEAMS}


def as_token(app: Any, name: str, principal: str | None = None) -> Any:
    return token_client(app, SECRETS[name], principal)


def team_of(resp: Any) -> str:
    assert resp.status_code in (200, 201, 202), resp.get_json()
    return resp.get_json()["team"]


def error(resp: Any, status: int) -> str:
    assert resp.status_code == status, resp.get_json()
    body = resp.get_json()
    assert set(body) == {"error"} and body["error"]["code"] == status
    return body["error"]["reason"]


@pytest.fixture
def board(client):
    advertise(client, "n1", cap("board"))


# ---------------------------------------------------------------- refusals store nothing


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/runs/dry-run"])
@pytest.mark.parametrize("name", ["nope", "health"])
def test_an_unconfigured_queue_team_is_400_and_nothing_is_stored(app, sql, board, path, name):
    before = snapshot(sql, records_root(app))
    resp = as_token(app, "op").post(path, json=contract("r1", queue={"team": name}))
    assert error(resp, 400) == f'unknown team: "{name}"'
    assert snapshot(sql, records_root(app)) == before


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/runs/dry-run"])
def test_a_queue_team_the_token_may_not_name_is_403_and_nothing_is_stored(app, sql, board, path):
    before = snapshot(sql, records_root(app))
    resp = as_token(app, "kern").post(path, json=contract("r1", queue={"team": "qa"}))
    assert error(resp, 403) == 'this token may not name team "qa"'
    assert snapshot(sql, records_root(app)) == before


def test_the_team_is_checked_before_the_run_id_lookup(app, board):
    assert team_of(as_token(app, "kern").post("/v1/runs", json=contract("r1"))) == "kernel"
    again = as_token(app, "kern").post("/v1/runs", json=contract("r1", queue={"team": "qa"}))
    assert error(again, 403) == 'this token may not name team "qa"'


# ---------------------------------------------------------------- how the team is chosen


def test_a_run_takes_the_token_team_or_one_it_may_name(app, sql, board):
    kern = as_token(app, "kern")
    assert team_of(kern.post("/v1/runs", json=contract("r1"))) == "kernel"
    assert team_of(kern.post("/v1/runs", json=contract("r2", queue={"team": "release"}))) == (
        "release"
    )
    op = as_token(app, "op")
    assert team_of(op.post("/v1/runs", json=contract("r3", queue={"team": "qa"}))) == "qa"
    rows = sql.execute("select run_id, team from runs order by run_id").fetchall()
    assert rows == [("r1", "kernel"), ("r2", "release"), ("r3", "qa")]


def test_dry_run_answers_the_team_the_run_would_have(app, board):
    resp = as_token(app, "kern").post("/v1/runs/dry-run", json=contract("r1"))
    assert resp.status_code == 200, resp.get_json()
    assert resp.get_json()["team"] == "kernel"


def test_members_by_token_name_choose_the_team(app, board):
    assert team_of(as_token(app, "qa-bot").post("/v1/runs", json=contract("r1"))) == "qa"


def test_a_glob_matches_a_vouched_principal_bound_or_through_a_bridge(app, board):
    alice = as_token(app, "alice")
    assert team_of(alice.post("/v1/runs", json=contract("r1"))) == "ai"
    bridge = as_token(app, "bridge", "bob@ai.example.com")
    assert team_of(bridge.post("/v1/runs", json=contract("r2"))) == "ai"


def test_a_self_declared_principal_never_selects_a_team(app, sql, board):
    plain = as_token(app, "plain", "bob@ai.example.com")
    assert team_of(plain.post("/v1/runs", json=contract("r1"))) == "default"
    assert sql.execute("select team from runs").fetchall() == [("default",)]


def test_the_legacy_token_runs_default_as_before(client, board):
    assert team_of(client.post("/v1/runs", json=contract("r1"))) == "default"


# ---------------------------------------------------------------- where the team shows


def test_the_view_and_the_list_rows_carry_the_team_and_team_filters(app, sql, board):
    as_token(app, "kern").post("/v1/runs", json=contract("k1"))
    as_token(app, "qa-bot").post("/v1/runs", json=contract("q1"))  # queued behind k1
    reader = as_token(app, "reader")
    assert reader.get("/v1/runs/k1").get_json()["team"] == "kernel"
    assert reader.get("/v1/runs/q1").get_json()["team"] == "qa"
    rows = reader.get("/v1/runs").get_json()["runs"]
    assert {r["run_id"]: r["team"] for r in rows} == {"k1": "kernel", "q1": "qa"}
    listed = reader.get("/v1/runs?team=qa").get_json()["runs"]
    assert [r["run_id"] for r in listed] == ["q1"]
    assert reader.get("/v1/runs?team=release").get_json()["runs"] == []


def test_a_team_no_longer_configured_is_shown_and_filtered_under_its_stored_name(app, sql, board):
    as_token(app, "kern").post("/v1/runs", json=contract("k1"))
    sql.execute("update runs set team = 'gone' where run_id = 'k1'")
    sql.execute("update leases set team = 'gone' where run_id = 'k1'")
    reader = as_token(app, "reader")
    assert reader.get("/v1/runs/k1").get_json()["team"] == "gone"
    assert [r["run_id"] for r in reader.get("/v1/runs?team=gone").get_json()["runs"]] == ["k1"]


@pytest.mark.parametrize("bad", ["a b", "-x", "x" * 64, "é"])
def test_a_team_filter_that_is_no_team_name_is_400_naming_the_field(app, bad):
    resp = as_token(app, "reader").get("/v1/runs", query_string={"team": bad})
    assert error(resp, 400).startswith("team must be a team name")


def test_the_record_manifest_names_the_team(app, board):
    kern = as_token(app, "kern")
    assert kern.post("/v1/runs", json=contract("r1")).status_code == 201
    assert kern.post("/v1/runs/r1/cancel").status_code == 200
    resp = kern.get("/v1/runs/r1/record")
    assert resp.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(resp.data)) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/manifest.json"))
        f = tar.extractfile(member)
        assert f is not None
        manifest = json.loads(f.read())
    assert manifest["team"] == "kernel"


def test_submits_are_counted_by_team(app, board):
    before = scrape(app.test_client())
    as_token(app, "kern").post("/v1/runs", json=contract("r1"))
    as_token(app, "kern").post("/v1/runs", json=contract("r2", queue={"team": "qa"}))
    after = scrape(app.test_client())

    def delta(**labels: str) -> float:
        return value(after, "mediator_submits_total", **labels) - value(
            before, "mediator_submits_total", **labels
        )

    assert delta(outcome="placed", team="kernel") == 1
    assert delta(outcome="forbidden", team="kernel") == 1
    assert value(after, "mediator_submits_total", outcome="placed", team="ai") >= 0
    assert ("mediator_submits_total", (("outcome", "placed"), ("team", "ai"))) in after


# ---------------------------------------------------------------- GET /v1/teams


def test_get_teams_lists_the_configured_teams_and_default_by_name(app, sql, board):
    as_token(app, "kern").post("/v1/runs", json=contract("k1"))  # RUNNING on n1
    as_token(app, "qa-bot").post("/v1/runs", json=contract("q1"))  # QUEUED
    as_token(app, "qa-bot").post("/v1/runs", json=contract("q2"))  # QUEUED
    resp = as_token(app, "reader").get("/v1/teams")
    assert resp.status_code == 200, resp.get_json()
    body = resp.get_json()
    assert isinstance(body["observed_at"], str)
    by_name = {t["name"]: t for t in body["teams"]}
    assert [t["name"] for t in body["teams"]] == ["ai", "default", "kernel", "qa", "release"]
    assert by_name["kernel"] == {
        "name": "kernel",
        "weight": 3,
        "share": 0.75,
        # Nothing charged yet: usage 0 of 0; the factor is its share over its one node's
        # running charge (fairshare.running_charge_seconds, 3600).
        "usage": 0.0,
        "factor": pytest.approx(0.75 / 3600),
        "running_nodes": 1,
        "queued": 0,
        "max_nodes": 4,
        "max_queued": None,
    }
    assert by_name["qa"] | {} == {
        "name": "qa",
        "weight": 1,
        "share": 0.25,
        "usage": 0.0,
        "factor": None,  # nothing spent: ranked first
        "running_nodes": 0,
        "queued": 2,
        "max_nodes": None,
        "max_queued": 10,
    }
    assert by_name["default"]["share"] is None and by_name["default"]["queued"] == 0


def test_get_teams_counts_a_run_of_an_unconfigured_team_as_default(app, sql, board):
    as_token(app, "kern").post("/v1/runs", json=contract("k1"))
    sql.execute("update runs set team = 'gone' where run_id = 'k1'")
    sql.execute("update leases set team = 'gone' where run_id = 'k1'")
    by_name = {t["name"]: t for t in as_token(app, "reader").get("/v1/teams").get_json()["teams"]}
    assert "gone" not in by_name
    assert (by_name["default"]["running_nodes"], by_name["default"]["share"]) == (1, 1.0)
    assert by_name["kernel"]["running_nodes"] == 0 and by_name["kernel"]["share"] is None


def test_get_teams_takes_no_query_parameters(app):
    resp = as_token(app, "reader").get("/v1/teams?x=1")
    assert error(resp, 400) == "GET /v1/teams takes no query parameters, got 'x'"
