"""A principal is vouched for, or marked. A token's own principal is the principal; a principal
declared in ``X-Enode-Principal`` under a token without one stays a string where the original's
clients read one (``principal``, ``answered_by``, ``by``) and is marked beside it with
``*_self_declared: true`` and the token's name. An ask restricted to ``answerers`` takes only a
principal the token vouches for: its own, or one declared through a token whose entry says
``vouches_for_principals: true`` (a trusted bridge) or through the legacy single token."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from app.config import load_config
from app.errors import ConfigError
from app.logs import configure_logging
from app.tokens import legacy_token, parse_tokens
from tests.support.actors import Answerer, cap
from tests.support.agent import advertise
from tests.support.apps import app_on
from tests.support.contracts import contract, role
from tests.support.record_contents import tar_files
from tests.support.rows import rows, run_row, step_row
from tests.support.tokens import ENTRIES, as_role, forbidden, sha256_entry, token_client

one_app_per_module = True

BRIDGE_SECRET = "s3cret-bridge"
BRIDGE = sha256_entry("bridge", BRIDGE_SECRET, "answerer", vouches_for_principals=True)
QA = "qa@example.com"
NOT_VOUCHED = (
    "principal is not an allowed answerer: qa@example.com is self-declared "
    "(X-Enode-Principal) and token ans does not vouch for it"
)
APPROVE = b'{"verdict": "approve"}'


@pytest.fixture(scope="module")
def module_config() -> dict[str, Any]:
    return {"tokens": [*ENTRIES, BRIDGE]}


@pytest.fixture
def board(client):
    advertise(client, "n1", cap("board"))


def bridge(app: Any, principal: str | None = None) -> Any:
    return token_client(app, BRIDGE_SECRET, principal)


def asking(run_id: str, *answerers: str) -> dict[str, Any]:
    """A run whose only step asks; answering it ends the run (SUCCEEDED)."""
    ask: dict[str, Any] = {"prompt": "ship it?"}
    if answerers:
        ask["answerers"] = list(answerers)
    step = {"id": "sign-off", "ask": ask, "out": ["decision"]}
    return contract(run_id, role("dut"), steps=[step])


def answer(c: Any, run_id: str = "r1") -> Any:
    return Answerer(c).answer(run_id, 1, APPROVE)


def can_answer(c: Any) -> list[bool]:
    resp = c.get("/v1/asks")
    assert resp.status_code == 200, resp.get_json()
    return [a["can_answer"] for a in resp.get_json()["asks"]]


def blob_rows(sql: Any, run_id: str) -> list[dict[str, Any]]:
    return rows(
        sql,
        "select seq, name, by, by_declared_token from blobs where run_id = %s order by seq",
        run_id,
    )


def event_rows(sql: Any, run_id: str) -> list[tuple[Any, ...]]:
    return [
        (r["to_state"], r["cause"], r["by"], r["by_declared_token"])
        for r in rows(sql, "select * from run_events where run_id = %s order by id", run_id)
    ]


def record_members(c: Any, run_id: str) -> dict[str, Any]:
    """The sealed Record's JSON files by their path inside ``run-<id>/``."""
    resp = c.get(f"/v1/runs/{run_id}/record")
    assert resp.status_code == 200, resp.get_data(as_text=True)[:300]
    files = tar_files(resp.data, in_run=True)
    return {path: json.loads(data) for path, data in files.items() if path.endswith(".json")}


# ------------------------------------------------------------------ restricted asks


def test_a_self_declared_principal_among_the_answerers_is_403_with_a_reason_and_nothing_stored(
    app, client, sql, board
):
    assert client.post("/v1/runs", json=asking("r1", QA)).status_code == 201

    resp = answer(as_role(app, "answerer", QA))

    assert forbidden(resp) == NOT_VOUCHED
    assert step_row(sql, "r1", 1)["state"] == "ASKED"
    assert blob_rows(sql, "r1") == []
    assert run_row(sql, "r1")["state"] == "RUNNING"


def test_can_answer_is_false_for_a_self_declared_principal_among_the_answerers(app, client, board):
    assert client.post("/v1/runs", json=asking("r1", QA)).status_code == 201

    assert can_answer(as_role(app, "answerer", QA)) == [False]
    assert can_answer(as_role(app, "answerer", "someone@example.com")) == [False]


def test_a_tokens_own_principal_answers_a_restricted_ask_unmarked(app, client, sql, board):
    assert client.post("/v1/runs", json=asking("r1", "alice@example.com")).status_code == 201
    alice = as_role(app, "alice")
    assert can_answer(alice) == [True]

    resp = answer(alice)

    assert resp.status_code == 200, resp.get_json()
    row = step_row(sql, "r1", 1)
    assert (row["answered_by"], row["answered_by_declared_token"]) == ("alice@example.com", None)
    assert blob_rows(sql, "r1") == [
        {"seq": 1, "name": "decision", "by": "alice@example.com", "by_declared_token": None}
    ]
    [entry] = client.get("/v1/runs/r1/ledger").get_json()["entries"]
    assert entry["by"] == "alice@example.com"
    assert "by_self_declared" not in entry and "token" not in entry


def test_a_bridge_token_that_vouches_for_principals_answers_a_restricted_ask_marked(
    app, client, sql, board
):
    assert client.post("/v1/runs", json=asking("r1", QA)).status_code == 201
    assert can_answer(bridge(app, QA)) == [True]
    assert can_answer(bridge(app, "someone@example.com")) == [False]

    resp = answer(bridge(app, QA))

    assert resp.status_code == 200, resp.get_json()
    row = step_row(sql, "r1", 1)
    assert (row["state"], row["answered_by"], row["answered_by_declared_token"]) == (
        "DONE",
        QA,
        "bridge",
    )


def test_a_bridge_token_without_a_declared_principal_is_not_an_allowed_answerer(
    app, client, sql, board
):
    assert client.post("/v1/runs", json=asking("r1", QA)).status_code == 201
    assert can_answer(bridge(app)) == [False]

    assert forbidden(answer(bridge(app))) == "principal is not an allowed answerer"
    assert step_row(sql, "r1", 1)["state"] == "ASKED"


def test_the_legacy_token_vouches_for_the_principals_its_callers_declare(app, client, sql, board):
    assert client.post("/v1/runs", json=asking("r1", QA)).status_code == 201
    legacy = as_role(app, "legacy", QA)
    assert can_answer(legacy) == [True]

    resp = answer(legacy)

    assert resp.status_code == 200, resp.get_json()
    row = step_row(sql, "r1", 1)
    assert (row["answered_by"], row["answered_by_declared_token"]) == (QA, "token")


def test_can_answer_is_false_for_a_token_that_may_not_answer(app, client, board):
    assert client.post("/v1/runs", json=asking("r1")).status_code == 201

    assert can_answer(as_role(app, "reader")) == [False]
    assert can_answer(as_role(app, "answerer")) == [True]
    assert as_role(app, "reader").post("/v1/runs/r1/steps/1/answer", json={}).status_code == 403


# ------------------------------------------------------------------ marks


def test_a_run_submitted_with_a_self_declared_principal_is_marked_with_the_token(app, sql, board):
    bob = as_role(app, "submitter", "bob@example.com")

    created = bob.post("/v1/runs", json=contract("r1"))

    assert created.status_code == 201, created.get_json()
    mark = {"principal": "bob@example.com", "principal_self_declared": True, "token": "sub"}
    assert {k: created.get_json().get(k) for k in mark} == mark
    assert {k: bob.get("/v1/runs/r1").get_json().get(k) for k in mark} == mark
    [listed] = bob.get("/v1/runs").get_json()["runs"]
    assert {k: listed.get(k) for k in mark} == mark
    row = run_row(sql, "r1")
    assert (row["principal"], row["principal_self_declared"], row["token_name"]) == (
        "bob@example.com",
        True,
        "sub",
    )
    [event] = bob.get("/v1/runs/r1/events").get_json()["events"]
    assert (event["by"], event["by_self_declared"], event["token"]) == (
        "bob@example.com",
        True,
        "sub",
    )
    assert event_rows(sql, "r1") == [("RUNNING", "submit", "bob@example.com", "sub")]


def test_a_run_submitted_with_the_tokens_own_principal_is_not_marked(app, sql, board):
    alice = as_role(app, "alice")

    assert alice.post("/v1/runs", json=contract("r1")).status_code == 201

    view = alice.get("/v1/runs/r1").get_json()
    assert view["principal"] == "alice@example.com"
    assert "principal_self_declared" not in view and "token" not in view
    [event] = alice.get("/v1/runs/r1/events").get_json()["events"]
    assert event["by"] == "alice@example.com" and set(event) == {"at", "from", "to", "cause", "by"}
    assert run_row(sql, "r1")["principal_self_declared"] is False
    assert event_rows(sql, "r1") == [("RUNNING", "submit", "alice@example.com", None)]


def test_a_run_submitted_without_a_principal_is_not_marked(app, sql, board):
    sub = as_role(app, "submitter")

    assert sub.post("/v1/runs", json=contract("r1")).status_code == 201

    view = sub.get("/v1/runs/r1").get_json()
    assert "principal" not in view and "principal_self_declared" not in view
    assert run_row(sql, "r1")["principal_self_declared"] is False


def test_a_cancel_by_a_self_declared_principal_is_marked_in_the_event(app, sql, board):
    bob = as_role(app, "submitter", "bob@example.com")
    assert bob.post("/v1/runs", json=contract("r1")).status_code == 201

    assert bob.post("/v1/runs/r1/cancel").get_json() == {"run_id": "r1", "state": "FAILED"}

    events = bob.get("/v1/runs/r1/events").get_json()["events"]
    assert [(e["to"], e["by"], e.get("by_self_declared"), e.get("token")) for e in events] == [
        ("RUNNING", "bob@example.com", True, "sub"),
        ("FAILED", "bob@example.com", True, "sub"),
    ]


def test_an_answer_by_a_self_declared_principal_is_marked_in_ledger_events_and_record(
    app, client, sql, board
):
    assert client.post("/v1/runs", json=asking("r1")).status_code == 201
    qa = as_role(app, "answerer", QA)

    resp = answer(qa)

    assert resp.status_code == 200 and resp.get_json()["run_state"] == "SUCCEEDED"
    row = step_row(sql, "r1", 1)
    assert (row["answered_by"], row["answered_by_declared_token"]) == (QA, "ans")
    assert blob_rows(sql, "r1") == [
        {"seq": 1, "name": "decision", "by": QA, "by_declared_token": "ans"}
    ]
    [entry] = qa.get("/v1/runs/r1/ledger").get_json()["entries"]
    assert (entry["by"], entry["by_self_declared"], entry["token"]) == (QA, True, "ans")
    record = record_members(qa, "r1")
    step = record["steps/01-sign-off.json"]
    assert (step["answered_by"], step["answered_by_self_declared"], step["token"]) == (
        QA,
        True,
        "ans",
    )


def test_a_sealed_record_marks_a_self_declared_requester_and_its_events(app, sql, board):
    bob = as_role(app, "submitter", "bob@example.com")
    assert bob.post("/v1/runs", json=contract("r1")).status_code == 201
    assert bob.post("/v1/runs/r1/cancel").status_code == 200

    record = record_members(bob, "r1")

    manifest = record["manifest.json"]
    assert (manifest["requester"], manifest["requester_self_declared"], manifest["token"]) == (
        "bob@example.com",
        True,
        "sub",
    )
    assert [
        (e["by"], e.get("by_self_declared"), e.get("token")) for e in record["events.json"]
    ] == [
        ("bob@example.com", True, "sub"),
        ("bob@example.com", True, "sub"),
    ]


# ------------------------------------------------------------------ configuration


def test_vouches_for_principals_is_read_from_an_entry_and_is_false_by_default():
    vouching, plain = parse_tokens(
        "tokens",
        [BRIDGE, sha256_entry("plain", "x", "answerer")],
    )
    assert (vouching.vouches_for_principals, plain.vouches_for_principals) == (True, False)


@pytest.mark.parametrize("value", ["yes", 1, None, []])
def test_vouches_for_principals_that_is_not_a_boolean_stops_the_configuration(value):
    entry = sha256_entry("a", "x", "answerer", vouches_for_principals=value)
    if value is None:
        entry["vouches_for_principals"] = None

    with pytest.raises(ConfigError) as err:
        load_config(env={}, overrides={"tokens": [entry]})

    assert str(err.value) == "tokens[0].vouches_for_principals: must be true or false"


def test_the_legacy_token_vouches_for_declared_principals():
    assert legacy_token("old-secret").vouches_for_principals is True


@pytest.fixture
def warnings_as_json() -> Iterator[None]:
    yield
    configure_logging("console", "error")


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_start_up_warns_when_other_tokens_are_configured_beside_the_legacy_token(
    db_url, tmp_path, capfd, warnings_as_json
):
    logs = {"log.format": "json", "log.level": "warning"}
    capfd.readouterr()
    with app_on(db_url, tmp_path / "a", tokens=ENTRIES, **logs):
        beside = _lines(capfd.readouterr().err)
    with app_on(db_url, tmp_path / "b", **logs):
        alone = _lines(capfd.readouterr().err)

    legacy = [x for x in beside if "legacy token" in x["event"]]
    assert [(x["level"], x["event"]) for x in legacy] == [
        (
            "warning",
            "the legacy token vouches for every principal its callers declare, beside "
            f"{len(ENTRIES)} other tokens: answers to restricted asks made with it are taken as "
            "from the principal they name",
        )
    ]
    assert [x for x in alone if "legacy token" in x["event"]] == []
