"""Contracts as the original system's client writes them
(docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl), through the HTTP
API on a real PostgreSQL: the fields it adds are accepted and stored with the step, unknown fields
are ignored with a warning, ``success_when[].changed`` is judged from the result's ``changed``, Go
durations are read to the fraction of a second, and a requirement's ``count: 0`` means 1."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done
from tests.support.contracts import contract, role
from tests.support.rows import find_run, run_row, step_row
from tests.support.submitter import submit
from tests.support.wire import error_body

WORKSPACE = {"repo": "gerrit.example.com/kernel/linux", "rev": "4f2a9c1"}


def patch_run(run_id: str, changed: list[str]) -> dict[str, Any]:
    """One agent step on the board, working in a workspace, judged by what it changed."""
    return contract(
        run_id,
        role("dut"),
        steps=[
            {
                "id": "fix",
                "uses": "dut",
                "agent": {"model": "m"},
                "in": {"prompt": "fix the build"},
                "workspace": WORKSPACE,
            }
        ],
        success_when=[{"step": "fix", "changed": changed}],
    )


# ---------------------------------------------------------------- what the original client sends


def test_a_contract_as_the_original_client_writes_it_is_accepted_and_its_step_keeps_its_fields(
    client, sql
):
    advertise(client, "n1", cap("board"))
    step = {
        "id": "review",
        "uses": "dut",
        "agent": {"model": "m"},
        "out": ["review.md"],
        "feedback": ["the previous patchset broke the arm64 build"],
        "see": {"ledger": "list", "from": []},
        "workspace": WORKSPACE,
        "collect": {"review.md": "out/review.md"},
        "expands": False,
    }
    doc = contract(
        "r1",
        role("dut"),
        steps=[step],
        work={
            "system": "gerrit",
            "change_id": "4711",
            "patchset": 3,
            "parent_rev": "0a1b2c",
            "patch_rev": "3d4e5f",
        },
        success_when=[{"step": "review", "produced": ["review.md"], "weight": 2}],
        planner="v2",
    )

    body = submit(client, doc, 201).get_json()

    warnings = [
        "planner: unknown field, ignored",
        "steps[0].expands: unknown field, ignored",
        "success_when[0].weight: unknown field, ignored",
    ]
    assert body["warnings"] == warnings
    assert client.get("/v1/runs/r1").get_json()["warnings"] == warnings
    row = run_row(sql, "r1")
    assert (row["work_id"], row["warnings"]) == ("gerrit:4711", warnings)
    assert row["contract"]["work"]["patchset"] == 3 and row["contract"]["planner"] == "v2"
    spec = step_row(sql, "r1", 1)["spec"]
    assert spec == {k: v for k, v in step.items() if k != "expands"}
    assert spec["see"]["ledger"] == "list"


def test_a_dry_run_carries_the_warnings_about_ignored_fields(client):
    advertise(client, "n1", cap("board"))
    doc = contract("try-1", steps=[{"id": "a", "uses": "dut", "run": ["x"], "retries": 2}])

    body = client.post("/v1/runs/dry-run", json=doc).get_json()

    assert body["warnings"] == ["steps[0].retries: unknown field, ignored"]


def test_an_unknown_field_inside_agent_stays_400(client, sql):
    advertise(client, "n1", cap("board"))
    doc = contract("r1", steps=[{"id": "a", "uses": "dut", "agent": {"temperature": 1}}])

    resp = submit(client, doc)

    assert resp.status_code == 400
    assert resp.get_json() == error_body(400, 'step "a": agent has unknown field "temperature"')
    assert find_run(sql, "r1") is None


def test_see_from_that_is_not_empty_is_400_naming_the_field(client, sql):
    advertise(client, "n1", cap("board"))
    step = {"id": "a", "uses": "dut", "run": ["x"], "see": {"ledger": "list", "from": ["log"]}}

    resp = submit(client, contract("r1", steps=[step]))

    assert resp.status_code == 400
    assert resp.get_json() == error_body(
        400,
        "steps[0].see.from must be an empty list (narrowing what a step sees is not supported; "
        'name fewer artifacts in in.from), got ["log"]',
    )
    assert find_run(sql, "r1") is None


def test_a_requirement_with_count_0_takes_one_node(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))

    body = submit(client, contract("r1", {"as": "dut", "capability": "board", "count": 0}), 201)

    assigned = body.get_json()["assigned"]
    assert [(a["as"], len(a["nodes"])) for a in assigned] == [("dut", 1)]
    assert run_row(sql, "r1")["requires"] == [
        {"as": "dut", "capability": "board", "attrs": {}},
    ]


# ---------------------------------------------------------------- success_when[].changed


def test_changed_holds_when_the_result_reports_every_listed_path_changed(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, patch_run("r1", ["arch/arm64/Kconfig", "Makefile"]), 201)
    claimed(client, "n1")

    reply = done(client, "r1", 1, "n1", changed=["Makefile", "arch/arm64/Kconfig", "README"])

    assert reply["run_state"] == "SUCCEEDED"
    assert run_row(sql, "r1")["verdict"] == {
        "state": "SUCCEEDED",
        "checks": [
            {
                "step": "fix",
                "what": "changed",
                "want": ["arch/arm64/Kconfig", "Makefile"],
                "got": ["arch/arm64/Kconfig", "Makefile"],
                "ok": True,
            }
        ],
    }


def test_changed_fails_naming_the_paths_the_result_did_not_report(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, patch_run("r1", ["a.c", "b.c", "c.c"]), 201)
    claimed(client, "n1")

    reply = done(client, "r1", 1, "n1", changed=["b.c"])

    assert reply["run_state"] == "FAILED"
    assert run_row(sql, "r1")["verdict"]["checks"] == [
        {
            "step": "fix",
            "what": "changed",
            "want": ["a.c", "b.c", "c.c"],
            "got": ["b.c"],
            "ok": False,
            "note": "not changed during this step: a.c, c.c",
        }
    ]


def test_changed_on_a_step_without_a_workspace_is_400(client, sql):
    advertise(client, "n1", cap("board"))
    doc = patch_run("r1", ["a.c"])
    del doc["steps"][0]["workspace"]

    resp = submit(client, doc)

    assert resp.status_code == 400
    assert resp.get_json() == error_body(
        400, 'success_when[0].changed needs a workspace, but step "fix" has none'
    )
    assert find_run(sql, "r1") is None


def test_an_absolute_changed_path_is_400_naming_the_field(client, sql):
    advertise(client, "n1", cap("board"))

    resp = submit(client, patch_run("r1", ["src/a.c", "/etc/passwd"]))

    assert resp.status_code == 400
    assert resp.get_json() == error_body(
        400,
        'success_when[0].changed[1] must be a relative path with no ".." component, '
        'got "/etc/passwd"',
    )
    assert find_run(sql, "r1") is None


# ---------------------------------------------------------------- Go durations


def test_an_ask_timeout_in_a_go_duration_sets_a_deadline_to_the_fraction_of_a_second(client, sql):
    advertise(client, "n1", cap("board"))
    doc = contract(
        "r1",
        steps=[
            {
                "id": "q",
                "ask": {"prompt": "go on?", "timeout": {"after": "1m2.25s", "then": "fail"}},
                "out": ["decision"],
            },
            {"id": "a", "uses": "dut", "run": ["x"]},
        ],
    )

    submit(client, doc, 201)

    row = step_row(sql, "r1", 1, "state, ask_deadline - asked_at as wait")
    assert (row["state"], row["wait"]) == ("ASKED", timedelta(seconds=62.25))


def test_a_queue_timeout_in_a_go_duration_is_kept_in_whole_seconds_rounded_up(client, sql):
    advertise(client, "n1", cap("board"))

    submit(client, contract("r1", queue={"timeout": "1.5s"}), 201)
    submit(client, contract("r2", queue={"timeout": "1h30m"}), 202)

    assert run_row(sql, "r1")["queue_timeout_seconds"] == 2
    assert run_row(sql, "r2")["queue_timeout_seconds"] == 5400
