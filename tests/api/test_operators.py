"""Operators' holds and quarantine by hand and by strikes (docs/operators.md): who may, what a
hold does to placement and to the node's own heartbeat, at-boundary, strikes from silences and
restarts (never from a failing test), and the events left behind."""

from __future__ import annotations

from typing import Any

import pytest

from app.services.reaper import reap_pass
from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done, report
from tests.support.clock import expire_leases
from tests.support.contracts import contract, one_step, role, two_steps
from tests.support.rows import run_state
from tests.support.tokens import sha256_entry, token_client

one_app_per_module = True

SECRETS = {"op": "s3cret-op", "sub": "s3cret-sub", "node": "s3cret-node", "read": "s3cret-rd"}
ENTRIES = [
    sha256_entry("op", SECRETS["op"], "operator", principal="olga@lab.example.com"),
    sha256_entry("sub", SECRETS["sub"], "submitter"),
    sha256_entry("node", SECRETS["node"], "node"),
    sha256_entry("read", SECRETS["read"], "reader"),
]
STRIKES = 2


@pytest.fixture(scope="module")
def module_config() -> dict[str, Any]:
    return {
        "tokens": ENTRIES,
        "health.failures_in_a_row": STRIKES,
        "queue.reserve_after_seconds": 0,
    }


def as_token(app: Any, name: str) -> Any:
    return token_client(app, SECRETS[name])


def op(app: Any, method: str, path: str, expected: int = 200, **body: Any) -> dict[str, Any]:
    client = as_token(app, "op")
    resp = client.open(path, method=method, json=body if body else None)
    assert resp.status_code == expected, resp.get_json()
    out: dict[str, Any] = resp.get_json()
    return out


def node_line(app: Any, node_id: str) -> dict[str, Any]:
    nodes = as_token(app, "read").get("/v1/nodes").get_json()["nodes"]
    return next(n for n in nodes if n["node_id"] == node_id)


def submit_as(app: Any, doc: dict[str, Any], expected: int) -> dict[str, Any]:
    resp = as_token(app, "sub").post("/v1/runs", json=doc)
    assert resp.status_code == expected, resp.get_json()
    out: dict[str, Any] = resp.get_json()
    return out


def as_node(app: Any) -> Any:
    return as_token(app, "node")


# ---------------------------------------------------------------- who may, and bad requests


def test_only_an_operator_may_hold_or_quarantine(app, client):
    advertise(as_node(app), "n1", cap("board"))
    for name in ("sub", "node", "read"):
        for method, path in (
            ("POST", "/v1/nodes/n1/drain"),
            ("DELETE", "/v1/nodes/n1/drain"),
            ("POST", "/v1/nodes/n1/quarantine"),
            ("DELETE", "/v1/nodes/n1/quarantine"),
        ):
            resp = as_token(app, name).open(
                path, method=method, json={"mode": "graceful", "reason": "x"}
            )
            assert resp.status_code == 403, (name, method, path)
            reason = resp.get_json()["error"]["reason"]
            assert reason.endswith("lacks the role: operator"), reason
    assert node_line(app, "n1")["hold"] is None


def test_a_node_never_seen_is_404_and_bad_bodies_are_400_naming_the_field(app, sql):
    advertise(as_node(app), "n1", cap("board"))
    op(app, "POST", "/v1/nodes/ghost/drain", 404, mode="graceful", reason="x")
    op(app, "DELETE", "/v1/nodes/ghost/quarantine", 404)
    bad = op(app, "POST", "/v1/nodes/n1/drain", 400, mode="soon", reason="x")
    assert "mode" in bad["error"]["reason"]
    bad = op(app, "POST", "/v1/nodes/n1/drain", 400, mode="graceful", reason="")
    assert "reason" in bad["error"]["reason"]
    bad = op(app, "POST", "/v1/nodes/n1/quarantine", 400, reason="é" * 600)
    assert "reason" in bad["error"]["reason"]
    assert sql.execute("select count(*) from node_health").fetchone() == (0,)


# ---------------------------------------------------------------- an operator's hold


def test_a_hold_keeps_the_node_out_and_the_adverts_do_not_lift_it(app, sql):
    node = as_node(app)
    advertise(node, "n1", cap("board"))
    line = op(app, "POST", "/v1/nodes/n1/drain", mode="graceful", reason="new firmware")
    assert line["drain_mode"] == "graceful"
    assert line["hold"]["mode"] == "graceful" and line["hold"]["reason"] == "new firmware"
    assert line["hold"]["by"] == "olga@lab.example.com"
    # Its own adverts say nothing of the hold and do not lift it; the reply echoes its own drain.
    reply = advertise(node, "n1", cap("board"))
    assert reply["drain"] == ""
    assert node_line(app, "n1")["hold"]["reason"] == "new firmware"
    # Not a candidate: a run for it queues, and the view counts it draining.
    view = submit_as(app, contract("r1"), 202)
    assert view["requires"][0]["candidates"]["draining"] == 1
    # Lifting the hold wakes the queue before the answer: r1 is placed by that request.
    line = op(app, "DELETE", "/v1/nodes/n1/drain")
    assert line["hold"] is None and line["draining"] is False
    assert run_state(sql, "r1") == "RUNNING"
    changes = sql.execute(
        "select change, reason, by from node_events where node_id = 'n1' order by id"
    ).fetchall()
    assert changes == [
        ("drain graceful", "new firmware", "olga@lab.example.com"),
        ("drain lifted", "new firmware", "olga@lab.example.com"),
    ]
    # DELETE again: idempotent.
    assert op(app, "DELETE", "/v1/nodes/n1/drain")["hold"] is None


def test_a_graceful_hold_lets_the_leased_run_finish_and_its_agent_keep_claiming(app, sql):
    node = as_node(app)
    advertise(node, "n1", cap("board"))
    submit_as(app, two_steps("r1"), 201)
    op(app, "POST", "/v1/nodes/n1/drain", mode="graceful", reason="maintenance")
    assert advertise(node, "n1", cap("board"))["drain"] == ""
    claimed(node, "n1")
    done(node, "r1", 1, "n1")
    claimed(node, "n1")
    assert done(node, "r1", 2, "n1")["run_state"] == "SUCCEEDED"


def test_an_at_boundary_hold_cancels_a_run_waiting_on_the_node_at_once(app, sql):
    node = as_node(app)
    advertise(node, "n1", cap("board"))
    submit_as(app, two_steps("r1"), 201)  # step 1 PENDING on n1, nothing claimed
    op(app, "POST", "/v1/nodes/n1/drain", mode="at-boundary", reason="pulling it")
    assert run_state(sql, "r1") == "FAILED"
    (verdict,) = sql.execute("select verdict from runs where run_id = 'r1'").fetchone()
    assert "cancelled by: olga@lab.example.com" in str(verdict)


def test_an_at_boundary_hold_over_a_claimed_step_cancels_at_its_result(app, sql):
    node = as_node(app)
    advertise(node, "n1", cap("board"))
    submit_as(app, two_steps("r1"), 201)
    claimed(node, "n1")
    op(app, "POST", "/v1/nodes/n1/drain", mode="at-boundary", reason="pulling it")
    assert run_state(sql, "r1") == "RUNNING"
    assert done(node, "r1", 1, "n1")["run_state"] == "FAILED"


def test_the_hold_outlives_a_restart_of_the_mediator(app, sql, fresh_db_url, tmp_path):
    from tests.support.apps import app_on, client_of

    with app_on(fresh_db_url, tmp_path / "r") as first:
        c = client_of(first)
        advertise(c, "n1", cap("board"))
        assert (
            c.post("/v1/nodes/n1/drain", json={"mode": "graceful", "reason": "x"}).status_code
            == 200
        )
    with app_on(fresh_db_url, tmp_path / "r") as second:
        c = client_of(second)
        advertise(c, "n1", cap("board"))  # the node came back too
        (line,) = c.get("/v1/nodes").get_json()["nodes"]
        assert line["hold"]["reason"] == "x" and line["drain_mode"] == "graceful"


# ---------------------------------------------------------------- strikes and quarantine


def test_a_node_is_quarantined_after_n_lease_expiries_in_a_row(app, ctx, sql):
    node = as_node(app)
    advertise(node, "n1", cap("board"))
    for i in range(STRIKES):
        submit_as(app, one_step(f"r{i}"), 201)
        expire_leases(sql, f"r{i}")
        reap_pass(ctx)
        assert run_state(sql, f"r{i}") == "FAILED"
        advertise(node, "n1", cap("board"))  # it came back
        health = node_line(app, "n1")["health"]
        assert health["strikes"] == i + 1
        assert health["state"] == ("quarantined" if i + 1 == STRIKES else "ok")
    health = node_line(app, "n1")["health"]
    assert "its lease of r1 expired" in health["reason"] and health["since"]
    # Out of service: a run for it queues, counted as quarantined.
    view = submit_as(app, one_step("later"), 202)
    assert view["requires"][0]["candidates"]["quarantined"] == 1
    metrics = as_token(app, "read").get("/metrics").get_data(as_text=True)
    assert "mediator_nodes_quarantined 1.0" in metrics
    # Lifting by hand resets the strikes and places the waiting run.
    line = op(app, "DELETE", "/v1/nodes/n1/quarantine")
    assert line["health"] == {"state": "ok", "strikes": 0}
    assert run_state(sql, "later") == "RUNNING"


def test_failing_tests_and_agent_errors_without_a_health_check_are_no_strikes(app, sql):
    node = as_node(app)
    advertise(node, "n1", cap("board"))
    for i in range(STRIKES + 1):
        submit_as(app, one_step(f"t{i}"), 201)
        claimed(node, "n1")
        # A test that failed (exit 1), then an agent error: neither is the board's fault here.
        if i % 2:
            report(node, f"t{i}", 1, "n1", exit_code=1)
        else:
            report(node, f"t{i}", 1, "n1", exit_code=None, error="agent: cannot spawn")
    assert node_line(app, "n1")["health"] == {"state": "ok", "strikes": 0}


def test_a_done_step_resets_the_strikes(app, ctx, sql):
    node = as_node(app)
    advertise(node, "n1", cap("board"))
    submit_as(app, one_step("r0"), 201)
    expire_leases(sql, "r0")
    reap_pass(ctx)
    advertise(node, "n1", cap("board"))
    assert node_line(app, "n1")["health"]["strikes"] == 1
    submit_as(app, one_step("r1"), 201)
    claimed(node, "n1")
    done(node, "r1", 1, "n1")
    assert node_line(app, "n1")["health"]["strikes"] == 0


def test_a_restart_mid_step_is_a_strike(app, sql):
    node = as_node(app)
    advertise(node, "n1", cap("board"), instance="boot-1")
    submit_as(app, one_step("r1"), 201)
    claimed(node, "n1", "boot-1")
    advertise(node, "n1", cap("board"), instance="boot-2")
    assert run_state(sql, "r1") == "FAILED"
    assert node_line(app, "n1")["health"]["strikes"] == 1


def test_a_quarantine_by_hand_keeps_since_and_replaces_the_reason(app, sql):
    advertise(as_node(app), "n1", cap("board"))
    first = op(app, "POST", "/v1/nodes/n1/quarantine", reason="smoke")["health"]
    second = op(app, "POST", "/v1/nodes/n1/quarantine", reason="smoke, really")["health"]
    assert first["state"] == second["state"] == "quarantined"
    assert second["since"] == first["since"] and second["reason"] == "smoke, really"
    submit_as(app, contract("r1", role("dut")), 202)
    assert op(app, "DELETE", "/v1/nodes/n1/quarantine")["health"]["state"] == "ok"
    assert run_state(sql, "r1") == "RUNNING"


def test_a_submitted_run_id_may_not_begin_with_health(app):
    advertise(as_node(app), "n1", cap("board"))
    body = submit_as(app, contract("health-x"), 400)
    assert body["error"]["reason"] == 'run id prefix "health-" is reserved'
