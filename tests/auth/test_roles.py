"""Every /v1 route with every role: allowed (the route's own answer) or 403 before anything else,
with nothing stored; the table of access covers every /v1 route of the app."""

from __future__ import annotations

from typing import Any

import pytest

from app.api.auth import ROUTES
from tests.support.apps import records_root
from tests.support.tokens import ENTRIES, SECRETS, forbidden, token_client
from tests.support.wire import V1_ROUTES, claimed_run, send, snapshot

one_app_per_module = True


@pytest.fixture(scope="module")
def module_config() -> dict[str, Any]:
    return {"tokens": ENTRIES}  # beside the legacy token of tests/support/apps.py


EVERYONE = set(SECRETS)
NODES = {"node", "node-n1", "operator", "legacy"}  # node-n2 is bound to another node
SUBMITTERS = {"submitter", "submitter-b", "alice", "operator", "legacy"}
ANSWERERS = {"answerer", "alice", "operator", "legacy"}

# (method, path) of V1_ROUTES -> the tokens that may call it on r1 (RUNNING on n1, submitted with
# the legacy token: step 1 CLAIMED by n1, step 2 an open ask).
ALLOWED: dict[tuple[str, str], set[str]] = {
    ("POST", "/v1/nodes"): NODES,
    ("POST", "/v1/nodes/n1/claim?wait=0"): NODES,
    ("POST", "/v1/runs/r1/steps/1/result"): NODES,
    ("POST", "/v1/runs"): SUBMITTERS,
    ("POST", "/v1/runs/dry-run"): SUBMITTERS,
    ("GET", "/v1/runs/r1"): EVERYONE,
    ("GET", "/v1/runs"): EVERYONE,
    ("GET", "/v1/nodes"): EVERYONE,
    ("POST", "/v1/nodes/n1/drain"): {"operator", "legacy"},
    ("DELETE", "/v1/nodes/n1/drain"): {"operator", "legacy"},
    ("POST", "/v1/nodes/n1/quarantine"): {"operator", "legacy"},
    ("DELETE", "/v1/nodes/n1/quarantine"): {"operator", "legacy"},
    ("GET", "/v1/capabilities"): EVERYONE,
    ("GET", "/v1/teams"): EVERYONE,
    ("GET", "/v1/teams/usage"): EVERYONE,
    ("GET", "/v1/asks"): ANSWERERS | {"reader"},
    ("POST", "/v1/runs/r1/steps/2/answer"): ANSWERERS,
    # r1 is not the submitters' own run: only operators cancel it.
    ("POST", "/v1/runs/r1/cancel"): {"operator", "legacy"},
    ("PUT", "/v1/runs/r1/steps/1/log"): NODES,
    ("PUT", "/v1/runs/r1/steps/1/blob/result.json"): NODES,
    ("GET", "/v1/runs/r1/blob/result.json"): EVERYONE,
    ("GET", "/v1/runs/r1/steps/1/log"): EVERYONE,
    ("GET", "/v1/runs/r1/ledger"): EVERYONE,
    ("GET", "/v1/runs/r1/record"): EVERYONE,
    ("GET", "/v1/runs/r1/events"): EVERYONE,
}
CASES = [(m, p, b, who) for m, p, b in V1_ROUTES for who in sorted(EVERYONE)]


def test_the_table_names_every_route_of_the_wire_api():
    assert {(m, p) for m, p, _ in V1_ROUTES} == set(ALLOWED)


@pytest.mark.parametrize(
    ("method", "path", "body", "who"), CASES, ids=[f"{m} {p} as {w}" for m, p, _, w in CASES]
)
def test_a_route_answers_its_roles_and_refuses_the_others_with_403_storing_nothing(
    app, client, sql, method, path, body, who
):
    claimed_run(client, sql)
    before = snapshot(sql, records_root(app))

    resp = send(token_client(app, SECRETS[who]), method, path, body)

    if who in ALLOWED[(method, path)]:
        assert resp.status_code not in (401, 403), (resp.status_code, resp.get_json())
    else:
        reason = forbidden(resp)
        assert "s3cret" not in reason
        assert snapshot(sql, records_root(app)) == before


def test_every_v1_route_of_the_app_has_its_access_rule(app):
    rules = {
        (method, rule.rule)
        for rule in app.url_map.iter_rules()
        for method in rule.methods or ()
        if rule.rule.startswith("/v1/") and method not in {"HEAD", "OPTIONS"}
    }
    assert rules - set(ROUTES) == {("GET", "/v1/openapi.json")}  # open to anyone
    assert set(ROUTES) <= rules


def test_a_token_without_the_role_is_told_which_role_is_needed(app):
    resp = token_client(app, SECRETS["reader"]).post("/v1/runs/dry-run", json={})
    assert forbidden(resp) == "token reader lacks the role: submitter or operator"


def test_the_role_is_checked_before_the_body_the_seq_and_the_run(app):
    reader = token_client(app, SECRETS["reader"])
    for resp in (
        reader.post("/v1/runs/nope/steps/zero/result", data=b"not json"),
        reader.put("/v1/runs/nope/steps/1/blob/x", data=b"x"),
        reader.post("/v1/runs/nope/cancel"),
        reader.post("/v1/runs/nope/steps/1/answer", json={}),
        reader.post("/v1/runs", data=b"{"),
    ):
        assert "lacks the role" in forbidden(resp)


def test_an_unknown_token_is_401_beside_configured_ones(app):
    resp = token_client(app, "s3cret-nobody").get("/v1/runs")
    assert resp.status_code == 401
    assert resp.get_json() == {"error": {"code": 401, "reason": "missing or invalid token"}}


def test_head_is_a_get_and_options_is_open_to_every_valid_token(app):
    node = token_client(app, SECRETS["node-n2"])
    assert node.head("/v1/runs").status_code == 200
    assert node.open("/v1/runs/dry-run", method="OPTIONS").status_code == 200
    assert token_client(app, None).open("/v1/runs", method="OPTIONS").status_code == 401
    assert node.head("/v1/asks").status_code == 403
