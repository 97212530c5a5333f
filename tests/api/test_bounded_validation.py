"""Validation is bounded (docs/security.md#input-and-load): a blob or an answer checked against its
step's schema stops at the first few errors — the reason names at most 3 and is cut at 1 KiB — and
never builds the full list of errors; a document that satisfies its schema is checked in at most
``MAX_CHECKS`` checks, and refused 413 past them; an answer is read and parsed only once its step is
known to await it from this caller, and validated before its transaction opens, so a violation is
answered without waiting on the run's row.

How long validation takes is never measured here: the tests count the errors jsonschema builds,
the checks (through documents sized by them), the memory a request allocates (tracemalloc), and
look in ``pg_locks`` for a request waiting on a lock."""

from __future__ import annotations

import json
import threading
import tracemalloc
from typing import Any

import jsonschema.exceptions
import psycopg
import pytest

from app.config import to_libpq_url
from app.contract.violations import MAX_CHECKS
from tests.support.actors import cap
from tests.support.agent import advertise, claimed
from tests.support.apps import client_of
from tests.support.contracts import contract, role
from tests.support.rows import one, scalar
from tests.support.submitter import submit
from tests.support.wire import error_of

MAX_BLOB = 16 * 1024 * 1024
WRONG_ITEMS = 500_000
MANY_KEYS = 850_000
OBJECTS = {"type": "array", "items": {"type": "object"}}
DECISION = {
    "type": "object",
    "required": ["verdict"],
    "properties": {"verdict": {"enum": ["approve", "reject"]}},
}
QA = {"X-Enode-Principal": "qa@example.com"}
# Requests of this test database waiting for a lock (row locks are waited for as the holder's
# transaction id, which names no database: hence the join on the backend).
WAITING = (
    "select count(*) from pg_locks l join pg_stat_activity a on a.pid = l.pid"
    " where not l.granted and a.datname = current_database()"
)


pytestmark = pytest.mark.config({"max_blob_bytes": MAX_BLOB})


@pytest.fixture
def built_errors(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many ValidationErrors jsonschema has built since the test began (one slot)."""
    count = [0]
    original = jsonschema.exceptions.ValidationError.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        count[0] += 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(jsonschema.exceptions.ValidationError, "__init__", counting)
    return count


def with_schema(client: Any, schema: dict[str, Any], name: str = "out.json") -> None:
    """r1 RUNNING on n1: one run step whose ``name`` has ``schema``, claimed."""
    advertise(client, "n1", cap("board"))
    step = {"id": "s", "uses": "dut", "run": ["x"], "out": [name], "schema": {name: schema}}
    submit(client, contract("r1", role("dut"), steps=[step]), 201)
    # only the claimed step uploads (docs/security.md#runs-records-and-uploads)
    claimed(client, "n1")


def asking(client: Any, schema: dict[str, Any], **fields: Any) -> None:
    """r1 RUNNING with step 1 ASKED (``fields`` add to its ``ask``); its answer has ``schema``."""
    advertise(client, "n1", cap("board"))
    body = {"prompt": "ok?", **fields}
    ask = {"id": "q", "ask": body, "out": ["decision"], "schema": {"decision": schema}}
    flash = {"id": "flash", "uses": "dut", "run": ["flash"]}
    submit(client, contract("r1", role("dut"), steps=[ask, flash]), 201)


def nothing_stored(sql: Any, ctx: Any) -> bool:
    blobs = ctx.records.path("r1") / "blobs"
    files = list(blobs.iterdir()) if blobs.is_dir() else []
    return scalar(sql, "select count(*) from blobs") == 0 and files == []


# ---------------------------------------------------------------- blobs


def test_a_blob_of_500000_wrong_items_is_422_naming_the_first_3_and_builds_no_more_errors(
    client, sql, ctx, built_errors
):
    with_schema(client, OBJECTS)
    body = b"[" + b"1," * (WRONG_ITEMS - 1) + b"1]"

    resp = client.put("/v1/runs/r1/steps/1/blob/out.json", data=body)

    assert resp.status_code == 422
    assert error_of(resp) == (
        "schema violation: $[0]: 1 is not of type 'object'; $[1]: 1 is not of type 'object'; "
        "$[2]: 1 is not of type 'object'; and more"
    )
    assert built_errors[0] <= 4
    assert nothing_stored(sql, ctx)


def test_a_blob_whose_one_error_would_quote_a_huge_value_has_a_reason_of_at_most_1_kib(
    client, sql, ctx
):
    with_schema(client, {"type": "object"})
    body = json.dumps(list(range(200_000))).encode()

    resp = client.put("/v1/runs/r1/steps/1/blob/out.json", data=body)

    assert resp.status_code == 422
    assert error_of(resp) == "schema violation: $: [0, 1, 2, 3, ...] is not of type 'object'"
    assert nothing_stored(sql, ctx)


def test_a_blob_past_an_items_false_quotes_a_few_of_the_extra_items(client, sql, ctx):
    with_schema(client, {"type": "array", "items": False})
    body = json.dumps(["x" * 100] * 20_000).encode()

    resp = client.put("/v1/runs/r1/steps/1/blob/out.json", data=body)

    assert resp.status_code == 422
    reason = error_of(resp)
    assert reason.startswith("schema violation: $: Expected at most 0 items but found 20000 extra")
    assert len(reason.encode()) <= 1024
    assert nothing_stored(sql, ctx)


def test_an_enum_violation_by_a_huge_value_has_a_reason_of_at_most_1_kib(client, sql, ctx):
    with_schema(client, {"type": "object", "properties": {"mode": {"enum": ["a", "b"]}}})
    body = json.dumps({"mode": {f"k{i}": i for i in range(100_000)}}).encode()

    resp = client.put("/v1/runs/r1/steps/1/blob/out.json", data=body)

    assert resp.status_code == 422
    assert error_of(resp) == (
        "schema violation: $.mode: {'k0': 0, 'k1': 1, 'k2': 2, 'k3': 3, ...} is not one of "
        "['a', 'b']"
    )
    assert nothing_stored(sql, ctx)


def test_a_reason_is_cut_at_1_kib_whatever_the_paths(client, sql, ctx):
    # Three errors at paths of 2,000 characters each: their text is far over 1 KiB.
    with_schema(client, {"type": "object", "additionalProperties": {"type": "string"}})
    body = json.dumps({f"{k}{'p' * 2000}": k for k in range(5)}).encode()

    resp = client.put("/v1/runs/r1/steps/1/blob/out.json", data=body)

    assert resp.status_code == 422
    reason = error_of(resp)
    assert reason.startswith("schema violation: $.0ppp") and reason.endswith("...")
    assert len(reason.encode()) == 1024
    assert nothing_stored(sql, ctx)


def test_a_blob_that_satisfies_its_schema_is_still_stored(client, sql, ctx):
    with_schema(client, OBJECTS)

    resp = client.put("/v1/runs/r1/steps/1/blob/out.json", data=b"[{}, {}]")

    assert resp.status_code == 204
    assert one(sql, "select name, bytes, schema_ok from blobs") == {
        "name": "out.json",
        "bytes": 8,
        "schema_ok": True,
    }


def too_large(what: str) -> str:
    return (
        f"{what} is too large to validate against its schema: more than {MAX_CHECKS} checks "
        "(values looked at, properties looked up, enum comparisons); nothing was stored"
    )


def test_a_valid_blob_is_stored_within_the_checks_and_413_past_them(client, sql, ctx):
    # [{}, …] under {"items": {"type": "object"}}: one check for the list, one for each item.
    with_schema(client, OBJECTS)
    past = json.dumps([{}] * MAX_CHECKS).encode()

    resp = client.put("/v1/runs/r1/steps/1/blob/out.json", data=past)

    assert resp.status_code == 413
    assert error_of(resp) == too_large("out.json")
    assert nothing_stored(sql, ctx)

    within = json.dumps([{}] * (MAX_CHECKS - 1)).encode()
    assert client.put("/v1/runs/r1/steps/1/blob/out.json", data=within).status_code == 204
    assert one(sql, "select bytes, schema_ok from blobs") == {
        "bytes": len(within),
        "schema_ok": True,
    }


@pytest.mark.parametrize(
    ("schema", "doc"),
    [
        # 100 items, each compared with 1,000 enum values: the match is the last.
        ({"type": "array", "items": {"enum": list(range(1000))}}, [999] * 100),
        # 100 empty objects, each looked up for 1,000 properties it does not have.
        (
            {"type": "array", "items": {"properties": {f"p{i}": {} for i in range(1000)}}},
            [{}] * 100,
        ),
    ],
    ids=["enum-comparisons", "property-look-ups"],
)
def test_a_small_valid_blob_whose_schema_makes_many_checks_is_413(client, sql, ctx, schema, doc):
    with_schema(client, schema)

    resp = client.put("/v1/runs/r1/steps/1/blob/out.json", data=json.dumps(doc).encode())

    assert resp.status_code == 413
    assert error_of(resp) == too_large("out.json")
    assert nothing_stored(sql, ctx)


# ---------------------------------------------------------------- answers


@pytest.mark.parametrize(
    ("seq", "headers", "status", "reason"),
    [
        (2, QA, 409, "step is not awaiting an answer"),  # a run step
        (1, {"X-Enode-Principal": "dev@example.com"}, 403, "principal is not an allowed answerer"),
    ],
    ids=["not-awaiting", "not-an-answerer"],
)
def test_an_answer_that_is_not_json_gets_the_state_or_rights_error_not_a_parse_error(
    client, sql, seq, headers, status, reason
):
    asking(client, DECISION, answerers=["qa@example.com"])

    resp = client.post(
        f"/v1/runs/r1/steps/{seq}/answer",
        data=b"{not json",
        headers=headers,
        content_type="application/json",
    )

    assert (resp.status_code, error_of(resp)) == (status, reason)
    assert one(sql, "select state from steps where seq = 1") == {"state": "ASKED"}


def test_a_10_mib_answer_to_a_step_not_awaiting_one_is_409_without_being_read(client, sql):
    # Parsed, 10 MiB of [{}, …] would take about 450 MiB; unread, it takes nothing.
    asking(client, DECISION)
    body = b"[" + b"{}," * (10 * 1024 * 1024 // 3 - 1) + b"{}]"

    tracemalloc.start()
    try:
        resp = client.post(
            "/v1/runs/r1/steps/2/answer", data=body, headers=QA, content_type="application/json"
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert (resp.status_code, error_of(resp)) == (409, "step is not awaiting an answer")
    assert peak < 2 * 1024 * 1024, f"the request allocated {peak} bytes at its peak"


def test_a_valid_answer_past_the_checks_is_413_and_the_ask_stays_open(client, sql, ctx):
    asking(client, DECISION | {"additionalProperties": {"type": "string"}})
    answer = {"verdict": "approve"} | {f"k{i}": "x" for i in range(MAX_CHECKS)}

    resp = client.post(
        "/v1/runs/r1/steps/1/answer",
        data=json.dumps(answer),
        headers=QA,
        content_type="application/json",
    )

    assert resp.status_code == 413
    assert error_of(resp) == too_large("the answer")
    assert one(sql, "select state from steps where seq = 1") == {"state": "ASKED"}
    assert nothing_stored(sql, ctx)


def test_an_answer_with_850000_unexpected_keys_is_422_naming_3_of_them_in_at_most_1_kib(
    client, sql, ctx, built_errors
):
    asking(client, DECISION | {"additionalProperties": False})
    answer = {"verdict": "approve"} | {f"k{i}": 0 for i in range(MANY_KEYS)}

    resp = client.post(
        "/v1/runs/r1/steps/1/answer",
        data=json.dumps(answer),
        headers=QA,
        content_type="application/json",
    )

    assert resp.status_code == 422
    assert error_of(resp) == (
        "schema violation: $: Additional properties are not allowed "
        "('k0', 'k1', 'k2' and 849997 more were unexpected)"
    )
    assert built_errors[0] <= 4
    assert one(sql, "select state from steps where seq = 1") == {"state": "ASKED"}
    assert nothing_stored(sql, ctx)


def test_an_answer_with_850000_wrong_values_names_the_first_3_and_builds_no_more_errors(
    client, sql, built_errors
):
    asking(client, DECISION | {"additionalProperties": {"type": "string"}})
    answer = {"verdict": "approve"} | {f"k{i}": 0 for i in range(MANY_KEYS)}

    resp = client.post(
        "/v1/runs/r1/steps/1/answer",
        data=json.dumps(answer),
        headers=QA,
        content_type="application/json",
    )

    assert resp.status_code == 422
    assert error_of(resp) == (
        "schema violation: $.k0: 0 is not of type 'string'; $.k1: 0 is not of type 'string'; "
        "$.k2: 0 is not of type 'string'; and more"
    )
    assert built_errors[0] <= 4
    assert one(sql, "select state from steps where seq = 1") == {"state": "ASKED"}


def test_an_answer_that_violates_its_schema_is_422_while_another_transaction_holds_the_run(
    app, client, sql, db_url
):
    # The run's row is locked by another connection for the whole request: an answer validated
    # inside its transaction would wait there (and show up in pg_locks as not granted).
    asking(client, DECISION)
    reply: list[Any] = []
    waited = False
    with psycopg.connect(to_libpq_url(db_url)) as holder:
        holder.execute("select 1 from runs where run_id = 'r1' for update")
        answerer = threading.Thread(
            target=lambda: reply.append(
                client_of(app).post(
                    "/v1/runs/r1/steps/1/answer", json={"verdict": "maybe"}, headers=QA
                )
            ),
            daemon=True,
        )
        answerer.start()
        while answerer.is_alive() and not waited:
            waited = scalar(sql, WAITING) > 0
            answerer.join(0.01)
        holder.rollback()  # lets a waiting answer go on, so the test ends either way
    answerer.join(30)

    assert not waited, "the answer waited on the run's row lock"
    assert reply and reply[0].status_code == 422
    assert (
        error_of(reply[0])
        == "schema violation: $.verdict: 'maybe' is not one of ['approve', 'reject']"
    )
    assert one(sql, "select state from steps where seq = 1") == {"state": "ASKED"}


def test_a_valid_answer_is_still_taken_and_stored(client, sql):
    asking(client, DECISION)

    resp = client.post("/v1/runs/r1/steps/1/answer", json={"verdict": "approve"}, headers=QA)

    assert resp.status_code == 200, resp.get_json()
    assert one(sql, "select state, answered_by from steps where seq = 1") == {
        "state": "DONE",
        "answered_by": "qa@example.com",
    }
