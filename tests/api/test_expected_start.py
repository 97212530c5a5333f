"""The expected start of a QUEUED run (docs/queue.md, "What a QUEUED run's view explains"): from
the durations recorded for the steps its holders and the runs ahead still have to run, read at
request time by the database's clock. Time passes by moving timestamps in the database."""

from __future__ import annotations

from typing import Any

import pytest

from app.estimate import duration_key
from app.services.expected import QueuedShapes
from tests.support.actors import cap
from tests.support.agent import advertise, claimed
from tests.support.apps import app_on, client_of
from tests.support.contracts import ask_contract, contract, role, two_steps
from tests.support.submitter import submit
from tests.support.wire import when

one_app_per_module = True
MAX_AHEAD = 3

BOARD = {"capability": "board", "attrs": {}}
FLASH = duration_key("flash", "run", {"run": ["flash"]}, BOARD)
BOOT = duration_key("boot", "run", {"run": ["boot"]}, BOARD)


@pytest.fixture(scope="module")
def module_config() -> dict[str, Any]:
    return {"estimate.max_ahead": MAX_AHEAD}


def record(sql: Any, key: str, *seconds: float) -> None:
    for s in seconds:
        sql.execute(
            "insert into step_durations (key, seconds, ended_at) values (%s, %s, now())", (key, s)
        )


def waits(view: dict[str, Any]) -> float:
    """Seconds from the view's ``candidates_at`` to its ``expected_start``."""
    return (when(view["expected_start"]) - when(view["candidates_at"])).total_seconds()


def running_flash_for(client: Any, sql: Any, seconds: int) -> None:
    """run-a RUNNING on n1, its flash claimed ``seconds`` ago."""
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("run-a"), 201)
    claimed(client, "n1")
    sql.execute(
        "update steps set started_at = now() - make_interval(secs => %s) where run_id = 'run-a'",
        (seconds,),
    )


def test_a_queued_submit_expects_its_start_when_the_holder_is_done_by_history(client, sql):
    record(sql, FLASH, 50, 60, 70)
    record(sql, BOOT, 90, 100, 400)
    running_flash_for(client, sql, 20)

    view = submit(client, two_steps("run-b"), 202).get_json()

    # flash's median 60 less the 20 s it ran, then boot's median 100.
    assert view["expected_basis"] == "history"
    assert 139 <= waits(view) <= 141


def test_a_holder_past_its_median_counts_as_ending_its_step_now(client, sql):
    record(sql, FLASH, 60)
    record(sql, BOOT, 100)
    running_flash_for(client, sql, 600)

    view = submit(client, two_steps("run-b"), 202).get_json()

    assert view["expected_basis"] == "history"
    assert 99 <= waits(view) <= 101


def test_runs_ahead_take_the_node_first_in_the_run_view(client, sql):
    record(sql, FLASH, 60)
    record(sql, BOOT, 100)
    running_flash_for(client, sql, 20)
    submit(client, two_steps("run-b"), 202)
    submit(client, two_steps("run-c"), 202)

    view = client.get("/v1/runs/run-c").get_json()

    # run-a ends in 140 s; run-b then runs flash and boot (160 s).
    assert view["queue"]["ahead"] == 1
    assert view["expected_basis"] == "history"
    assert 299 <= waits(view) <= 301


SOC_X = {"capability": "board", "attrs": {"soc": "x"}}


def soc_x_two_steps(run_id: str) -> dict[str, Any]:
    """two_steps on a board with ``soc=x``: a shape of its own that shares such a board."""
    return contract(run_id, role("dut", soc="x"), steps=two_steps(run_id)["steps"])


def other_shape_ahead(client: Any, sql: Any) -> None:
    """run-a RUNNING on n1 (a board with soc=x) for 140 s more; the two steps on a board with
    soc=x take 30 s and 40 s."""
    record(sql, FLASH, 60)
    record(sql, BOOT, 100)
    record(sql, duration_key("flash", "run", {"run": ["flash"]}, SOC_X), 30)
    record(sql, duration_key("boot", "run", {"run": ["boot"]}, SOC_X), 40)
    advertise(client, "n1", cap("board", soc="x"))
    submit(client, two_steps("run-a"), 201)
    claimed(client, "n1")
    sql.execute(
        "update steps set started_at = now() - make_interval(secs => 20) where run_id = 'run-a'"
    )


def read_list_then_empty_the_queue(client: Any, sql: Any) -> None:
    """Two runs queued behind run-a, the second's 202 reading the process's list of queued shapes
    (a run with one ahead), then both gone."""
    for warm in ("warm-1", "warm-2"):
        submit(client, two_steps(warm), 202)
    sql.execute("delete from runs where run_id like 'warm-%'")


def test_a_run_of_another_shape_sharing_the_candidate_is_ahead(app, client, sql, monkeypatch):
    # The process read its queued shapes before run-b's shape first queued, and will not read
    # them again during the test: run-b's own 202 is what makes its shape known here.
    shapes = QueuedShapes(fresh_seconds=3600)
    monkeypatch.setattr(app.extensions["mediator"], "estimate_shapes", shapes)
    other_shape_ahead(client, sql)
    read_list_then_empty_the_queue(client, sql)
    first = submit(client, soc_x_two_steps("run-b"), 202).get_json()

    view = submit(client, two_steps("run-c"), 202).get_json()

    assert first["queue"]["ahead"] == 0
    # run-a ends in 140 s; run-b (another shape, on the same board) then takes 70 s.
    assert view["queue"]["ahead"] == 1
    assert view["expected_basis"] == "history"
    assert 209 <= waits(view) <= 211


def test_a_shape_queued_by_another_process_counts_once_the_list_is_read_again(
    app, client, sql, db_url, tmp_path, monkeypatch
):
    shapes = QueuedShapes(fresh_seconds=3600)
    monkeypatch.setattr(app.extensions["mediator"], "estimate_shapes", shapes)
    other_shape_ahead(client, sql)
    read_list_then_empty_the_queue(client, sql)
    with app_on(db_url, tmp_path / "other-records") as other:
        submit(client_of(other), soc_x_two_steps("run-b"), 202)

    within = submit(client, two_steps("run-c"), 202).get_json()
    shapes.fresh_seconds = 0  # the list is older than its freshness from here on
    after = client.get("/v1/runs/run-c").get_json()

    assert within["queue"]["ahead"] == after["queue"]["ahead"] == 1
    assert 139 <= waits(within) <= 141  # run-b's shape is not in the list read before it
    assert 209 <= waits(after) <= 211


def test_a_step_without_a_recorded_duration_gives_no_history(client, sql):
    record(sql, FLASH, 60)
    running_flash_for(client, sql, 20)

    view = submit(client, two_steps("run-b"), 202).get_json()

    assert view["expected_start"] is None
    assert view["expected_basis"] == "no_history"


def test_a_holder_waiting_for_an_ask_waits_for_a_person(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, ask_contract("run-a"), 201)

    view = submit(client, two_steps("run-b"), 202).get_json()

    assert view["expected_start"] is None
    assert view["expected_basis"] == "waits_for_person"


def test_more_runs_ahead_sharing_a_candidate_than_max_ahead_is_too_far_back(client, sql):
    record(sql, FLASH, 60)
    record(sql, BOOT, 100)
    running_flash_for(client, sql, 20)
    for i in range(MAX_AHEAD):
        submit(client, two_steps(f"ahead-{i}"), 202)
    # Runs needing another kind of board, one of them queued ahead: it shares no candidate.
    advertise(client, "n2", cap("other"))
    submit(client, contract("elsewhere-1", role("dut", "other")), 201)
    submit(client, contract("elsewhere-2", role("dut", "other")), 202)

    last_within = submit(client, two_steps("within"), 202).get_json()
    too_far = submit(client, two_steps("too-far"), 202).get_json()

    assert last_within["queue"]["ahead"] == MAX_AHEAD + 1
    assert last_within["expected_basis"] == "history"
    expected = 140 + MAX_AHEAD * 160
    assert expected - 1 <= waits(last_within) <= expected + 1
    assert too_far["expected_start"] is None
    assert too_far["expected_basis"] == "too_far_back"


def test_a_role_whose_only_candidate_drains_is_unavailable(client, sql):
    record(sql, FLASH, 60)
    record(sql, BOOT, 100)
    running_flash_for(client, sql, 20)
    submit(client, two_steps("run-b"), 202)
    advertise(client, "n1", cap("board"), policy={"drain": "graceful"})

    view = client.get("/v1/runs/run-b").get_json()

    assert view["expected_start"] is None
    assert view["expected_basis"] == "unavailable"


def test_the_runs_list_shows_each_queued_rows_expected_start_under_one_budget(client, sql):
    record(sql, FLASH, 60)
    record(sql, BOOT, 100)
    running_flash_for(client, sql, 20)
    submit(client, two_steps("run-b"), 202)
    submit(client, two_steps("run-c"), 202)

    rows = {r["run_id"]: r for r in client.get("/v1/runs?state=QUEUED").get_json()["runs"]}

    # As in the views: run-b after run-a's 140 s, run-c 160 s later.
    view_b = client.get("/v1/runs/run-b").get_json()
    assert rows["run-b"]["expected_basis"] == "history"
    assert rows["run-c"]["expected_basis"] == "history"
    at = when(view_b["candidates_at"])
    assert 139 <= (when(rows["run-b"]["expected_start"]) - at).total_seconds() <= 142
    assert 299 <= (when(rows["run-c"]["expected_start"]) - at).total_seconds() <= 302
    # A row that is not QUEUED has none.
    running = client.get("/v1/runs?state=RUNNING").get_json()["runs"]
    assert [r["run_id"] for r in running] == ["run-a"] and "expected_basis" not in running[0]


def test_rows_past_the_lists_budget_get_budget_without_a_look(client, sql):
    """A budget of MAX_AHEAD (3) for the whole list, each row estimated and each run ahead it
    looks at counting one, spent from the front of the queue: q-0 (nothing ahead, 1) and q-1
    (itself and q-0, 2) are estimated, the rest are ``budget``."""
    record(sql, FLASH, 60)
    record(sql, BOOT, 100)
    running_flash_for(client, sql, 20)
    for i in range(5):
        submit(client, two_steps(f"q-{i}"), 202)

    rows = client.get("/v1/runs?state=QUEUED").get_json()["runs"]

    assert [r["run_id"] for r in rows] == [f"q-{i}" for i in (4, 3, 2, 1, 0)]  # newest first
    assert [r["expected_basis"] for r in rows] == ["budget"] * 3 + ["history"] * 2
    assert all(r["expected_start"] is None for r in rows if r["expected_basis"] == "budget")
