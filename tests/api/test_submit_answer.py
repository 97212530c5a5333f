"""A placed submit's answer is built from what its transaction wrote, not read back: it must be
the run exactly as the run view shows it right after (docs/design.md#submit-and-dry-run,
docs/api.md#get-v1runsrun_id--the-run-view)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.contracts import contract, role


def _contracts() -> list[dict[str, Any]]:
    return [
        contract("one-role", role("dut"), steps=[{"id": "a", "uses": "dut", "run": ["a"]}]),
        contract(
            "two-roles-needs",
            role("dut", soc="imx8"),
            role("host", capability="host"),
            steps=[
                {"id": "build", "uses": "host", "run": ["make"]},
                {"id": "flash", "uses": "dut", "run": ["flash"], "needs": ["build"]},
                {"id": "boot", "uses": "dut", "run": ["boot"], "needs": ["flash"]},
            ],
            work_id="w-1",
        ),
        contract(
            "count-two",
            role("duts", count=2),
            steps=[{"id": "both", "uses": "duts", "run": ["x"]}],
        ),
        contract(
            "role-without-steps",
            role("dut"),
            role("spare", capability="host"),
            steps=[{"id": "a", "uses": "dut", "run": ["a"]}],
            lease={"ttl": "1h"},  # ignored, with a warning
        ),
        contract(
            "ask-after-a-step",
            role("dut"),
            steps=[
                {"id": "a", "uses": "dut", "run": ["a"]},
                {"id": "ok", "ask": {"prompt": "fine?"}, "out": ["decision"], "needs": ["a"]},
            ],
        ),
    ]


@pytest.mark.parametrize("doc", _contracts(), ids=lambda d: d["run_id"])
def test_a_placed_submit_answers_the_run_as_the_run_view_shows_it(client: Any, doc: Any) -> None:
    advertise(client, "b1", cap("board", soc="imx8"), label="bench 1")
    advertise(client, "b2", cap("board", soc="imx8"))
    advertise(client, "h1", cap("host"), label="builder")

    resp = client.post("/v1/runs", json=doc, headers={"X-Enode-Principal": "ci@lab"})

    assert resp.status_code == 201, resp.get_json()
    view = client.get(f"/v1/runs/{doc['run_id']}").get_json()
    assert resp.get_json() == view
    assert view["state"] == "RUNNING" and view["principal"] == "ci@lab"
