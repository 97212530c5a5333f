"""``GET /metrics`` in one process (docs/metrics.md#get-metrics): the database's figures exact as
runs move (placed, queued, promoted by a cancel's wake), the counters of submits, wake scans and
queue waits moving with them, requests labelled by their URL rule, the token when
``metrics.require_token`` asks for one, and a database that cannot be read turned into a gauge,
never a 500.

The process's counters live as long as the test process, so a test compares them before and after
what it does; the database's figures are read at each scrape and compared as they are."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.agent import advertise
from tests.support.apps import app_on, client_of
from tests.support.contracts import contract, one_step, role
from tests.support.metrics import Samples, has, scrape, value
from tests.support.submitter import submit

ASK = {
    "id": "sign-off",
    "ask": {"prompt": "Ship it?"},
    "out": ["decision"],
    "schema": {"decision": {"type": "object"}},
}


def delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def runs_by_state(samples: Samples) -> dict[str, float]:
    states = ("QUEUED", "RUNNING", "VERIFYING", "SUCCEEDED", "FAILED")
    return {s: value(samples, "mediator_runs", state=s) for s in states}


def test_submits_placed_and_queued_then_a_cancel_promotes_and_the_figures_follow(client):
    advertise(client, "n1")
    before = scrape(client)
    submit(client, one_step("r1"), 201)
    submit(client, one_step("r2"), 202)

    mid = scrape(client)
    assert delta(mid, before, "mediator_submits_total", outcome="placed", team="default") == 1
    assert delta(mid, before, "mediator_submits_total", outcome="queued", team="default") == 1
    assert runs_by_state(mid) == {
        "QUEUED": 1,
        "RUNNING": 1,
        "VERIFYING": 0,
        "SUCCEEDED": 0,
        "FAILED": 0,
    }
    assert value(mid, "mediator_queue_depth") == 1
    assert 0 <= value(mid, "mediator_queue_oldest_age_seconds") < 60
    assert value(mid, "mediator_leases_held") == 1
    assert value(mid, "mediator_nodes_live") == 1
    assert value(mid, "mediator_database_figures_failed") == 0
    # The queued submit's own wake scan ran and promoted nothing (n1 is busy).
    assert delta(mid, before, "mediator_wake_scans_total", cause="submit") == 1
    assert delta(mid, before, "mediator_wake_promoted_total", cause="submit") == 0

    # The cancel frees n1: its wake is caused by the release and promotes r2.
    assert client.post("/v1/runs/r1/cancel").status_code == 200

    after = scrape(client)
    assert runs_by_state(after) == {
        "QUEUED": 0,
        "RUNNING": 1,
        "VERIFYING": 0,
        "SUCCEEDED": 0,
        "FAILED": 1,
    }
    assert value(after, "mediator_queue_depth") == 0
    assert value(after, "mediator_queue_oldest_age_seconds") == 0
    assert value(after, "mediator_leases_held") == 1  # r2 holds n1 now
    assert delta(after, mid, "mediator_wake_scans_total", cause="release") == 1
    assert delta(after, mid, "mediator_wake_promoted_total", cause="release") == 1
    assert delta(after, mid, "mediator_wake_scan_duration_seconds_count", cause="release") == 1
    assert delta(after, mid, "mediator_queue_wait_seconds_count") == 1
    assert 0 <= delta(after, mid, "mediator_queue_wait_seconds_sum") < 60
    assert delta(after, mid, "mediator_submits_total", outcome="placed", team="default") == 0


def test_refused_and_repeated_submits_are_counted_by_outcome(client):
    advertise(client, "n1")
    before = scrape(client)
    submit(client, one_step("r1"), 201)
    submit(client, one_step("r1"), 200)
    submit(client, one_step("r3", capability="scope"), 422)
    submit(client, {"run_id": "r4"}, 400)
    after = scrape(client)
    for outcome, n in (("placed", 1), ("duplicate", 1), ("rejected", 1), ("invalid", 1)):
        assert (
            delta(after, before, "mediator_submits_total", outcome=outcome, team="default") == n
        ), outcome
    assert delta(after, before, "mediator_submits_total", outcome="queued", team="default") == 0


def test_asks_reservations_idle_reserved_nodes_and_wake_debt_are_read_exactly(client, sql):
    advertise(client, "n1")
    advertise(client, "n2")
    submit(client, contract("a", role("dut"), steps=[ASK]), 201)
    empty = scrape(client)
    assert value(empty, "mediator_asks_open") == 1
    assert 0 <= value(empty, "mediator_asks_oldest_age_seconds") < 60
    assert value(empty, "mediator_reservations") == 0
    assert value(empty, "mediator_wake_debt") == 0
    leased = sql.execute("select node_id from leases").fetchone()[0]
    idle = "n2" if leased == "n1" else "n1"
    # Rows as a scan would write them
    # (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits); the figures only read
    # them.
    sql.execute(
        "insert into reservations (node_id, run_id) values (%s, 'a'), (%s, 'a')", (leased, idle)
    )
    sql.execute(
        "insert into wake_debt (id, reason, set_at) values (1, 't', now() - '5s'::interval)"
    )

    samples = scrape(client)
    assert value(samples, "mediator_reservations") == 2
    assert value(samples, "mediator_reserving_runs") == 1
    assert value(samples, "mediator_reserved_idle_nodes") == 1  # the one that holds no lease
    assert value(samples, "mediator_wake_debt") == 1
    assert 5 <= value(samples, "mediator_wake_debt_age_seconds") < 60
    assert value(samples, "mediator_nodes_live") == 2


def test_requests_are_counted_by_their_url_rule_never_their_path(client):
    before = scrape(client)
    assert client.get("/v1/runs/no-such-run").status_code == 404
    assert client.get("/no/such/route").status_code == 404
    resp = client.get("/metrics")
    after = scrape(client)
    rule = {"method": "GET", "route": "/v1/runs/<run_id>", "status": "404"}
    assert delta(after, before, "mediator_http_requests_total", **rule) == 1
    unmatched = {"method": "GET", "route": "unmatched", "status": "404"}
    assert delta(after, before, "mediator_http_requests_total", **unmatched) == 1
    latency = {"method": "GET", "route": "/v1/runs/<run_id>"}
    assert delta(after, before, "mediator_http_request_duration_seconds_count", **latency) == 1
    text = resp.get_data(as_text=True)
    assert "no-such-run" not in text and "/no/such/route" not in text


@pytest.mark.parametrize("config_overrides", [{"metrics.require_token": True}])
def test_metrics_require_token_asks_for_any_valid_token(app, config_overrides):
    anyone = app.test_client()
    resp = anyone.get("/metrics")
    assert resp.status_code == 401
    assert resp.get_json() == {"error": {"code": 401, "reason": "missing or invalid token"}}
    wrong = anyone.get("/metrics", headers={"Authorization": "Bearer not-a-token"})
    assert wrong.status_code == 401
    assert has(scrape(client_of(app)), "mediator_http_requests_total")


def test_metrics_are_open_by_default(app):
    assert app.test_client().get("/metrics").status_code == 200


def test_an_unreachable_database_is_a_gauge_of_the_reply_not_a_500(tmp_path: Any):
    with app_on("postgresql://nobody@127.0.0.1:9/none", tmp_path / "records") as app:
        samples = scrape(app.test_client())
    assert value(samples, "mediator_database_figures_failed") == 1
    assert not has(samples, "mediator_runs")
    assert has(samples, "mediator_http_requests_total")
    assert has(samples, "mediator_submits_total")
