"""SPEC rules an audit found untested: promotion's lease-key conflict (§7), the claim's safety net,
listener reconnect and rollback notification (§8), an acquire's lease conflict (§8), the queue
explanation's counting (§7), the runs webhook on a cancel (§15), the wake-scan and request logs
(§15), an ask reset by a rollback (§10, §8), the at-boundary drain on a rollback (§4, §8), log and
blob PUTs of a sealed run (§11), and an invalid config at start-up (§15).

Real PostgreSQL throughout; waiting claims are awaited with threads and Events; the only polling
is of pg_stat_activity for a backend blocked on a lock (there is no event for that).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
import structlog

from app import create_app
from app.config import to_libpq_url
from app.match import candidate_order
from app.services.queue import Outcome, promote
from app.store.nodes import live_adverts
from app.store.queue import queued_shape_heads
from tests.apps import TOKEN, make_config
from tests.concurrency.common import await_condition
from tests.helpers import advertise, cap, contract, role, submit, two_steps
from tests.rows import one, scalar

ROOT = Path(__file__).resolve().parents[2]
# Far above every bound asserted below: a claim answered in time was not woken by the re-check.
SLOW_RECHECK = {"claim.recheck_seconds": 30.0}
FINISHED = {"error": {"code": 410, "reason": "run has already finished"}}


# ---------------------------------------------------------------- helpers


def claim(client: Any, node: str, instance: str | None = None, wait: float = 0) -> Any:
    headers = {"X-Enode-Instance": instance} if instance else {}
    return client.post(f"/v1/nodes/{node}/claim?wait={wait}", headers=headers)


def claimed(client: Any, node: str) -> dict[str, Any]:
    """Claim without the instance header; a step must be there."""
    resp = claim(client, node)
    assert resp.status_code == 200, (resp.status_code, resp.get_json())
    return resp.get_json()


def report(client: Any, run_id: str, seq: int, node: str, **body: Any) -> Any:
    payload = {"node": node, "exit_code": 0, "produced": [], **body}
    return client.post(f"/v1/runs/{run_id}/steps/{seq}/result", json=payload)


def step_states(sql: Any, run_id: str) -> dict[str, tuple[str, int]]:
    """step id -> (state, attempt)."""
    return {
        sid: (state, attempt)
        for sid, state, attempt in sql.execute(
            "select step_id, state, attempt from steps where run_id = %s order by seq", (run_id,)
        )
    }


def leases(sql: Any) -> list[tuple[str, str]]:
    return sql.execute("select node_id, run_id from leases order by node_id").fetchall()


def loop_run(run_id: str) -> dict[str, Any]:
    """build -> test, which loops back to build until its exit code is 0."""
    return contract(
        run_id,
        role("dut"),
        steps=[
            {"id": "build", "uses": "dut", "run": ["make"]},
            {
                "id": "test",
                "uses": "dut",
                "run": ["make", "check"],
                "loop": {"back_to": "build", "max": 3, "until": {"exit_code": 0}},
            },
        ],
    )


def new_client(app: Any) -> Any:
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {TOKEN}"
    return c


class WaitingClaim:
    """A claim long-polling in its own thread (no instance header); ``done`` is set once its
    answer is back."""

    def __init__(self, app: Any, node: str, wait: float) -> None:
        self.client = new_client(app)
        self.node, self.wait = node, wait
        self.done = threading.Event()
        self.resp: Any = None
        self.error: BaseException | None = None
        self.answered = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.resp = claim(self.client, self.node, None, self.wait)
        except BaseException as exc:
            self.error = exc
        finally:
            self.answered = time.monotonic()
            self.done.set()

    def start(self, ctx: Any) -> WaitingClaim:
        before = ctx.claims.waiting()
        self.thread.start()
        # Registered with the listener, and the listener connected (it wakes every waiter when it
        # connects): from here on only a notification or the re-check can wake this claim.
        await_condition(lambda: ctx.claims.waiting() > before or self.done.is_set(), "claim waits")
        await_condition(ctx.claims.connected.is_set, "claim listener connected")
        assert not self.done.is_set(), self.resp.status_code if self.resp else self.error
        return self

    def result(self, timeout: float = 20.0) -> Any:
        assert self.done.wait(timeout), "the waiting claim never answered"
        if self.error is not None:
            raise self.error
        return self.resp


class Background:
    """One call in a thread, its result or exception kept."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def result(self, timeout: float = 20.0) -> Any:
        assert self.done.wait(timeout), "the call never returned"
        if self.error is not None:
            raise self.error
        return self.value


class RunsHook:
    """A real local HTTP server receiving ``notify.runs_url`` POSTs."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.arrived = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(204)
                self.end_headers()
                hook.bodies.append(body)
                hook.arrived.set()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/runs"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def app_with(db_url: str, records: Path, **keys: Any) -> Iterator[Any]:
    application = create_app(make_config(db_url, records, **keys))
    try:
        yield application
    finally:
        application.extensions["mediator"].close()


# ---------------------------------------------------------------- a. §7 promote: lease-key conflict


def test_a_promotion_whose_node_was_taken_meanwhile_rolls_back_and_leaves_the_run_queued(
    client, ctx, sql
):
    advertise(client, "n1", cap())
    submit(client, contract("r1", role("dut")), 201)
    submit(client, contract("r2", role("dut")), 202)
    r1_before = one(sql, "select * from runs where run_id = 'r1'")
    r1_lease = one(sql, "select * from leases where node_id = 'n1'")
    r1_steps = step_states(sql, "r1")
    with ctx.db.read() as s:
        run = next(h for h in queued_shape_heads(s) if h.run_id == "r2")
        adverts = candidate_order(live_adverts(s))

    # A stale picture: as if n1 were free; the lease key must catch it.
    outcome = promote(ctx, run, adverts, set(), "test")[0]

    assert outcome is Outcome.NODE_TAKEN
    assert scalar(sql, "select state from runs where run_id = 'r2'") == "QUEUED"
    assert scalar(sql, "select assigned from runs where run_id = 'r2'") is None
    assert scalar(sql, "select count(*) from leases where run_id = 'r2'") == 0
    assert (
        scalar(sql, "select count(*) from run_events where run_id = 'r2' and to_state = 'RUNNING'")
        == 0
    )
    assert sql.execute("select node_id from steps where run_id = 'r2'").fetchall() == [(None,)]
    assert one(sql, "select * from runs where run_id = 'r1'") == r1_before
    assert one(sql, "select * from leases where node_id = 'n1'") == r1_lease
    assert step_states(sql, "r1") == r1_steps


# ---------------------------------------------------------------- b. §8 the claim's safety net


@pytest.mark.parametrize("config_overrides", [{"claim.recheck_seconds": 0.3}])
def test_a_step_made_claimable_without_a_notification_is_found_by_the_slow_recheck(
    app, client, ctx, sql
):
    advertise(client, "n1", cap())
    submit(client, two_steps("r1"), 201)
    assert claimed(client, "n1")["seq"] == 1
    waiting = WaitingClaim(app, "n1", wait=10).start(ctx)

    # A lost notification: the step becomes claimable and nobody says so.
    sql.execute("update steps set state = 'DONE', ended_at = now() where run_id = 'r1' and seq = 1")
    changed = time.monotonic()

    resp = waiting.result()
    assert resp.status_code == 200 and resp.get_json()["step_id"] == "r1#02"
    assert waiting.answered - changed < 5.0


# ---------------------------------------------------------------- c. §8 the listener reconnects


@pytest.mark.parametrize("config_overrides", [{"claim.recheck_seconds": 30.0}])
def test_a_listener_that_reconnects_rechecks_the_waiting_claims_at_once(app, client, ctx, sql):
    advertise(client, "n1", cap())
    submit(client, two_steps("r1"), 201)
    assert claimed(client, "n1")["seq"] == 1
    waiting = WaitingClaim(app, "n1", wait=15).start(ctx)
    # Claimable now, without a notification (as if sent while the listener was away).
    sql.execute("update steps set state = 'DONE', ended_at = now() where run_id = 'r1' and seq = 1")

    terminated = sql.execute(
        "select pg_terminate_backend(pid) from pg_stat_activity"
        " where application_name = 'mediator-listener' and datname = current_database()"
    ).fetchall()
    cut = time.monotonic()

    assert terminated == [(True,)]
    resp = waiting.result()
    assert resp.status_code == 200 and resp.get_json()["step_id"] == "r1#02"
    assert waiting.answered - cut < 8.0


# ---------------------------------------------------------------- d. §8 notify on a rollback


@pytest.mark.parametrize("config_overrides", [SLOW_RECHECK])
def test_a_waiting_claim_is_answered_soon_after_a_rollback_resets_a_step_of_its_node(
    app, client, ctx
):
    advertise(client, "n1", cap())
    submit(client, loop_run("r1"), 201)
    assert claimed(client, "n1")["name"] == "build"
    assert report(client, "r1", 1, "n1").status_code == 200
    assert claimed(client, "n1")["name"] == "test"
    waiting = WaitingClaim(app, "n1", wait=10).start(ctx)

    resp = report(client, "r1", 2, "n1", exit_code=1)
    reported = time.monotonic()

    assert resp.get_json() == {"run_id": "r1", "seq": 2, "rolled_back": True}
    got = waiting.result()
    assert got.status_code == 200
    assert (got.get_json()["step_id"], got.get_json()["attempt"]) == ("r1#01", 2)
    assert waiting.answered - reported < 3.0


# ---------------------------------------------------------------- e. §8 acquire: lease conflict


def test_an_acquire_whose_lease_insert_meets_a_concurrent_lease_means_unavailable(
    app, client, sql, db_url
):
    advertise(client, "n0", cap("other"))
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    submit(client, contract("r0", role("x", "other")), 201)
    doc = contract(
        "r1",
        role("dut"),
        steps=[
            {"id": "prep", "uses": "dut", "run": ["prep"]},
            {
                "id": "get-scope",
                "acquire": {
                    "want": {"as": "probe", "capability": "scope"},
                    "acquired": "with-scope",
                    "unavailable": "without-scope",
                },
                "needs": ["prep"],
            },
            {"id": "with-scope", "uses": "probe", "run": ["measure"], "needs": ["get-scope"]},
            {"id": "without-scope", "uses": "dut", "run": ["guess"], "needs": ["get-scope"]},
        ],
    )
    submit(client, doc, 201)
    assert claimed(client, "n1")["name"] == "prep"

    with psycopg.connect(to_libpq_url(db_url)) as other:
        # Another transaction takes s1 for r0 and has not committed yet.
        other.execute(
            "insert into leases (node_id, run_id, role, capability, not_after, nonce)"
            " values ('s1', 'r0', 'probe', 'scope', now() + interval '1 hour', %s)",
            ("f" * 32,),
        )
        reporting = Background(lambda: report(new_client(app), "r1", 1, "n1"))
        await_condition(
            lambda: (
                scalar(
                    sql,
                    "select count(*) from pg_stat_activity where datname = current_database()"
                    " and wait_event_type = 'Lock' and query ilike %s",
                    "insert into leases%",
                )
                > 0
                or reporting.done.is_set()
            ),
            "the acquire's lease insert to wait on the uncommitted lease",
        )
        assert not reporting.done.is_set(), "the result did not wait on the lease insert"
        other.commit()

        resp = reporting.result()

    assert resp.status_code == 200, resp.get_json()
    assert resp.get_json() == {"run_id": "r1", "seq": 1, "run_state": ""}
    assert step_states(sql, "r1") == {
        "prep": ("DONE", 1),
        "get-scope": ("DONE", 1),
        "with-scope": ("SKIPPED", 1),
        "without-scope": ("PENDING", 1),
    }
    blob = client.get("/v1/runs/r1/blob/get-scope")
    assert blob.status_code == 200 and json.loads(blob.data) == {"state": "unavailable"}
    assert scalar(sql, "select state from runs where run_id = 'r1'") == "RUNNING"
    assert leases(sql) == [("n0", "r0"), ("n1", "r1"), ("s1", "r0")]


# ---------------------------------------------------------------- f. §7 candidates counting


def test_a_candidate_both_busy_and_draining_counts_as_busy_only(client):
    advertise(client, "n1", cap())
    advertise(client, "n2", cap(), policy={"drain": "graceful"})
    submit(client, contract("r1", role("dut")), 201)
    advertise(client, "n1", cap(), policy={"drain": "graceful"})  # n1: busy with r1 and draining
    submit(client, contract("r2", role("dut")), 202)

    view = client.get("/v1/runs/r2").get_json()

    line = view["requires"][0]
    assert line["candidates"] == {"live": 2, "busy": 1, "draining": 1}
    assert line["held_by"] == ["r1"]


# ---------------------------------------------------------------- g. §15 notify.runs_url on cancel


def test_a_cancel_posts_the_run_end_to_notify_runs_url(db_url, tmp_path):
    hook = RunsHook()
    try:
        with app_with(db_url, tmp_path / "records", **{"notify.runs_url": hook.url}) as app:
            client = new_client(app)
            advertise(client, "n1", cap())
            submit(client, contract("r1", role("dut")), 201)

            resp = client.post(
                "/v1/runs/r1/cancel", headers={"X-Enode-Principal": "alice@example.com"}
            )

            assert resp.status_code == 200
            assert hook.arrived.wait(10), "no run webhook arrived"
            assert hook.bodies == [
                {
                    "event": "run",
                    "run_id": "r1",
                    "state": "FAILED",
                    "verdict": {
                        "state": "FAILED",
                        "checks": [
                            {
                                "what": "cancelled",
                                "ok": False,
                                "note": "cancelled by: alice@example.com",
                            }
                        ],
                    },
                }
            ]
    finally:
        hook.close()


# ---------------------------------------------------------------- h. §15 logs


@pytest.mark.parametrize("config_overrides", [{"log.level": "info"}])
def test_the_wake_scan_of_a_cancel_logs_its_cause_queued_promoted_and_duration(client):
    advertise(client, "n1", cap())
    submit(client, contract("r1", role("dut")), 201)
    submit(client, contract("r2", role("dut")), 202)

    with structlog.testing.capture_logs() as logs:
        assert client.post("/v1/runs/r1/cancel").status_code == 200

    scans = [e for e in logs if e["event"] == "wake scan"]
    assert len(scans) == 1, logs
    scan = scans[0]
    assert "r1/n1" in scan["cause"]
    assert scan["queued"] == 1
    assert scan["promoted"] == 1
    assert isinstance(scan["ms"], (int, float)) and scan["ms"] >= 0


@pytest.mark.parametrize("config_overrides", [{"log.level": "info"}])
def test_the_request_log_of_a_submit_names_the_submitted_run_and_the_status(client):
    advertise(client, "n1", cap())

    with structlog.testing.capture_logs() as logs:
        submit(client, contract("r1", role("dut")), 201)

    requests = [e for e in logs if e["event"] == "request"]
    assert len(requests) == 1, logs
    assert requests[0]["run_id"] == "r1"
    assert requests[0]["status"] == 201
    assert requests[0]["route"] == "/v1/runs" and requests[0]["method"] == "POST"


# ---------------------------------------------------------------- i. §10/§8 an ask reset by a rollback


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

    assert step_states(sql, "r1") == {"approve": ("ASKED", 2), "build": ("PENDING", 2)}
    asks = client.get("/v1/asks").get_json()["asks"]
    assert [(a["run_id"], a["seq"], a["step"]) for a in asks] == [("r1", 1, "approve")]
    again = client.post("/v1/runs/r1/steps/1/answer", json={"go": True})
    assert again.status_code == 200, again.get_json()
    assert again.get_json() == {"run_id": "r1", "seq": 1, "run_state": ""}
    build = claimed(client, "n1")
    assert (build["name"], build["attempt"]) == ("build", 2)


# ---------------------------------------------------------------- j. §4/§8 at-boundary drain, rollback


def test_an_at_boundary_drain_cancels_the_run_instead_of_rolling_its_loop_back(client, sql):
    advertise(client, "n1", cap())
    submit(client, loop_run("r1"), 201)
    assert claimed(client, "n1")["name"] == "build"
    assert report(client, "r1", 1, "n1").status_code == 200
    assert claimed(client, "n1")["name"] == "test"
    advertise(client, "n1", cap(), policy={"drain": "at-boundary"})

    resp = report(client, "r1", 2, "n1", exit_code=1)  # would roll back to build

    assert resp.status_code == 200
    assert resp.get_json() == {"run_id": "r1", "seq": 2, "run_state": "FAILED"}
    run = one(sql, "select state, ended_at, verdict from runs where run_id = 'r1'")
    assert run["state"] == "FAILED" and run["ended_at"] is not None
    assert run["verdict"] == {
        "state": "FAILED",
        "checks": [{"what": "cancelled", "ok": False, "note": "cancelled by: drain:n1"}],
    }
    assert leases(sql) == []
    assert not [s for s, _ in step_states(sql, "r1").values() if s in ("PENDING", "CLAIMED")]


# ---------------------------------------------------------------- k. §11/§13 PUT on a sealed run


@pytest.mark.parametrize(
    "put",
    [
        pytest.param(lambda c: c.put("/v1/runs/r1/steps/1/log", data=b"late line\n"), id="log"),
        pytest.param(
            lambda c: c.put("/v1/runs/r1/steps/1/blob/result.json", data=b'{"ok": true}'),
            id="blob",
        ),
    ],
)
def test_a_log_or_blob_put_for_a_finished_and_sealed_run_is_410(client, sql, put):
    advertise(client, "n1", cap())
    doc = contract(
        "r1",
        role("dut"),
        steps=[{"id": "boot", "uses": "dut", "run": ["boot"], "out": ["result.json"]}],
    )
    submit(client, doc, 201)
    assert claimed(client, "n1")["name"] == "boot"
    assert client.post("/v1/runs/r1/cancel").status_code == 200
    assert scalar(sql, "select sealed_at from runs where run_id = 'r1'") is not None

    resp = put(client)

    assert resp.status_code == 410
    assert resp.get_json() == FINISHED
    assert scalar(sql, "select count(*) from blobs where run_id = 'r1'") == 0


# ---------------------------------------------------------------- l. §15 invalid config at start-up


@pytest.mark.parametrize(
    "args", [["serve", "--port", "0"], ["reaper", "--once"]], ids=["serve", "reaper"]
)
def test_a_process_without_a_database_url_stops_with_one_line_naming_the_key(args, tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MEDIATOR_") and k not in ("DATABASE_URL", "PGDATABASE")
    }
    env["MEDIATOR_TOKEN"] = TOKEN
    env["MEDIATOR_RECORDS_ROOT"] = str(tmp_path / "records")
    env["PYTHONPATH"] = str(ROOT)

    done = subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "database.url" in lines[0]
