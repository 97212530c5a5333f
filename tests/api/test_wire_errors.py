"""The wire rules of docs/api.md#conventions and the bounded input of
docs/security.md#input-and-load: one JSON error shape for every error, 404/405 with ``Allow``, 401
``missing or invalid token`` on every /v1 route, 400 for bodies that are not JSON, not objects or of
the wrong types (naming the field), 413 over ``max_body_bytes``, bounded nesting, ``{seq}`` and id
lengths — always a 4xx, never a 500, never a partial write."""

from __future__ import annotations

import io
import json
import re
import shutil
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import records_root
from tests.support.contracts import contract, role
from tests.support.submitter import submit
from tests.support.wire import V1_ROUTES, claimed_run, snapshot

MAX_BODY = 4096
MAX_BLOB = 16384
DEEP = 5000  # far deeper than any bound, and far deeper than Python's recursion limit


pytestmark = pytest.mark.config({"max_body_bytes": MAX_BODY, "max_blob_bytes": MAX_BLOB})


# ------------------------------------------------------------------ helpers


def error_of(resp: Any) -> dict[str, Any]:
    """The error body, checked to be exactly ``{"error": {"code", "reason"}}`` with the status."""
    body = resp.get_json(silent=True)
    assert isinstance(body, dict) and set(body) == {"error"}, resp.data[:300]
    assert set(body["error"]) == {"code", "reason"}
    assert body["error"]["code"] == resp.status_code
    assert isinstance(body["error"]["reason"], str) and body["error"]["reason"]
    return body["error"]


def is_empty(snap: dict[str, Any]) -> bool:
    return not snap["files"] and not any(snap["rows"].values())


def valid_contract(run_id: str = "r1") -> dict[str, Any]:
    return contract(run_id, role("dut"))


def valid_advert(node_id: str = "n1") -> dict[str, Any]:
    return {"node_id": node_id, "capabilities": [cap("board", soc="imx8mp")]}


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


# ------------------------------------------------------------------ 404 and 405

UNKNOWN_ROUTES = [
    ("GET", "/nope"),
    ("GET", "/v1/nope"),
    ("POST", "/v1/runs/r1/steps/1/nope"),
    ("GET", "/v2/runs"),
    ("DELETE", "/v1"),
]
WRONG_METHODS = [
    ("DELETE", "/v1/runs", {"GET", "POST"}),
    ("PUT", "/v1/nodes", {"GET", "POST"}),
    ("GET", "/v1/nodes/n1/claim", {"POST"}),
    ("GET", "/v1/runs/r1/cancel", {"POST"}),
    ("GET", "/v1/runs/r1/steps/1/result", {"POST"}),
    ("POST", "/v1/runs/r1/steps/1/blob/x", {"PUT"}),
    ("DELETE", "/v1/runs/r1", {"GET"}),
    ("POST", "/healthz", {"GET"}),
]


def test_an_unknown_route_is_404_in_the_json_error_shape(client):
    for method, path in UNKNOWN_ROUTES:
        resp = client.open(path, method=method)
        assert resp.status_code == 404, (method, path)
        assert resp.mimetype == "application/json"
        error_of(resp)


def test_a_wrong_method_is_405_with_allow_in_the_json_error_shape(client):
    for method, path, allowed in WRONG_METHODS:
        resp = client.open(path, method=method)
        assert resp.status_code == 405, (method, path)
        assert resp.mimetype == "application/json"
        error_of(resp)
        assert allowed <= {m.strip() for m in resp.headers["Allow"].split(",")}, (method, path)


# ------------------------------------------------------------------ content type and times

RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")


def test_json_bodies_are_application_json_in_utf_8(client):
    advertise(client, "n1", cap("board"))
    for resp in (client.get("/v1/nodes"), client.get("/v1/runs/nope"), client.get("/nope")):
        assert resp.mimetype == "application/json"
        charset = resp.mimetype_params.get("charset", "")
        assert charset.lower() == "utf-8", resp.headers["Content-Type"]


def test_times_on_the_wire_are_rfc_3339_in_utc(client):
    advertise(client, "n1", cap("board"))
    submit(client, valid_contract(), 201)
    reply = advertise(client, "n1", cap("board"))
    view = client.get("/v1/runs/r1").get_json()
    runs = client.get("/v1/runs").get_json()
    nodes = client.get("/v1/nodes").get_json()
    times = [
        reply["leases"][0]["not_after"],
        view["created_at"],
        runs["observed_at"],
        runs["runs"][0]["created_at"],
        nodes["observed_at"],
        nodes["nodes"][0]["seen_at"],
        nodes["nodes"][0]["expires_at"],
        nodes["nodes"][0]["lease"]["not_after"],
    ]
    assert all(RFC3339_UTC.match(t) for t in times), times


# ------------------------------------------------------------------ 401 on every /v1 route

BAD_AUTH = {
    "no header": None,
    "wrong token": "Bearer not-the-token",
    "another scheme": "Basic dXNlcjpwYXNz",
    "bearer without a token": "Bearer ",
    "the token without bearer": "test-token-of-the-mediator-long-enough",
}


def _send(
    client: Any, method: str, path: str, body: Any, headers: dict[str, str] | None = None
) -> Any:
    if isinstance(body, bytes):
        return client.open(path, method=method, data=body, headers=headers or {})
    return client.open(path, method=method, json=body, headers=headers or {})


@pytest.mark.parametrize(
    ("method", "path", "body"), V1_ROUTES, ids=[f"{m} {p}" for m, p, _ in V1_ROUTES]
)
def test_a_v1_route_without_a_valid_token_is_401_and_changes_nothing(
    app, client, sql, method, path, body
):
    claimed_run(client, sql)
    before = snapshot(sql, records_root(app))
    anonymous = app.test_client()
    for name, value in BAD_AUTH.items():
        headers = {} if value is None else {"Authorization": value}

        resp = _send(anonymous, method, path, body, headers)

        assert resp.status_code == 401, name
        assert resp.get_json() == {"error": {"code": 401, "reason": "missing or invalid token"}}, (
            name
        )
    assert snapshot(sql, records_root(app)) == before


def test_the_token_is_checked_before_the_body_and_the_seq(app, client):
    resp = app.test_client().post("/v1/runs/r1/steps/zero/result", data=b"not json")
    assert resp.status_code == 401
    assert resp.get_json() == {"error": {"code": 401, "reason": "missing or invalid token"}}


# ------------------------------------------------------------------ bodies that are not JSON objects

JSON_ROUTES = [
    ("POST", "/v1/nodes"),
    ("POST", "/v1/runs"),
    ("POST", "/v1/runs/dry-run"),
    ("POST", "/v1/runs/r1/steps/1/result"),
]
NOT_JSON = {
    "text": b"not json",
    "empty": b"",
    "cut short": b'{"node_id": "n1"',
    "trailing garbage": b'{"node_id": "n1"} x',
    "not utf-8": b'{"node_id": "\xff\xfe"}',
    "single quotes": b"{'node_id': 'n1'}",
}
NOT_OBJECT = {
    "list": [],
    "string": "n1",
    "number": 1,
    "null": None,
    "true": True,
    "list of object": [{"node_id": "n1"}],
}


@pytest.mark.parametrize(("method", "path"), JSON_ROUTES, ids=[p for _, p in JSON_ROUTES])
def test_a_body_that_is_not_json_is_400_and_stores_nothing(app, client, sql, method, path):
    claimed_run(client, sql)
    before = snapshot(sql, records_root(app))
    for name, raw in NOT_JSON.items():
        resp = client.open(path, method=method, data=raw, content_type="application/json")
        assert resp.status_code == 400, name
        error_of(resp)
    assert snapshot(sql, records_root(app)) == before


@pytest.mark.parametrize(("method", "path"), JSON_ROUTES, ids=[p for _, p in JSON_ROUTES])
def test_a_json_body_that_is_not_an_object_is_400_and_stores_nothing(
    app, client, sql, method, path
):
    claimed_run(client, sql)
    before = snapshot(sql, records_root(app))
    for name, doc in NOT_OBJECT.items():
        resp = client.open(
            path, method=method, data=json.dumps(doc), content_type="application/json"
        )
        assert resp.status_code == 400, name
        error_of(resp)
    assert snapshot(sql, records_root(app)) == before


def test_an_answer_that_is_not_json_is_400_and_the_ask_stays_open(app, client, sql):
    claimed_run(client, sql)
    before = snapshot(sql, records_root(app))
    resp = client.post(
        "/v1/runs/r1/steps/2/answer", data=b"yes please", content_type="application/json"
    )
    assert resp.status_code == 400
    error_of(resp)
    assert snapshot(sql, records_root(app)) == before


# ------------------------------------------------------------------ wrong types name the field


def test_an_advert_without_node_id_is_400_node_id_is_missing(client, sql):
    resp = client.post("/v1/nodes", json={"capabilities": [cap("board")]})
    assert resp.status_code == 400
    assert resp.get_json() == {"error": {"code": 400, "reason": "node_id is missing"}}
    assert sql.execute("SELECT count(*) FROM nodes").fetchone() == (0,)


def _caps(*entries: Any) -> dict[str, Any]:
    return {"node_id": "n1", "capabilities": list(entries)}


ADVERT_TYPE_ERRORS: list[tuple[dict[str, Any], str]] = [
    (_caps({"capability": 5}), "capabilities[0].capability"),
    (_caps(cap("board"), {"capability": ["board"]}), "capabilities[1].capability"),
    (_caps({"attrs": {}}), "capabilities[0].capability"),
    (_caps({"capability": "board", "attrs": {"soc": 8}}), "capabilities[0].attrs"),
    (_caps({"capability": "board", "attrs": ["soc"]}), "capabilities[0].attrs"),
    ({"node_id": "n1", "capabilities": "board"}, "capabilities"),
    (_caps("board"), "capabilities[0]"),
    ({"node_id": 7, "capabilities": []}, "node_id"),
    ({"node_id": "n 1", "capabilities": []}, "node_id"),
    ({"node_id": "n1", "label": 3, "capabilities": []}, "label"),
    ({"node_id": "n1", "instance": ["i"], "capabilities": []}, "instance"),
    ({"node_id": "n1", "policy": "graceful", "capabilities": []}, "policy"),
]


def test_an_advert_of_the_wrong_types_is_400_naming_the_field(client, sql):
    for body, field in ADVERT_TYPE_ERRORS:
        resp = client.post("/v1/nodes", json=body)
        assert resp.status_code == 400, body
        assert error_of(resp)["reason"].startswith(field), (field, resp.get_json())
    assert sql.execute("SELECT count(*) FROM nodes").fetchone() == (0,)


RESULT_TYPE_ERRORS: list[tuple[dict[str, Any], str]] = [
    ({"exit_code": 0}, "node"),
    ({"node": 1, "exit_code": 0}, "node"),
    ({"node": "n1", "exit_code": "zero"}, "exit_code"),
    ({"node": "n1", "exit_code": 1.5}, "exit_code"),
    ({"node": "n1", "produced": "result.json"}, "produced"),
    ({"node": "n1", "produced": [1]}, "produced"),
    ({"node": "n1", "error": {"why": "x"}}, "error"),
    ({"node": "n1", "nonce": 5}, "nonce"),
]


def test_a_result_of_the_wrong_types_is_400_naming_the_field_and_the_step_stays_claimed(
    app, client, sql
):
    claimed_run(client, sql)
    before = snapshot(sql, records_root(app))
    for body, field in RESULT_TYPE_ERRORS:
        resp = client.post("/v1/runs/r1/steps/1/result", json=body)
        assert resp.status_code == 400, body
        assert field in error_of(resp)["reason"], (field, resp.get_json())
    assert snapshot(sql, records_root(app)) == before


CONTRACT_TYPE_ERRORS: list[tuple[dict[str, Any], str]] = [
    ({"run_id": 5}, "run_id"),
    ({"requires": "board"}, "requires"),
    ({"steps": {"id": "s"}}, "steps"),
    ({"requires": [{"as": "dut", "capability": 3}]}, "requires[0].capability"),
]


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/runs/dry-run"])
def test_a_contract_of_the_wrong_types_is_400_naming_the_field_and_stores_nothing(
    app, client, sql, path
):
    for change, field in CONTRACT_TYPE_ERRORS:
        resp = client.post(path, json={**valid_contract(), **change})
        assert resp.status_code == 400, change
        assert field in error_of(resp)["reason"], (field, resp.get_json())
    assert is_empty(snapshot(sql, records_root(app)))


# ------------------------------------------------------------------ max_body_bytes


def _padded(doc: dict[str, Any], size: int) -> bytes:
    """``doc`` with an ignored field that makes the JSON exactly ``size`` bytes."""
    base = json.dumps({**doc, "padding": ""}).encode()
    raw = json.dumps({**doc, "padding": "x" * (size - len(base))}).encode()
    assert len(raw) == size
    return raw


def test_an_advert_of_exactly_max_body_bytes_is_accepted(client, sql):
    resp = client.post(
        "/v1/nodes", data=_padded(valid_advert(), MAX_BODY), content_type="application/json"
    )
    assert resp.status_code == 200
    assert sql.execute("SELECT node_id FROM nodes").fetchall() == [("n1",)]


def test_an_advert_one_byte_over_max_body_bytes_is_413_and_stores_nothing(app, client, sql):
    resp = client.post(
        "/v1/nodes", data=_padded(valid_advert(), MAX_BODY + 1), content_type="application/json"
    )
    assert resp.status_code == 413
    error_of(resp)
    assert is_empty(snapshot(sql, records_root(app)))


def _big_contract(run_id: str) -> dict[str, Any]:
    steps = [
        {"id": f"step-{i:03d}", "uses": "dut", "run": ["echo", f"step {i}"]} for i in range(80)
    ]
    doc = contract(run_id, role("dut"), steps=steps)
    assert len(json.dumps(doc)) > MAX_BODY
    return doc


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/runs/dry-run"])
def test_a_valid_contract_over_max_body_bytes_is_413_and_stores_nothing(app, client, sql, path):
    advertise(client, "n1", cap("board"))
    before = snapshot(sql, records_root(app))
    resp = client.post(path, json=_big_contract("big"))
    assert resp.status_code == 413
    error_of(resp)
    assert snapshot(sql, records_root(app)) == before


def test_a_result_over_max_body_bytes_is_413_and_the_step_stays_claimed(app, client, sql):
    claimed_run(client, sql)
    before = snapshot(sql, records_root(app))
    body = {"node": "n1", "exit_code": 0, "produced": [], "harness": {"notes": "x" * MAX_BODY}}
    resp = client.post("/v1/runs/r1/steps/1/result", json=body)
    assert resp.status_code == 413
    error_of(resp)
    assert snapshot(sql, records_root(app)) == before


def _chunked(client: Any, method: str, path: str, raw: bytes) -> Any:
    """A request without Content-Length, as gunicorn hands a chunked upload to the app: the server
    terminates the input stream (``wsgi.input_terminated``)."""
    return client.open(
        path,
        method=method,
        input_stream=io.BytesIO(raw),
        headers={"Transfer-Encoding": "chunked", "Content-Type": "application/json"},
        environ_overrides={"wsgi.input_terminated": True},
    )


def test_a_chunked_advert_within_max_body_bytes_is_accepted(client, sql):
    resp = _chunked(client, "POST", "/v1/nodes", _padded(valid_advert(), MAX_BODY))
    assert resp.status_code == 200
    assert sql.execute("SELECT node_id FROM nodes").fetchall() == [("n1",)]


def test_a_chunked_advert_over_max_body_bytes_is_413_and_stores_nothing(app, client, sql):
    resp = _chunked(client, "POST", "/v1/nodes", _padded(valid_advert(), MAX_BODY + 100))
    assert resp.status_code == 413
    error_of(resp)
    assert is_empty(snapshot(sql, records_root(app)))


def test_a_chunked_blob_over_max_blob_bytes_is_413_and_is_never_stored_cut(app, client, sql):
    claimed_run(client, sql)
    before = snapshot(sql, records_root(app))
    resp = _chunked(client, "PUT", "/v1/runs/r1/steps/1/blob/raw.log", b"x" * (MAX_BLOB + 100))
    assert resp.status_code == 413
    error_of(resp)
    assert snapshot(sql, records_root(app)) == before


# ------------------------------------------------------------------ nesting depth


@pytest.mark.parametrize(("method", "path"), JSON_ROUTES, ids=[p for _, p in JSON_ROUTES])
def test_json_nested_2000_deep_is_400_not_a_crash(app, client, sql, method, path):
    claimed_run(client, sql)
    before = snapshot(sql, records_root(app))
    raw = b"[" * 2000 + b"]" * 2000
    resp = client.open(path, method=method, data=raw, content_type="application/json")
    assert resp.status_code == 400
    error_of(resp)
    assert snapshot(sql, records_root(app)) == before


@pytest.mark.parametrize(
    ("path", "doc"),
    [
        ("/v1/nodes", {**valid_advert(), "extra": nested(200)}),
        (
            "/v1/runs",
            {
                **valid_contract(),
                "work": {"id": {"system": "g", "change_id": "1"}},
                "lease": nested(200),
            },
        ),
        ("/v1/runs/dry-run", {**valid_contract(), "lease": nested(200)}),
    ],
    ids=["advert", "contract", "dry-run"],
)
def test_an_object_nested_deeper_than_the_bound_inside_a_valid_body_is_400(
    app, client, sql, path, doc
):
    advertise(client, "n0", cap("board"))
    before = snapshot(sql, records_root(app))
    resp = client.post(path, json=doc)
    assert resp.status_code == 400
    error_of(resp)
    assert snapshot(sql, records_root(app)) == before


def test_an_answer_nested_far_deeper_than_the_bound_is_400_and_the_ask_stays_open(app, client, sql):
    claimed_run(client, sql)
    before = snapshot(sql, records_root(app))
    raw = b'{"ok": ' + b"[" * DEEP + b"]" * DEEP + b"}"
    resp = client.post("/v1/runs/r1/steps/2/answer", data=raw, content_type="application/json")
    assert resp.status_code == 400
    error_of(resp)
    assert snapshot(sql, records_root(app)) == before


def test_a_blob_under_a_schema_nested_far_deeper_than_the_bound_is_refused_and_not_stored(
    app, client, sql
):
    claimed_run(client, sql)
    before = snapshot(sql, records_root(app))
    raw = b'{"ok": ' + b"[" * DEEP + b"]" * DEEP + b"}"
    resp = client.put("/v1/runs/r1/steps/1/blob/result.json", data=raw)
    assert 400 <= resp.status_code < 500
    error_of(resp)
    assert snapshot(sql, records_root(app)) == before


# ------------------------------------------------------------------ {seq}

BAD_SEQS = ["0", "-1", "abc", "1.5", "1e3", "%20", "0x1", "²"]  # "²" is a digit to str.isdigit()
SEQ_ROUTES: list[tuple[str, str, Any]] = [
    ("POST", "/v1/runs/r1/steps/{seq}/result", {"node": "n1", "exit_code": 0, "produced": []}),
    ("POST", "/v1/runs/r1/steps/{seq}/answer", {"ok": True}),
    ("PUT", "/v1/runs/r1/steps/{seq}/log", b"a line\n"),
    ("GET", "/v1/runs/r1/steps/{seq}/log", None),
    ("PUT", "/v1/runs/r1/steps/{seq}/blob/result.json", b'{"ok": true}'),
]


@pytest.mark.parametrize(
    ("method", "path", "body"), SEQ_ROUTES, ids=[f"{m} {p}" for m, p, _ in SEQ_ROUTES]
)
def test_a_seq_that_is_not_a_positive_integer_is_400_and_changes_nothing(
    app, client, sql, method, path, body
):
    claimed_run(client, sql)
    before = snapshot(sql, records_root(app))
    for seq in BAD_SEQS:
        resp = _send(client, method, path.format(seq=seq), body)
        assert resp.status_code == 400, seq
        error_of(resp)
    assert snapshot(sql, records_root(app)) == before


def test_a_log_offset_that_is_not_a_byte_offset_is_400(client, sql):
    claimed_run(client, sql)
    for offset in ("-1", "abc", "1.5", "²"):
        resp = client.get(f"/v1/runs/r1/steps/1/log?from={offset}")
        assert resp.status_code == 400, offset
        error_of(resp)


def test_a_seq_too_large_for_any_step_is_never_a_500(app, client, sql):
    claimed_run(client, sql)
    before = snapshot(sql, records_root(app))
    for method, path, body in SEQ_ROUTES:
        resp = _send(client, method, path.format(seq="9" * 30), body)
        assert 400 <= resp.status_code < 500, (method, path, resp.status_code)
        error_of(resp)
    assert snapshot(sql, records_root(app)) == before


# ------------------------------------------------------------------ string lengths

LONG = "x" * 201


def test_a_run_id_of_200_characters_is_accepted(client, sql):
    advertise(client, "n1", cap("board"))
    rid = "r" * 200
    assert submit(client, valid_contract(rid)).status_code == 201
    assert client.get(f"/v1/runs/{rid}").status_code == 200


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/runs/dry-run"])
def test_a_run_id_of_201_characters_is_400_naming_run_id(app, client, sql, path):
    advertise(client, "n1", cap("board"))
    before = snapshot(sql, records_root(app))
    resp = client.post(path, json=valid_contract(LONG))
    assert resp.status_code == 400
    assert "run_id" in error_of(resp)["reason"]
    assert snapshot(sql, records_root(app)) == before


def test_a_node_id_of_200_characters_is_accepted(client, sql):
    advertise(client, "n" * 200, cap("board"))
    assert sql.execute("SELECT length(node_id) FROM nodes").fetchall() == [(200,)]


ADVERT_TOO_LONG: list[tuple[dict[str, Any], str]] = [
    ({"node_id": LONG, "capabilities": []}, "node_id"),
    ({"node_id": "n1", "label": LONG, "capabilities": []}, "label"),
    ({"node_id": "n1", "instance": LONG, "capabilities": []}, "instance"),
    (_caps({"capability": "b" * 201}), "capabilities[0].capability"),
    (_caps({"capability": "board", "attrs": {LONG: "v"}}), "capabilities[0].attrs"),
    (_caps({"capability": "board", "attrs": {"soc": "v" * 1025}}), "capabilities[0].attrs"),
]


def test_an_advert_with_a_string_over_its_bound_is_400_naming_the_field(client, sql):
    for body, field in ADVERT_TOO_LONG:
        resp = client.post("/v1/nodes", json=body)
        assert resp.status_code == 400, field
        assert error_of(resp)["reason"].startswith(field), (field, resp.get_json())
    assert sql.execute("SELECT count(*) FROM nodes").fetchone() == (0,)


def test_an_advert_attribute_of_1024_bytes_is_accepted(client, sql):
    advertise(client, "n1", cap("board", soc="v" * 1024))
    assert sql.execute("SELECT count(*) FROM nodes").fetchone() == (1,)


def test_requires_of_51_roles_is_400_and_stores_nothing(app, client, sql):
    doc = {
        "run_id": "wide",
        "requires": [{"as": f"r{i}", "capability": "b"} for i in range(51)],
        "steps": [{"id": "s", "uses": "r0", "run": ["true"]}],
    }
    resp = client.post("/v1/runs", json=doc)
    assert resp.status_code == 400
    assert "requires" in error_of(resp)["reason"]
    assert is_empty(snapshot(sql, records_root(app)))


LONG_GETS = [
    f"/v1/runs/{LONG}",
    f"/v1/runs/{LONG}/events",
    f"/v1/runs/{LONG}/ledger",
    f"/v1/runs/{LONG}/record",
    f"/v1/runs/{LONG}/blob/result.json",
    f"/v1/runs/{LONG}/steps/1/log",
    f"/v1/runs/r1/blob/{LONG}",
    "/v1/runs/" + "x" * 5000,
]
LONG_PUTS = [
    (f"/v1/runs/{LONG}/steps/1/log", b"a line\n"),
    (f"/v1/runs/{LONG}/steps/1/blob/result.json", b'{"ok": true}'),
    (f"/v1/runs/r1/steps/1/blob/{LONG}", b'{"ok": true}'),
]


def test_a_get_of_an_id_over_200_characters_is_404(client, sql):
    claimed_run(client, sql)
    for path in LONG_GETS:
        resp = client.get(path)
        assert resp.status_code == 404, path[:60]
        error_of(resp)


def test_a_put_to_an_id_over_200_characters_is_404_and_stores_nothing(app, client, sql):
    claimed_run(client, sql)
    before = snapshot(sql, records_root(app))
    for path, body in LONG_PUTS:
        resp = client.put(path, data=body)
        assert resp.status_code == 404, path[:60]
        error_of(resp)
    assert snapshot(sql, records_root(app)) == before


def test_a_cancel_of_a_run_id_over_200_characters_is_404(client):
    resp = client.post(f"/v1/runs/{LONG}/cancel")
    assert resp.status_code == 404
    error_of(resp)


def test_a_claim_for_a_node_id_over_200_characters_is_a_4xx_and_changes_nothing(app, client, sql):
    claimed_run(client, sql)
    before = snapshot(sql, records_root(app))
    resp = client.post(f"/v1/nodes/{LONG}/claim?wait=0")
    assert resp.status_code in (400, 404)
    error_of(resp)
    assert snapshot(sql, records_root(app)) == before


def test_a_log_name_over_200_characters_is_refused_and_stores_nothing(app, client, sql):
    claimed_run(client, sql)
    before = snapshot(sql, records_root(app))
    resp = client.put(f"/v1/runs/r1/steps/1/log?name={LONG}", data=b"a line\n")
    assert 400 <= resp.status_code < 500
    error_of(resp)
    assert snapshot(sql, records_root(app)) == before


def test_a_principal_over_200_characters_is_400_and_stores_nothing(app, client, sql):
    advertise(client, "n1", cap("board"))
    before = snapshot(sql, records_root(app))
    resp = client.post(
        "/v1/runs", json=valid_contract(), headers={"X-Enode-Principal": "p" * 201 + "@x.org"}
    )
    assert resp.status_code == 400
    error_of(resp)
    assert snapshot(sql, records_root(app)) == before


def test_an_instance_header_over_200_characters_is_400_and_claims_nothing(app, client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, valid_contract(), 201)
    before = snapshot(sql, records_root(app))
    resp = client.post("/v1/nodes/n1/claim?wait=0", headers={"X-Enode-Instance": LONG})
    assert resp.status_code == 400
    error_of(resp)
    assert snapshot(sql, records_root(app)) == before


# ------------------------------------------------------------------ numbers PostgreSQL cannot store


def _with_enum_value(number: str) -> bytes:
    """A valid contract whose output schema enumerates ``number`` (schemas are stored as given)."""
    step = {
        "id": "s",
        "uses": "dut",
        "run": ["true"],
        "out": ["r.json"],
        "schema": {"r.json": {"enum": ["N"]}},
    }
    return (
        json.dumps(contract("r1", role("dut"), steps=[step]))
        .replace('["N"]', f"[{number}]")
        .encode()
    )


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/runs/dry-run"])
def test_nan_and_infinity_are_not_json_and_are_400(app, client, sql, path):
    advertise(client, "n1", cap("board"))
    before = snapshot(sql, records_root(app))
    for number in ("NaN", "Infinity", "-Infinity"):
        resp = client.post(path, data=_with_enum_value(number), content_type="application/json")
        assert resp.status_code == 400, (number, resp.get_json())
        error_of(resp)
    assert snapshot(sql, records_root(app)) == before


def test_a_number_too_large_for_a_double_is_never_a_500_nor_a_partial_write(app, client, sql):
    advertise(client, "n1", cap("board"))
    before = snapshot(sql, records_root(app))
    for number in ("1e400", "-1e400"):
        resp = client.post(
            "/v1/runs", data=_with_enum_value(number), content_type="application/json"
        )
        assert resp.status_code < 500, (number, resp.get_json())
        if resp.status_code >= 400:
            error_of(resp)
            assert snapshot(sql, records_root(app)) == before


# ------------------------------------------------------------------ property: never a 5xx, never a partial write

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)
# Values a contract or an advert might really hold, so that many mutants stay valid or nearly so.
_words = st.sampled_from(
    ["dut", "board", "s1", "s2", "r.json", "true", "imx8mp", "1h", "fail", "run", "", "prop-1"]
)
_plausible = _words | st.integers(min_value=-1, max_value=3) | st.lists(_words, max_size=3)
_value = _plausible | _json

_CONTRACT: dict[str, Any] = {
    "run_id": "prop-1",
    "work": {"id": {"system": "gerrit", "change_id": "1"}},
    "requires": [{"as": "dut", "capability": "board", "soc": "imx8mp"}],
    "steps": [{"id": "s1", "uses": "dut", "run": ["true"], "out": ["r.json"]}],
    "success_when": [{"step": "s1", "exit_code": 0}],
}
_ADVERT: dict[str, Any] = {
    "node_id": "prop-n1",
    "label": "lab",
    "instance": "i1",
    "capabilities": [cap("board")],
    "policy": {"drain": ""},
}
_STEP_KEYS = [
    "id",
    "uses",
    "run",
    "out",
    "needs",
    "schema",
    "env",
    "in",
    "collect",
    "ask",
    "agent",
    "acquire",
    "loop",
    "dispatch",
    "release",
    "validate_with",
    "workspace",
]
_TOP_KEYS = [*_CONTRACT, "ledger", "queue", "lease"]


def _mutations(base: dict[str, Any], keys: list[str]) -> st.SearchStrategy[Any]:
    """The valid document itself, or with one key replaced, removed or added."""
    replace = st.tuples(st.sampled_from(keys), _value).map(lambda kv: {**base, kv[0]: kv[1]})
    remove = st.sampled_from(keys).map(lambda k: {x: v for x, v in base.items() if x != k})
    add = st.tuples(st.text(max_size=8), _value).map(lambda kv: {**base, kv[0]: kv[1]})
    return st.just(base) | replace | remove | add


def _in_first(base: dict[str, Any], field: str, keys: list[str]) -> st.SearchStrategy[Any]:
    """The document with one key of the first entry of ``base[field]`` replaced."""
    return st.tuples(st.sampled_from(keys), _value).map(
        lambda kv: {**base, field: [{**base[field][0], kv[0]: kv[1]}, *base[field][1:]]}
    )


_contracts = st.one_of(
    _mutations(_CONTRACT, _TOP_KEYS),
    _in_first(_CONTRACT, "steps", _STEP_KEYS),
    _in_first(_CONTRACT, "requires", ["as", "capability", "count", "soc"]),
    _in_first(_CONTRACT, "success_when", ["step", "exit_code", "produced", "fleet_has"]),
)
_adverts = st.one_of(
    _mutations(_ADVERT, list(_ADVERT)),
    _in_first(_ADVERT, "capabilities", ["capability", "attrs"]),
)
_requests = st.one_of(
    st.tuples(st.sampled_from(["/v1/runs", "/v1/runs/dry-run"]), _contracts),
    st.tuples(st.just("/v1/nodes"), _adverts),
    st.tuples(st.sampled_from(["/v1/runs", "/v1/runs/dry-run", "/v1/nodes"]), _json),
)


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=_requests)
def test_any_json_body_gives_no_5xx_and_a_4xx_leaves_nothing_behind(app, client, sql, request):
    path, body = request
    # DELETE is far cheaper than TRUNCATE on tables this small; runs cascade to their rows.
    sql.execute("DELETE FROM runs; DELETE FROM nodes; DELETE FROM wake_debt")
    shutil.rmtree(records_root(app), ignore_errors=True)
    advertise(client, "fleet-1", cap("board", soc="imx8mp"))
    before = snapshot(sql, records_root(app))
    raw = json.dumps(body).encode()  # NaN and Infinity come out as the tokens Python accepts

    resp = client.post(path, data=raw, content_type="application/json")

    event(f"{path} -> {resp.status_code}")
    assert resp.status_code < 500, (path, raw[:300], resp.get_json(silent=True))
    after = snapshot(sql, records_root(app))
    if resp.status_code >= 400:
        error_of(resp)
    if path == "/v1/runs/dry-run" or (resp.status_code >= 400 and resp.status_code != 422):
        assert after == before, (path, raw[:300], resp.status_code)
    elif resp.status_code == 422:
        # A rejected submit (docs/queue.md#on-submit-placed-queued-or-rejected) is a FAILED run with
        # its reject, no steps, no lease.
        assert path == "/v1/runs"
        runs = [json.loads(r) for r in after["rows"]["runs"]]
        assert [(r["state"], bool(r["reject"])) for r in runs] == [("FAILED", True)]
        assert after["rows"]["steps"] == [] and after["rows"]["leases"] == []
