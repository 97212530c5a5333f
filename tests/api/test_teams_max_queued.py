"""A team's max_queued (docs/teams.md, "Queue length"): a submit that would queue a run of a team
already holding max_queued QUEUED runs is 429 with Retry-After and stores nothing; a run that
fits free nodes is still placed, a known run_id still answers 200, other teams are not affected,
and runs of a team no longer configured count as default's."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import records_root
from tests.support.contracts import contract, role
from tests.support.tokens import sha256_entry, token_client
from tests.support.wire import snapshot

one_app_per_module = True

RENEW_SECONDS = 17
SECRETS = {"capped": "s3cret-capped", "free": "s3cret-free", "plain": "s3cret-plain"}
ENTRIES = [
    sha256_entry("capped", SECRETS["capped"], "submitter", team="capped"),
    sha256_entry("free", SECRETS["free"], "submitter", team="free"),
    sha256_entry("plain", SECRETS["plain"], "submitter"),  # default's
]
TEAMS = [
    {"name": "capped", "max_queued": 2},
    {"name": "free"},
    {"name": "default", "max_queued": 2},
]


@pytest.fixture(scope="module")
def module_config() -> dict[str, Any]:
    return {"tokens": ENTRIES, "teams": TEAMS, "lease.renew_seconds": RENEW_SECONDS}


def as_token(app: Any, name: str) -> Any:
    return token_client(app, SECRETS[name])


def status(resp: Any, expected: int) -> dict[str, Any]:
    assert resp.status_code == expected, resp.get_json()
    body: dict[str, Any] = resp.get_json()
    return body


@pytest.fixture
def busy(app, client):
    """One board, held by a run of team free: every later board run queues."""
    advertise(client, "n1", cap("board"))
    status(as_token(app, "free").post("/v1/runs", json=contract("holder")), 201)


def fill(app: Any, token: str, *run_ids: str) -> None:
    for run_id in run_ids:
        assert status(as_token(app, token).post("/v1/runs", json=contract(run_id)), 202)[
            "state"
        ] == ("QUEUED")


def test_a_team_at_max_queued_is_429_and_nothing_is_stored(app, sql, busy):
    fill(app, "capped", "q1", "q2")
    before = snapshot(sql, records_root(app))
    resp = as_token(app, "capped").post("/v1/runs", json=contract("q3"))
    body = status(resp, 429)
    assert body == {
        "error": {"code": 429, "reason": "team capped has 2 runs queued (max_queued 2)"}
    }
    assert resp.headers["Retry-After"] == str(RENEW_SECONDS)
    assert snapshot(sql, records_root(app)) == before
    assert sql.execute("select count(*) from runs where run_id = 'q3'").fetchone() == (0,)
    # Room again once a queued run leaves the queue.
    status(as_token(app, "capped").post("/v1/runs/q1/cancel", json={}), 200)
    fill(app, "capped", "q3")


def test_a_run_that_fits_free_nodes_is_placed_while_the_team_is_at_max_queued(app, client, busy):
    fill(app, "capped", "q1", "q2")
    advertise(client, "s1", cap("scope"))
    placed = as_token(app, "capped").post("/v1/runs", json=contract("p1", role("s", "scope")))
    assert status(placed, 201)["state"] == "RUNNING"
    status(as_token(app, "capped").post("/v1/runs", json=contract("q3")), 429)  # still at it


def test_a_known_run_id_still_answers_200_at_max_queued(app, busy):
    fill(app, "capped", "q1", "q2")
    status(as_token(app, "capped").post("/v1/runs", json=contract("q3")), 429)
    again = as_token(app, "capped").post("/v1/runs", json=contract("q2"))
    view = status(again, 200)
    assert (view["run_id"], view["state"]) == ("q2", "QUEUED")


def test_another_team_is_not_affected_and_one_without_max_queued_is_unlimited(app, busy):
    fill(app, "capped", "q1", "q2")
    status(as_token(app, "capped").post("/v1/runs", json=contract("q3")), 429)
    fill(app, "free", "f1", "f2", "f3", "f4", "f5")
    fill(app, "plain", "d1", "d2")
    status(as_token(app, "plain").post("/v1/runs", json=contract("d3")), 429)


def test_runs_of_a_team_no_longer_configured_count_as_default(app, sql, busy):
    fill(app, "plain", "d1")
    sql.execute("update runs set team = 'gone' where run_id = 'd1'")
    fill(app, "capped", "q1", "q2")  # another team's runs are not default's
    fill(app, "plain", "d2")
    resp = as_token(app, "plain").post("/v1/runs", json=contract("d3"))
    assert status(resp, 429)["error"]["reason"] == ("team default has 2 runs queued (max_queued 2)")
