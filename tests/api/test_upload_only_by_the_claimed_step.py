"""Artifacts are written only by the step that makes them: a log or blob upload is taken only for a
step of kind ``run`` or ``agent`` that is CLAIMED, in its current attempt, by the node it is bound
to; anything else is 409 ``step is not claimed``, after 403, 404 and 410, and stores nothing. The
blobs the Mediator writes itself (an ask's answer, an acquire's outcome) are never replaced by an
upload, nor stood in for by one. A progress chunk of an attempt older than the step's keeps its 200
and stores nothing."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from app.config import to_libpq_url
from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done
from tests.support.apps import client_of
from tests.support.contracts import acquire_run, contract, role
from tests.support.rows import rows, step_row
from tests.support.submitter import submit
from tests.support.tokens import ENTRIES, as_role, forbidden

NOT_CLAIMED = {"error": {"code": 409, "reason": "step is not claimed"}}
GONE = {"error": {"code": 410, "reason": "run has already finished"}}
QA = {"X-Enode-Principal": "qa@example.com"}
DECISION = {
    "type": "object",
    "required": ["verdict"],
    "properties": {"verdict": {"enum": ["approve", "reject"]}},
}
REJECT = b'{"verdict": "reject"}'
APPROVE = b'{"verdict": "approve"}'
RESULT_SCHEMA = {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}


# ---------------------------------------------------------------- builders


def build_then_test(run_id: str = "r1", **loop: Any) -> dict[str, Any]:
    """build then test on one board; test declares ``result.json`` with a schema."""
    test: dict[str, Any] = {
        "id": "test",
        "uses": "dut",
        "run": ["test"],
        "out": ["result.json"],
        "schema": {"result.json": RESULT_SCHEMA},
    }
    if loop:
        test["loop"] = loop
    steps = [{"id": "build", "uses": "dut", "run": ["build"], "out": ["image.bin"]}, test]
    return contract(run_id, role("dut"), steps=steps)


def ask_after_build(run_id: str = "r1") -> dict[str, Any]:
    """build, then a sign-off ask whose answer is the ``decision`` blob, then flash."""
    steps = [
        {"id": "build", "uses": "dut", "run": ["build"]},
        {
            "id": "sign-off",
            "ask": {"prompt": "Ship it?"},
            "out": ["decision"],
            "schema": {"decision": DECISION},
        },
        {"id": "flash", "uses": "dut", "run": ["flash"]},
    ]
    return contract(run_id, role("dut"), steps=steps)


def put_blob(client: Any, seq: int, name: str, data: bytes, run_id: str = "r1") -> Any:
    return client.put(f"/v1/runs/{run_id}/steps/{seq}/blob/{name}", data=data)


def put_log(client: Any, seq: int, data: bytes, query: str = "") -> Any:
    return client.put(f"/v1/runs/r1/steps/{seq}/log{query}", data=data)


def blob_rows(sql: Any) -> list[tuple[Any, ...]]:
    return [
        (r["seq"], r["attempt"], r["name"], r["by"], r["bytes"], r["sha256"])
        for r in rows(sql, "select * from blobs where run_id = 'r1' order by seq, attempt, name")
    ]


def log_bytes(client: Any, seq: int, name: str = "step") -> bytes:
    resp = client.get(f"/v1/runs/r1/steps/{seq}/log?name={name}")
    assert resp.status_code == 200
    return resp.data


def conflict(resp: Any) -> None:
    assert (resp.status_code, resp.get_json()) == (409, NOT_CLAIMED)


# ---------------------------------------------------------------- what the Mediator wrote itself


def test_an_upload_cannot_replace_the_answer_a_person_gave_to_an_ask(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, ask_after_build(), 201)
    assert claimed(client, "n1")["name"] == "build"
    done(client, "r1", 1, "n1")
    answered = client.post(
        "/v1/runs/r1/steps/2/answer", data=REJECT, content_type="application/json", headers=QA
    )
    assert answered.status_code == 200, answered.get_json()
    before = blob_rows(sql)

    resp = put_blob(client, 2, "decision", APPROVE)

    conflict(resp)
    assert client.get("/v1/runs/r1/blob/decision").data == REJECT
    assert blob_rows(sql) == before
    assert [(r[2], r[3]) for r in before] == [("decision", "qa@example.com")]


def test_an_upload_cannot_replace_the_outcome_of_an_acquire_step(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    submit(client, acquire_run(), 201)
    assert claimed(client, "n1")["name"] == "prep"
    done(client, "r1", 1, "n1")
    outcome = client.get("/v1/runs/r1/blob/grab").data
    assert outcome == b'{"node": "s1", "state": "acquired"}'
    before = blob_rows(sql)

    resp = put_blob(client, 2, "grab", b'{"state": "unavailable"}')

    conflict(resp)
    assert client.get("/v1/runs/r1/blob/grab").data == outcome
    assert blob_rows(sql) == before


def test_a_blob_another_step_names_after_an_acquire_step_never_stands_for_its_outcome(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    submit(client, acquire_run(), 201)
    assert claimed(client, "n1")["name"] == "prep"
    done(client, "r1", 1, "n1")
    outcome = client.get("/v1/runs/r1/blob/grab").data
    assert outcome == b'{"node": "s1", "state": "acquired"}'
    assert claimed(client, "s1")["name"] == "measure"

    # Any valid name may be uploaded by a claimed step; it is stored under that step.
    resp = put_blob(client, 3, "grab", b'{"state": "unavailable"}')

    assert resp.status_code == 204
    assert client.get("/v1/runs/r1/blob/grab").data == outcome
    assert [(r[0], r[2], r[3]) for r in blob_rows(sql)] == [
        (2, "grab", "mediator"),
        (3, "grab", "s1"),
    ]


# ---------------------------------------------------------------- steps not claimed


def test_a_blob_upload_for_a_step_never_claimed_is_409_and_stores_nothing(client, sql, ctx):
    advertise(client, "n1", cap("board"))
    submit(client, build_then_test(), 201)

    resp = put_blob(client, 1, "image.bin", b"image")

    conflict(resp)
    assert blob_rows(sql) == []
    assert not (ctx.records.path("r1") / "blobs").exists()


def test_a_log_upload_for_a_step_never_claimed_is_409_and_appends_nothing(client):
    advertise(client, "n1", cap("board"))
    submit(client, build_then_test(), 201)

    final = put_log(client, 1, b"not yet\n")
    progress = put_log(client, 1, b"not yet\n", "?progress=1&attempt=0")

    conflict(final)
    conflict(progress)
    assert log_bytes(client, 1) == b""


def test_a_blob_upload_after_the_step_s_result_is_409_and_stores_nothing(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, build_then_test(), 201)
    assert claimed(client, "n1")["name"] == "build"
    assert put_blob(client, 1, "image.bin", b"image v1").status_code == 204
    done(client, "r1", 1, "n1", produced=["image.bin"])
    before = blob_rows(sql)

    resp = put_blob(client, 1, "image.bin", b"image v2")

    conflict(resp)
    assert client.get("/v1/runs/r1/blob/image.bin").data == b"image v1"
    assert blob_rows(sql) == before


def test_a_log_upload_after_the_step_s_result_is_409_and_appends_nothing(client):
    advertise(client, "n1", cap("board"))
    submit(client, build_then_test(), 201)
    assert claimed(client, "n1")["name"] == "build"
    assert put_log(client, 1, b"built\n").status_code == 200
    done(client, "r1", 1, "n1")

    final = put_log(client, 1, b"forged\n")
    progress = put_log(client, 1, b"forged\n", "?progress=1&attempt=0")

    conflict(final)
    conflict(progress)
    assert log_bytes(client, 1) == b"built\n"


def test_an_upload_is_409_before_its_schema_is_looked_at(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, build_then_test(), 201)

    resp = put_blob(client, 2, "result.json", b'{"ok": "not a boolean"}')

    conflict(resp)
    assert blob_rows(sql) == []


def test_a_progress_chunk_of_a_later_attempt_than_the_step_s_is_409(client):
    advertise(client, "n1", cap("board"))
    submit(client, build_then_test(), 201)
    assert claimed(client, "n1")["name"] == "build"

    resp = put_log(client, 1, b"from the future\n", "?progress=1&attempt=1")

    conflict(resp)
    assert log_bytes(client, 1) == b""


def test_a_progress_chunk_of_an_earlier_attempt_is_200_and_stores_nothing(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, build_then_test(back_to="build", max=2, until={"exit_code": 0}), 201)
    assert claimed(client, "n1")["name"] == "build"
    done(client, "r1", 1, "n1")
    assert claimed(client, "n1")["name"] == "test"
    assert done(client, "r1", 2, "n1", exit_code=1)["rolled_back"] is True
    assert step_row(sql, "r1", 1, "state, attempt") == {"state": "PENDING", "attempt": 1}

    late = put_log(client, 1, b"late line of attempt 0\n", "?progress=1&attempt=0")

    assert late.status_code == 200, late.get_json()
    assert late.headers["X-Enode-Log-Attempt"] == "1"
    assert late.headers["X-Enode-Log-Bytes"] == "0"
    assert log_bytes(client, 1) == b""


def test_the_claimed_step_s_own_uploads_are_taken_until_its_result(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, build_then_test(), 201)
    assert claimed(client, "n1")["name"] == "build"

    progress = put_log(client, 1, b"compiling\n", "?progress=1&attempt=0")
    final = put_log(client, 1, b"built\n")
    blob = put_blob(client, 1, "image.bin", b"image")

    assert (progress.status_code, final.status_code, blob.status_code) == (200, 200, 204)
    assert done(client, "r1", 1, "n1", produced=["image.bin"])["run_state"] == ""
    assert [(r[0], r[1], r[2], r[3]) for r in blob_rows(sql)] == [(1, 0, "image.bin", "n1")]


@pytest.mark.parametrize(
    "put",
    [
        pytest.param(lambda c: put_blob(c, 1, "image.bin", b"late image"), id="blob"),
        pytest.param(lambda c: put_log(c, 1, b"late line\n"), id="log"),
    ],
)
def test_an_upload_that_waited_for_the_step_s_result_is_409_and_stores_nothing(
    app, client, db_url, sql, put
):
    """The upload is checked again in its own transaction, after the run row it shares: a result
    that held the run when the upload came (its first lock) and ended the step meanwhile is seen,
    whatever the upload read before it waited."""
    advertise(client, "n1", cap("board"))
    submit(client, build_then_test(), 201)
    assert claimed(client, "n1")["name"] == "build"
    result = psycopg.connect(to_libpq_url(db_url))
    try:
        result.execute("select 1 from runs where run_id = 'r1' for update")
        answers: list[Any] = []
        uploader = threading.Thread(target=lambda: answers.append(put(client_of(app))))
        uploader.start()
        time.sleep(0.5)
        assert uploader.is_alive() and answers == []
        result.execute(
            "update steps set state = 'DONE', ended_at = now() where run_id = 'r1' and seq = 1"
        )
        result.commit()
        uploader.join(10)
    finally:
        result.close()

    assert [(a.status_code, a.get_json()) for a in answers] == [(409, NOT_CLAIMED)]
    assert blob_rows(sql) == []
    assert log_bytes(client, 1) == b""


# ---------------------------------------------------------------- the order of refusals


def test_an_unknown_step_is_404_and_a_finished_run_410_before_409(client):
    advertise(client, "n1", cap("board"))
    submit(client, build_then_test(), 201)

    unknown = put_blob(client, 7, "image.bin", b"x")
    assert unknown.status_code == 404
    assert client.post("/v1/runs/r1/cancel").status_code == 200
    finished = put_blob(client, 1, "image.bin", b"x")
    log = put_log(client, 2, b"x\n")

    assert (finished.status_code, finished.get_json()) == (410, GONE)
    assert (log.status_code, log.get_json()) == (410, GONE)


pytestmark = pytest.mark.config({"tokens": ENTRIES})


def test_a_token_bound_to_another_node_is_403_before_409(app, sql):
    operator = as_role(app, "operator")
    advertise(operator, "n1", cap("board"))
    submit(operator, build_then_test(), 201)
    n2 = as_role(app, "node-n2")

    blob = n2.put("/v1/runs/r1/steps/1/blob/image.bin", data=b"x")
    log = n2.put("/v1/runs/r1/steps/1/log", data=b"x\n")

    assert forbidden(blob) == "token node-n2 may not act for node n1"
    assert forbidden(log) == "token node-n2 may not act for node n1"
    assert blob_rows(sql) == []


def test_a_node_token_uploads_for_the_step_its_node_claimed(app, sql):
    operator = as_role(app, "operator")
    advertise(operator, "n1", cap("board"))
    submit(operator, build_then_test(), 201)
    n1 = as_role(app, "node-n1")
    assert claimed(n1, "n1")["name"] == "build"

    resp = n1.put("/v1/runs/r1/steps/1/blob/image.bin", data=b"image")

    assert resp.status_code == 204
    assert [(r[0], r[2], r[3]) for r in blob_rows(sql)] == [(1, "image.bin", "n1")]
