"""Priorities (docs/priorities.md#priority): the queue in (priority descending, created_at, run_id)
order in the scan, in each shape's next run and in the queue position; a token's ``max_priority``
bounds what it may ask for; the run list keeps its own newest-first order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from app.context import Caller
from app.errors import Forbidden
from app.services.submit import dry_run, submit_run
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.contracts import single
from tests.support.rows import run_row, scalar
from tests.support.submitter import submit


def view(client, run_id):
    resp = client.get(f"/v1/runs/{run_id}")
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()


def test_a_higher_priority_run_overtakes_older_runs_of_its_shape_and_the_queue_shows_it(
    client, sql
):
    advertise(client, "n1", cap())
    submit(client, single("holder"), 201)
    submit(client, single("old-0"), 202)
    submit(client, single("older-low", priority=-5), 202)
    submit(client, single("young-high", priority=7), 202)
    submit(client, single("young-0"), 202)

    places = {r: view(client, r)["queue"] for r in ("old-0", "older-low", "young-high", "young-0")}
    assert places == {
        "young-high": {"position": 1, "ahead": 0},
        "old-0": {"position": 2, "ahead": 1},
        "young-0": {"position": 3, "ahead": 2},
        "older-low": {"position": 4, "ahead": 3},
    }
    assert view(client, "young-high")["priority"] == 7
    assert view(client, "older-low")["priority"] == -5

    # Each freed board goes to the next run in queue order, never to an older run of lower
    # priority: the scan's order and each shape's next run.
    order = []
    running = "holder"
    for _ in range(4):
        assert client.post(f"/v1/runs/{running}/cancel").status_code == 200
        running = scalar(sql, "select run_id from runs where state = 'RUNNING'")
        order.append(running)
    assert order == ["young-high", "old-0", "young-0", "older-low"]


def test_the_priority_is_stored_with_the_run_and_defaults_to_zero(client, sql):
    advertise(client, "n1", cap())
    submit(client, single("plain"), 201)
    submit(client, single("urgent", priority=100), 202)
    submit(client, single("background", priority=-100), 202)

    assert run_row(sql, "plain")["priority"] == 0
    assert run_row(sql, "urgent")["priority"] == 100
    assert run_row(sql, "background")["priority"] == -100


def test_the_run_list_keeps_its_newest_first_order_and_cursor_whatever_the_priority(client):
    advertise(client, "n1", cap())
    submit(client, single("holder"), 201)
    for run_id, priority in (("q1", 0), ("q2", 50), ("q3", -50), ("q4", 0)):
        submit(client, single(run_id, priority=priority), 202)

    listed = client.get("/v1/runs?state=QUEUED").get_json()["runs"]
    assert [r["run_id"] for r in listed] == ["q4", "q3", "q2", "q1"]

    first = client.get("/v1/runs?state=QUEUED&limit=2").get_json()
    assert [r["run_id"] for r in first["runs"]] == ["q4", "q3"]
    rest = client.get(f"/v1/runs?state=QUEUED&limit=2&before={first['next']}").get_json()
    assert [r["run_id"] for r in rest["runs"]] == ["q2", "q1"]


@dataclass(frozen=True)
class BoundedCaller(Caller):
    """A token with a ``max_priority`` of its own, as the token configuration gives one."""

    max_priority: int = 0


def bounded(max_priority: int) -> BoundedCaller:
    return BoundedCaller("ci", frozenset({"submitter"}), "ci@lab.test", max_priority=max_priority)


def test_a_priority_above_the_tokens_bound_is_403_naming_both_and_stores_nothing(ctx, client, sql):
    advertise(client, "n1", cap())

    with pytest.raises(Forbidden) as refused:
        submit_run(ctx, single("too-high", priority=5), bounded(0))
    assert refused.value.status == 403
    assert refused.value.reason == "queue.priority 5 is above this token's max_priority 0"
    with pytest.raises(Forbidden) as refused_dry:
        dry_run(ctx, single("too-high", priority=5), bounded(4))
    assert refused_dry.value.reason == "queue.priority 5 is above this token's max_priority 4"

    assert scalar(sql, "select count(*) from runs") == 0
    assert scalar(sql, "select count(*) from run_events") == 0
    assert list(Path(ctx.config["records.root"]).glob("*")) == []

    # Checked before the run_id lookup: a known run_id does not let a priority past the bound.
    assert submit_run(ctx, single("known"), bounded(0)).status == 201
    with pytest.raises(Forbidden):
        submit_run(ctx, single("known", priority=1), bounded(0))
    # Within the bound it goes through, at the bound too.
    assert submit_run(ctx, single("at-bound", priority=3), bounded(3)).status == 202
    assert dry_run(ctx, single("dry", priority=4), bounded(4))["state"] == "DRY_RUN"


def test_the_legacy_token_may_ask_for_every_priority_up_to_100(client):
    advertise(client, "n1", cap())
    assert submit(client, single("top", priority=100)).status_code == 201
    assert client.post("/v1/runs/dry-run", json=single("dry", priority=100)).status_code == 200
    resp = submit(client, single("over", priority=101))
    assert resp.status_code == 400
    assert resp.get_json()["error"]["reason"] == (
        "queue.priority must be from -100 to 100, got 101"
    )
