"""Asks (docs/contract.md#ask): an ask step is raised when its needs are met, announced by a
webhook, listed for answerers and answered into the blob named by its ``out``.

Webhooks go to a real HTTP server on 127.0.0.1 (port 0) and are awaited with a threading.Event; time
passes only in the database (deadlines are moved back with SQL, then the reaper's pass runs).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from app.services.reaper import reap_pass
from tests.support.actors import Answerer, cap
from tests.support.agent import advertise, claim, claimed, report, run_step
from tests.support.apps import app_on, client_of
from tests.support.contracts import contract, role
from tests.support.processes import free_port
from tests.support.record_contents import blob_files
from tests.support.rows import attempts, step_row
from tests.support.submitter import state_of, submit
from tests.support.webhooks import Endpoint, Request
from tests.support.wire import when

MAX_BLOB = 64 * 1024
QA = {"X-Enode-Principal": "qa@example.com"}
DEV = {"X-Enode-Principal": "dev@example.com"}
NOT_WAITING = {"error": {"code": 409, "reason": "step is not awaiting an answer"}}
NOT_ANSWERER = {"error": {"code": 403, "reason": "principal is not an allowed answerer"}}
PROMPT = "Boot log looks right?"
DECISION = {
    "type": "object",
    "required": ["verdict"],
    "properties": {"verdict": {"enum": ["approve", "reject"]}},
}
APPROVE = b'{"verdict": "approve"}'


# ---------------------------------------------------------------- the webhook receiver


class Hook:
    """A real receiver for ``notify.asks_url``. ``answer`` replies 200; ``hang`` takes the request
    and holds it without replying until teardown; ``refuse`` is a port nothing listens on."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._arrived: dict[tuple[str, int], threading.Event] = {}
        self.endpoint: Endpoint | None = None
        if mode == "refuse":
            # A port that nothing listens on: a connection to it is refused.
            origin = f"http://127.0.0.1:{free_port()}"
        else:
            self.endpoint = Endpoint(self._answer)
            origin = self.endpoint.origin
        self.url = f"{origin}/hooks/asks"

    def arrived(self, run_id: str, seq: int) -> threading.Event:
        """Set when the webhook of that ask has been received."""
        with self._lock:
            return self._arrived.setdefault((run_id, seq), threading.Event())

    def bodies_of(self, run_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return [b for b in self.bodies if b.get("run_id") == run_id]

    def _received(self, path: str, body: dict[str, Any]) -> None:
        with self._lock:
            self.paths.append(path)
            self.bodies.append(body)
        self.arrived(body.get("run_id"), body.get("seq")).set()

    def _answer(self, h: Request) -> None:
        self._received(h.path, json.loads(h.body))
        if self.mode == "hang":
            self.release.wait(30)
        try:
            h.send_response(200)
            h.end_headers()
        except OSError:
            pass  # the Mediator gave up waiting, as it should

    def close(self) -> None:
        self.release.set()
        if self.endpoint is not None:
            self.endpoint.close()


@pytest.fixture
def hook(request: Any) -> Any:
    h = Hook(getattr(request, "param", "answer"))
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def config_overrides(hook: Hook) -> dict[str, Any]:
    return {"notify.asks_url": hook.url, "max_blob_bytes": MAX_BLOB}


# ---------------------------------------------------------------- contracts and rows


def ask_step(step_id: str = "sign-off", **ask: Any) -> dict[str, Any]:
    return {
        "id": step_id,
        "ask": {"prompt": PROMPT, **ask},
        "out": ["decision"],
        "schema": {"decision": DECISION},
    }


def ask_first(run_id: str, **ask: Any) -> dict[str, Any]:
    """An ask that needs nothing (raised at creation), then a board step after it."""
    steps = [ask_step(**ask), {"id": "flash", "uses": "dut", "run": ["flash-image"]}]
    return contract(run_id, role("dut"), steps=steps)


def ask_after_build(run_id: str, **ask: Any) -> dict[str, Any]:
    """A board step, then the ask that needs it; the run succeeds when the answer is stored."""
    steps = [{"id": "build", "uses": "dut", "run": ["build"]}, ask_step(**ask)]
    return contract(
        run_id,
        role("dut"),
        steps=steps,
        success_when=[{"step": "sign-off", "produced": ["decision"]}],
    )


def blob_rows(sql: Any, run_id: str) -> list[tuple[Any, ...]]:
    return [
        tuple(r)
        for r in sql.execute(
            "select seq, attempt, name, by, bytes from blobs where run_id = %s order by seq, name",
            (run_id,),
        )
    ]


def answer(client: Any, run_id: str, seq: int, body: bytes = APPROVE, headers: Any = None) -> Any:
    return Answerer(client).answer(run_id, seq, body, headers if headers is not None else QA)


def open_asks(client: Any, headers: Any = None) -> list[dict[str, Any]]:
    resp = client.get("/v1/asks", headers=headers or {})
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()["asks"]


# ---------------------------------------------------------------- raising asks


def test_an_ask_whose_needs_are_met_at_creation_is_asked_with_a_deadline_of_now_plus_timeout(
    client, sql, hook
):
    advertise(client, "n1", cap("board"))

    submit(client, ask_first("r1", timeout={"after": "4h", "then": "fail"}), 201)

    row = step_row(sql, "r1", 1)
    assert row["state"] == "ASKED" and row["asked_at"] is not None
    assert sql.execute(
        "select ask_deadline - asked_at = interval '4 hours', asked_at <= now()"
        " from steps where run_id = 'r1' and seq = 1"
    ).fetchone() == (True, True)
    assert step_row(sql, "r1", 2)["state"] == "PENDING"


def test_an_ask_without_a_timeout_has_no_deadline(client, sql, hook):
    advertise(client, "n1", cap("board"))

    submit(client, ask_first("r1"), 201)

    row = step_row(sql, "r1", 1)
    assert row["state"] == "ASKED" and row["ask_deadline"] is None
    assert "deadline" not in open_asks(client)[0]


def test_the_ask_webhook_carries_the_ask_its_deadline_and_where_to_answer(client, sql, hook):
    advertise(client, "n1", cap("board"))

    doc = ask_first("r1", answerers=["qa@example.com"], timeout={"after": "4h", "then": "fail"})
    submit(client, doc, 201)

    assert hook.arrived("r1", 1).wait(5)
    [body] = hook.bodies_of("r1")
    deadline = body.pop("deadline")
    assert body == {
        "event": "ask",
        "run_id": "r1",
        "seq": 1,
        "step": "sign-off",
        "prompt": PROMPT,
        "answerers": ["qa@example.com"],
        "answer_path": "/v1/runs/r1/steps/1/answer",
    }
    assert when(deadline) == step_row(sql, "r1", 1)["ask_deadline"]
    assert hook.paths == ["/hooks/asks"]


def test_the_ask_webhook_leaves_out_answerers_and_deadline_when_the_ask_has_none(client, hook):
    advertise(client, "n1", cap("board"))

    submit(client, ask_first("r1"), 201)

    assert hook.arrived("r1", 1).wait(5)
    [body] = hook.bodies_of("r1")
    assert set(body) == {"event", "run_id", "seq", "step", "prompt", "answer_path"}


def test_ui_public_url_adds_the_asks_page_to_the_webhook(db_url, tmp_path, hook):
    """Where the pages are (``ui.public_url``) gives the notification a ``page_url``
    (docs/pages.md#asks-asks)."""
    keys = {"notify.asks_url": hook.url, "ui.public_url": "https://mediator.lab.test/"}
    with app_on(db_url, tmp_path / "records", **keys) as app:
        client = client_of(app)
        advertise(client, "n1", cap("board"))
        submit(client, ask_first("r1"), 201)
        assert hook.arrived("r1", 1).wait(5)
    [body] = hook.bodies_of("r1")
    assert body["page_url"] == "https://mediator.lab.test/asks#ask-r1-1"


def test_an_ask_waits_for_its_needs_and_is_raised_by_the_result_that_meets_them(client, sql, hook):
    advertise(client, "n1", cap("board"))
    submit(client, ask_after_build("r1"), 201)
    row = step_row(sql, "r1", 2)
    assert row["state"] == "PENDING" and row["asked_at"] is None
    assert open_asks(client) == []

    assert run_step(client, "n1", "r1", 1, "n1-i") == {"run_id": "r1", "seq": 1, "run_state": ""}

    row = step_row(sql, "r1", 2)
    assert row["state"] == "ASKED" and row["asked_at"] is not None
    assert hook.arrived("r1", 2).wait(5)
    assert [(a["run_id"], a["seq"]) for a in open_asks(client)] == [("r1", 2)]


def test_a_queued_run_raises_no_ask_until_it_is_promoted(client, sql, hook):
    advertise(client, "n1", cap("board"))
    submit(client, contract("blocker"), 201)

    submit(client, ask_first("r2"), 202)

    row = step_row(sql, "r2", 1)
    assert row["state"] == "PENDING" and row["asked_at"] is None
    assert open_asks(client) == []
    assert client.post("/v1/runs/blocker/cancel").status_code == 200
    assert state_of(client, "r2") == "RUNNING"
    assert step_row(sql, "r2", 1)["state"] == "ASKED"
    assert hook.arrived("r2", 1).wait(5)
    assert len(hook.bodies_of("r2")) == 1  # announced once, at promotion


@pytest.mark.parametrize("hook", ["refuse"], indirect=True)
def test_a_webhook_url_that_refuses_connections_fails_neither_the_submit_nor_the_answer(
    client, sql, hook
):
    advertise(client, "n1", cap("board"))
    doc = contract("r1", role("dut"), steps=[ask_step("first"), ask_step("second")])

    assert submit(client, doc, 201).get_json()["state"] == "RUNNING"
    assert step_row(sql, "r1", 1)["state"] == "ASKED"
    resp = answer(client, "r1", 1)

    assert resp.status_code == 200 and resp.get_json() == {
        "run_id": "r1",
        "seq": 1,
        "run_state": "",
    }
    assert step_row(sql, "r1", 2)["state"] == "ASKED"


@pytest.mark.parametrize("hook", ["hang"], indirect=True)
def test_a_webhook_that_hangs_holds_up_neither_the_submit_nor_the_answer(client, sql, hook):
    advertise(client, "n1", cap("board"))
    doc = contract("r1", role("dut"), steps=[ask_step("first"), ask_step("second")])

    # The receiver never answers while the test runs: a request that waited for it would last at
    # least the webhook's own time-out (seconds), so the bound below tells waiting from not.
    started = time.monotonic()
    submit(client, doc, 201)
    submit_took = time.monotonic() - started
    assert hook.arrived("r1", 1).wait(5)  # the webhook is out, and held

    started = time.monotonic()
    resp = answer(client, "r1", 1)
    answer_took = time.monotonic() - started
    assert hook.arrived("r1", 2).wait(5)

    assert resp.status_code == 200 and resp.get_json() == {
        "run_id": "r1",
        "seq": 1,
        "run_state": "",
    }
    assert submit_took < 2.0 and answer_took < 2.0


# ---------------------------------------------------------------- GET /v1/asks


def test_open_asks_are_listed_oldest_first_with_their_fields(client, sql, hook):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    doc = ask_first("r-a", answerers=["qa@example.com"], timeout={"after": "4h", "then": "fail"})
    submit(client, doc, 201)
    submit(client, ask_first("r-b"), 201)
    # r-b was asked later; make it the oldest, so the order is by asked_at, not by submission.
    sql.execute("update steps set asked_at = asked_at - interval '1 hour' where run_id = 'r-b'")

    asks = open_asks(client, QA)

    assert [a["run_id"] for a in asks] == ["r-b", "r-a"]
    b, a = asks
    a_row, b_row = step_row(sql, "r-a", 1), step_row(sql, "r-b", 1)
    assert when(a.pop("asked_at")) == a_row["asked_at"]
    assert when(a.pop("deadline")) == a_row["ask_deadline"]
    assert a == {
        "run_id": "r-a",
        "seq": 1,
        "step": "sign-off",
        "prompt": PROMPT,
        "schema": DECISION,
        "answerers": ["qa@example.com"],
        "can_answer": True,
    }
    assert when(b.pop("asked_at")) == b_row["asked_at"]
    assert b == {
        "run_id": "r-b",
        "seq": 1,
        "step": "sign-off",
        "prompt": PROMPT,
        "schema": DECISION,
        "can_answer": True,
    }


def test_the_ask_of_a_cancelled_run_is_no_longer_listed(client, hook):
    advertise(client, "n1", cap("board"))
    submit(client, ask_first("r1"), 201)
    assert len(open_asks(client)) == 1

    assert client.post("/v1/runs/r1/cancel").status_code == 200

    assert open_asks(client) == []


def test_can_answer_is_true_only_for_a_principal_among_the_answerers(client, hook):
    advertise(client, "n1", cap("board"))
    submit(client, ask_first("r1", answerers=["qa@example.com"]), 201)

    seen = [open_asks(client, headers)[0]["can_answer"] for headers in (QA, DEV, {})]

    assert seen == [True, False, False]


def test_can_answer_is_true_for_anyone_when_the_ask_names_no_answerers(client, hook):
    advertise(client, "n1", cap("board"))
    submit(client, ask_first("r1"), 201)

    seen = [open_asks(client, headers)[0]["can_answer"] for headers in (QA, DEV, {})]

    assert seen == [True, True, True]


def test_shown_inlines_the_listed_artifacts_of_earlier_steps_cut_at_32_kib(client, hook):
    advertise(client, "n1", cap("board"))
    steps = [
        {"id": "boot", "uses": "dut", "run": ["boot-test"], "out": ["boot.log", "summary.txt"]},
        ask_step(show=["boot.log", "summary.txt"]),
    ]
    submit(client, contract("r1", role("dut"), steps=steps), 201)
    claimed(client, "n1", "i1")
    big = b"".join(b"boot line %05d\n" % i for i in range(3000))  # 45,000 bytes
    assert client.put("/v1/runs/r1/steps/1/blob/boot.log", data=big).status_code == 204
    assert client.put("/v1/runs/r1/steps/1/blob/summary.txt", data=b"all good\n").status_code == 204
    resp = report(client, "r1", 1, "n1", produced=["boot.log", "summary.txt"])
    assert resp.status_code == 200

    [ask] = open_asks(client)

    log, summary = ask["shown"]
    assert log["name"] == "boot.log" and log["truncated"] is True
    assert log["content"] == big[: 32 * 1024].decode()
    assert summary["name"] == "summary.txt" and summary["content"] == "all good\n"
    assert not summary.get("truncated")


# ---------------------------------------------------------------- answers refused


def test_answering_a_step_that_is_not_an_ask_is_409_and_changes_nothing(client, sql, hook):
    advertise(client, "n1", cap("board"))
    submit(client, ask_after_build("r1"), 201)

    resp = answer(client, "r1", 1)

    assert resp.status_code == 409 and resp.get_json() == NOT_WAITING
    assert step_row(sql, "r1", 1)["state"] == "PENDING"
    assert blob_rows(sql, "r1") == []


def test_answering_an_ask_whose_needs_are_not_met_is_409(client, sql, hook):
    advertise(client, "n1", cap("board"))
    submit(client, ask_after_build("r1"), 201)

    resp = answer(client, "r1", 2)

    assert resp.status_code == 409 and resp.get_json() == NOT_WAITING
    assert step_row(sql, "r1", 2)["state"] == "PENDING"
    assert blob_rows(sql, "r1") == []


def test_answering_an_ask_of_a_queued_run_is_409(client, sql, hook):
    advertise(client, "n1", cap("board"))
    submit(client, contract("blocker"), 201)
    submit(client, ask_first("r2"), 202)

    resp = answer(client, "r2", 1)

    assert resp.status_code == 409 and resp.get_json() == NOT_WAITING
    assert step_row(sql, "r2", 1)["state"] == "PENDING"
    assert blob_rows(sql, "r2") == []


def test_answering_an_ask_of_a_finished_run_is_409(client, sql, ctx, hook):
    advertise(client, "n1", cap("board"))
    submit(client, ask_first("r1"), 201)
    assert client.post("/v1/runs/r1/cancel").status_code == 200

    resp = answer(client, "r1", 1)

    assert resp.status_code == 409 and resp.get_json() == NOT_WAITING
    assert step_row(sql, "r1", 1)["state"] == "FAILED"
    assert blob_rows(sql, "r1") == [] and blob_files(ctx, "r1") == []


def test_answering_an_unknown_run_or_step_is_409(client, hook):
    advertise(client, "n1", cap("board"))
    submit(client, ask_first("r1"), 201)

    unknown_seq = answer(client, "r1", 9)
    unknown_run = answer(client, "nope", 1)
    never_valid = answer(client, "r1%00", 1)  # an id no run can have (docs/api.md#conventions)

    assert unknown_seq.status_code == 409 and unknown_seq.get_json() == NOT_WAITING
    assert unknown_run.status_code == 409 and unknown_run.get_json() == NOT_WAITING
    assert never_valid.status_code == 409 and never_valid.get_json() == NOT_WAITING


def test_answering_twice_is_409_and_keeps_the_first_answer(client, sql, hook):
    advertise(client, "n1", cap("board"))
    submit(client, ask_first("r1"), 201)
    assert answer(client, "r1", 1).status_code == 200

    resp = answer(client, "r1", 1, b'{"verdict": "reject"}', DEV)

    assert resp.status_code == 409 and resp.get_json() == NOT_WAITING
    assert client.get("/v1/runs/r1/blob/decision").data == APPROVE
    assert step_row(sql, "r1", 1)["answered_by"] == "qa@example.com"


def test_a_principal_not_among_the_answerers_is_403_and_nothing_is_stored(client, sql, ctx, hook):
    advertise(client, "n1", cap("board"))
    submit(client, ask_first("r1", answerers=["qa@example.com"]), 201)

    other = answer(client, "r1", 1, headers=DEV)
    nobody = answer(client, "r1", 1, headers={})

    assert other.status_code == 403 and other.get_json() == NOT_ANSWERER
    assert nobody.status_code == 403 and nobody.get_json() == NOT_ANSWERER
    assert step_row(sql, "r1", 1)["state"] == "ASKED"
    assert blob_rows(sql, "r1") == [] and blob_files(ctx, "r1") == []


def test_an_answer_over_max_blob_bytes_is_413_and_the_ask_stays_open(client, sql, ctx, hook):
    advertise(client, "n1", cap("board"))
    submit(client, ask_first("r1"), 201)
    body = json.dumps({"verdict": "approve", "note": "x" * MAX_BLOB}).encode()

    resp = answer(client, "r1", 1, body)

    assert resp.status_code == 413 and resp.get_json()["error"]["code"] == 413
    assert step_row(sql, "r1", 1)["state"] == "ASKED"
    assert blob_rows(sql, "r1") == [] and blob_files(ctx, "r1") == []
    assert [a["run_id"] for a in open_asks(client)] == ["r1"]


def test_an_answer_that_violates_the_schema_is_422_stores_nothing_and_the_ask_stays_open(
    client, sql, ctx, hook
):
    advertise(client, "n1", cap("board"))
    submit(client, ask_first("r1"), 201)

    resp = answer(client, "r1", 1, b'{"verdict": "maybe"}')

    assert resp.status_code == 422
    error = resp.get_json()["error"]
    assert error["code"] == 422
    assert error["reason"].startswith("schema violation: ") and "verdict" in error["reason"]
    assert step_row(sql, "r1", 1)["state"] == "ASKED"
    assert blob_rows(sql, "r1") == [] and blob_files(ctx, "r1") == []
    assert client.get("/v1/runs/r1/blob/decision").status_code == 404
    assert [a["run_id"] for a in open_asks(client)] == ["r1"]


def test_an_answer_missing_a_required_field_is_422_schema_violation(client, sql, hook):
    advertise(client, "n1", cap("board"))
    submit(client, ask_first("r1"), 201)

    resp = answer(client, "r1", 1, b"{}")

    assert resp.status_code == 422
    assert resp.get_json()["error"]["reason"].startswith("schema violation: ")
    assert step_row(sql, "r1", 1)["state"] == "ASKED"


def test_an_answer_that_is_not_json_is_400_and_the_ask_stays_open(client, sql, hook):
    advertise(client, "n1", cap("board"))
    submit(client, ask_first("r1"), 201)

    resp = answer(client, "r1", 1, b"approve")

    assert resp.status_code == 400 and resp.get_json()["error"]["code"] == 400
    assert step_row(sql, "r1", 1)["state"] == "ASKED"
    assert blob_rows(sql, "r1") == []


# ---------------------------------------------------------------- answers accepted


def test_an_answer_is_stored_as_the_out_blob_and_the_step_is_done_by_the_principal(
    client, sql, hook
):
    advertise(client, "n1", cap("board"))
    submit(client, ask_first("r1", answerers=["qa@example.com"]), 201)

    resp = answer(client, "r1", 1)

    assert resp.status_code == 200
    assert resp.get_json() == {"run_id": "r1", "seq": 1, "run_state": ""}
    blob = client.get("/v1/runs/r1/blob/decision")
    assert blob.status_code == 200 and blob.data == APPROVE
    row = step_row(sql, "r1", 1)
    assert (row["state"], row["answered_by"]) == ("DONE", "qa@example.com")
    assert blob_rows(sql, "r1") == [(1, 0, "decision", "qa@example.com", len(APPROVE))]
    assert open_asks(client) == []


def test_an_answer_lets_the_steps_that_need_it_run(client, hook):
    advertise(client, "n1", cap("board"))
    submit(client, ask_first("r1"), 201)
    assert claim(client, "n1").status_code == 204

    assert answer(client, "r1", 1).status_code == 200

    resp = claim(client, "n1")
    assert resp.status_code == 200 and resp.get_json()["name"] == "flash"


def test_an_answer_raises_the_asks_it_unblocks_and_announces_them(client, sql, hook):
    advertise(client, "n1", cap("board"))
    doc = contract("r1", role("dut"), steps=[ask_step("first"), ask_step("second")])
    submit(client, doc, 201)
    assert step_row(sql, "r1", 2)["state"] == "PENDING"

    assert answer(client, "r1", 1).status_code == 200

    assert step_row(sql, "r1", 2)["state"] == "ASKED"
    assert hook.arrived("r1", 2).wait(5)
    [ask] = open_asks(client)
    assert (ask["seq"], ask["step"]) == (2, "second")


def test_an_answer_that_finishes_the_run_settles_it_by_success_when(client, sql, hook):
    advertise(client, "n1", cap("board"))
    submit(client, ask_after_build("r1"), 201)
    run_step(client, "n1", "r1", 1, "n1-i")

    resp = answer(client, "r1", 2)

    assert resp.status_code == 200
    assert resp.get_json() == {"run_id": "r1", "seq": 2, "run_state": "SUCCEEDED"}
    view = client.get("/v1/runs/r1").get_json()
    assert view["state"] == "SUCCEEDED"
    assert [(c["what"], c["ok"]) for c in view["verdict"]["checks"]] == [("produced", True)]
    assert sql.execute("select count(*) from leases").fetchone() == (0,)
    assert client.get("/v1/runs/r1/record").status_code == 200


def test_an_answer_to_a_run_whose_condition_is_unmet_settles_it_failed(client, hook):
    advertise(client, "n1", cap("board"))
    steps = [ask_step(), {"id": "flash", "uses": "dut", "run": ["flash"], "needs": []}]
    doc = contract("r1", role("dut"), steps=steps, success_when=[{"step": "flash", "exit_code": 0}])
    submit(client, doc, 201)
    assert claimed(client, "n1", "i1")["name"] == "flash"
    assert report(client, "r1", 2, "n1", exit_code=3).get_json()["run_state"] == ""

    resp = answer(client, "r1", 1)

    assert resp.status_code == 200
    assert resp.get_json() == {"run_id": "r1", "seq": 1, "run_state": "FAILED"}
    assert state_of(client, "r1") == "FAILED"


def test_an_ask_step_reset_by_a_rollback_is_asked_again_and_can_be_answered(client, sql):
    advertise(client, "n1", cap())
    doc = contract(
        "r1",
        role("dut"),
        steps=[
            {
                "id": "approve",
                "ask": {"prompt": "Build it?"},
                "out": ["decision"],
                "schema": {
                    "decision": {"type": "object", "properties": {"go": {"type": "boolean"}}}
                },
            },
            {
                "id": "build",
                "uses": "dut",
                "run": ["make"],
                "loop": {"back_to": "approve", "max": 3, "until": {"exit_code": 0}},
            },
        ],
    )
    submit(client, doc, 201)
    first = client.post("/v1/runs/r1/steps/1/answer", json={"go": True})
    assert first.status_code == 200, first.get_json()
    assert claimed(client, "n1")["name"] == "build"
    rolled = report(client, "r1", 2, "n1", exit_code=1)
    assert rolled.get_json() == {"run_id": "r1", "seq": 2, "rolled_back": True}

    assert attempts(sql, "r1") == {"approve": ("ASKED", 1), "build": ("PENDING", 1)}
    asks = client.get("/v1/asks").get_json()["asks"]
    assert [(a["run_id"], a["seq"], a["step"]) for a in asks] == [("r1", 1, "approve")]
    again = client.post("/v1/runs/r1/steps/1/answer", json={"go": True})
    assert again.status_code == 200, again.get_json()
    assert again.get_json() == {"run_id": "r1", "seq": 1, "run_state": ""}
    build = claimed(client, "n1")
    assert (build["name"], build["attempt"]) == ("build", 1)


# ---------------------------------------------------------------- deadlines


def test_the_reaper_fails_an_ask_past_its_deadline_and_settles_its_run(client, ctx, sql, hook):
    advertise(client, "n1", cap("board"))
    submit(client, ask_first("r1", timeout={"after": "1h", "then": "fail"}), 201)
    sql.execute(
        "update steps set ask_deadline = now() - interval '1 second' where run_id = 'r1' and seq = 1"
    )

    report = reap_pass(ctx)

    assert report.asks_expired == 1
    row = step_row(sql, "r1", 1)
    assert (row["state"], row["error"]) == ("FAILED", "ask deadline passed")
    assert state_of(client, "r1") == "FAILED"
    assert open_asks(client) == []
    assert answer(client, "r1", 1).get_json() == NOT_WAITING
    assert sql.execute("select count(*) from leases").fetchone() == (0,)
