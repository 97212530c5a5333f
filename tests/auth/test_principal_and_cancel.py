"""A token's principal overrides the self-declared header (a different one is 403); a token
without one takes the header as given. Submitters cancel only the runs submitted with their
token; operators any."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.contracts import contract, role
from tests.support.rows import find_run, run_row, transitions
from tests.support.tokens import ENTRIES, as_role, forbidden

one_app_per_module = True


@pytest.fixture(scope="module")
def module_config() -> dict[str, Any]:
    return {"tokens": ENTRIES}


@pytest.fixture
def board(client):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))


# ------------------------------------------------------------------ principal


@pytest.mark.parametrize("header", [None, "alice@example.com"])
def test_a_tokens_principal_is_the_runs_principal(app, sql, board, header):
    resp = as_role(app, "alice", header).post("/v1/runs", json=contract("r1"))

    assert resp.status_code == 201, resp.get_json()
    row = run_row(sql, "r1")
    assert (row["principal"], row["token_name"]) == ("alice@example.com", "alice")


def test_another_principal_than_the_tokens_is_403_and_nothing_is_stored(app, sql, board):
    mallory = as_role(app, "alice", "mallory@example.com")

    resp = mallory.post("/v1/runs", json=contract("r1"))

    assert forbidden(resp) == "X-Enode-Principal differs from the principal of token alice"
    assert find_run(sql, "r1") is None
    assert forbidden(mallory.get("/v1/runs")).startswith("X-Enode-Principal differs")


@pytest.mark.parametrize("header", [None, "bob@example.com"])
def test_without_a_tokens_principal_the_header_is_taken_as_given(app, sql, board, header):
    resp = as_role(app, "submitter", header).post("/v1/runs", json=contract("r1"))

    assert resp.status_code == 201
    assert (run_row(sql, "r1")["principal"], run_row(sql, "r1")["token_name"]) == (header, "sub")


def test_an_ask_for_a_principal_is_answered_with_the_tokens_principal(app, client, sql, board):
    ask = {
        "id": "sign-off",
        "ask": {"prompt": "ship it?", "answerers": ["alice@example.com"]},
        "out": ["decision"],
    }
    steps = [ask, {"id": "flash", "uses": "dut", "run": ["flash"]}]
    assert client.post("/v1/runs", json=contract("r1", role("dut"), steps=steps)).status_code == 201
    alice = as_role(app, "alice")
    claiming_to_be_alice = as_role(app, "answerer", "alice@example.com")
    someone = as_role(app, "answerer", "someone@example.com")

    assert [a["can_answer"] for a in alice.get("/v1/asks").get_json()["asks"]] == [True]
    assert [a["can_answer"] for a in someone.get("/v1/asks").get_json()["asks"]] == [False]
    # A self-declared principal is not vouched for by a token without vouches_for_principals.
    assert [a["can_answer"] for a in claiming_to_be_alice.get("/v1/asks").get_json()["asks"]] == [
        False
    ]
    assert someone.post("/v1/runs/r1/steps/1/answer", json={"ok": True}).status_code == 403
    assert forbidden(
        claiming_to_be_alice.post("/v1/runs/r1/steps/1/answer", json={"ok": True})
    ).startswith("principal is not an allowed answerer: alice@example.com is self-declared")
    answered = alice.post("/v1/runs/r1/steps/1/answer", json={"ok": True})
    assert answered.status_code == 200, answered.get_json()


# ------------------------------------------------------------------ cancel


def test_a_submitter_cancels_its_own_run_and_not_anothers(app, sql, board):
    a, b = as_role(app, "submitter"), as_role(app, "submitter-b")
    assert a.post("/v1/runs", json=contract("ra")).status_code == 201
    assert b.post("/v1/runs", json=contract("rb")).status_code == 201

    refused = b.post("/v1/runs/ra/cancel")
    assert forbidden(refused) == "a submitter may cancel only its own runs"
    assert run_row(sql, "ra")["state"] == "RUNNING"
    assert transitions(sql, "ra") == [(None, "RUNNING")]

    own = a.post("/v1/runs/ra/cancel")
    assert own.status_code == 200 and own.get_json() == {"run_id": "ra", "state": "FAILED"}
    assert run_row(sql, "ra")["state"] == "FAILED"
    assert forbidden(b.post("/v1/runs/ra/cancel"))  # finished or not, still not b's


def test_an_operator_cancels_any_run(app, sql, board):
    assert as_role(app, "submitter").post("/v1/runs", json=contract("ra")).status_code == 201
    assert as_role(app, "alice").post("/v1/runs", json=contract("rb")).status_code == 201

    for run_id, who in (("ra", "operator"), ("rb", "legacy")):
        resp = as_role(app, who).post(f"/v1/runs/{run_id}/cancel")
        assert resp.status_code == 200 and resp.get_json()["state"] == "FAILED"
        assert run_row(sql, run_id)["state"] == "FAILED"


def test_a_submitter_cancelling_an_unknown_run_is_told_404(app):
    assert as_role(app, "submitter").post("/v1/runs/nope/cancel").status_code == 404
