"""The contracts of ``examples/``: each one valid by the server's own validator, without warnings,
listed in examples/README.md; the demo's health check a valid ``health.check_contract`` that
fits its hanging board; and the ones ``mediator demo`` does not run, run here by two real
``mediator agent`` processes with the demo's fleet against a real gunicorn, to the verdict the
README promises (tests/demo/test_demo.py runs the others)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.contract import validate_contract
from app.dev.demo import BROKEN, BURN_IN, FLEET, HEALTH_CHECK, SCENARIO
from app.healthcheck import fits_check, load_health_check
from tests.support.agent_process import agent_on
from tests.support.apps import ROOT
from tests.support.concurrency import await_value
from tests.support.submitter import await_state, run_view, submit

# One gunicorn for the module, its tables emptied before each test (tests/conftest.py).
one_server_per_module = True

EXAMPLES = ROOT / "examples"
FILES = sorted(p.name for p in EXAMPLES.glob("*.yaml"))


def example(name: str, run_id: str | None = None) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    if run_id is not None:
        doc["run_id"] = run_id
    return doc


def test_the_examples_are_the_ones_the_readme_explains() -> None:
    assert FILES == [
        "boot-test.yaml",
        "build-and-test.yaml",
        "burn-in.yaml",
        "fan-out.yaml",
        "lint.yaml",
        "sign-off.yaml",
    ]
    readme = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    for name in [*FILES, HEALTH_CHECK]:
        assert f"| `{name}` |" in readme, name
    assert {p.example for p in SCENARIO} | {BURN_IN} <= set(FILES)


def _advert(node: Any) -> list[dict[str, Any]]:
    """A demo node's capabilities as the Mediator stores its advert."""
    caps = []
    for flag in node.capabilities:
        name, _, attrs = flag.partition(":")
        pairs = (a.split("=", 1) for a in attrs.split(",") if a)
        caps.append({"capability": name, "attrs": dict(pairs)})
    return caps


def test_the_demos_health_check_is_a_health_check_contract_that_fits_the_hanging_board() -> None:
    check = load_health_check(str(EXAMPLES / HEALTH_CHECK))
    assert check is not None
    assert check.run_id == "health-check"
    assert [r.count for r in check.requires] == [1]
    assert check.warnings == ()
    assert fits_check(check, _advert(BROKEN))
    # Only the hanging board is struck in the demo, and only the burn-in runs on it.
    burn_in = validate_contract(example(BURN_IN))
    assert not any(fits_check(burn_in, _advert(n)) for n in FLEET)
    assert fits_check(burn_in, _advert(BROKEN))


@pytest.mark.parametrize("name", FILES)
def test_each_example_is_valid_by_the_servers_own_rules(name: str) -> None:
    doc = example(name)
    contract = validate_contract(doc)
    assert contract.run_id == Path(name).stem  # `mediator status <file stem>` finds it
    assert contract.warnings == ()


def _fleet() -> list[list[str]]:
    """The demo's nodes as the agents' flags."""
    return [
        ["--node-id", n.node_id, *[a for c in n.capabilities for a in ("--capability", c)]]
        for n in FLEET
    ]


def steps_of(view: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    return {s["id"]: (s["state"], s.get("node")) for s in view["steps"]}


pytestmark = pytest.mark.slow


@pytest.fixture
def agents(live_server: Any, tmp_path: Path) -> Any:
    board, host = _fleet()
    for sub in ("board", "host"):
        (tmp_path / sub).mkdir()
    with (
        agent_on(live_server.url, tmp_path / "board", *board) as a,
        agent_on(live_server.url, tmp_path / "host", *host) as b,
    ):
        a.await_event("advertised")
        b.await_event("advertised")
        yield a, b


def test_the_boot_test_flashes_on_the_host_and_boots_on_the_board(
    live_server: Any, agents: Any
) -> None:
    submit(live_server, example("boot-test.yaml"), 201)
    view = await_state(live_server, "boot-test", "SUCCEEDED", "FAILED", timeout=60)
    assert view["state"] == "SUCCEEDED", view
    assert steps_of(view) == {"flash": ("DONE", "host-1"), "boot": ("DONE", "board-1")}
    assert [c["ok"] for c in view["verdict"]["checks"]] == [True, True, True]


def test_the_fan_out_dispatches_to_the_hardware_branch_and_acquires_the_free_board(
    live_server: Any, agents: Any
) -> None:
    submit(live_server, example("fan-out.yaml"), 201)
    view = await_state(live_server, "fan-out", "SUCCEEDED", "FAILED", timeout=60)
    assert view["state"] == "SUCCEEDED", view
    assert steps_of(view) == {
        "plan": ("DONE", "host-1"),
        "quick": ("SKIPPED", "host-1"),
        "on-hardware": ("DONE", None),
        "hw-test": ("DONE", "board-1"),
        "sim-test": ("SKIPPED", "host-1"),
        "report": ("DONE", "host-1"),
    }
    acquired = live_server.get("/v1/runs/fan-out/blob/on-hardware")
    assert acquired.status_code == 200, acquired.text
    assert acquired.json() == {"state": "acquired", "node": "board-1"}


def test_with_the_board_held_the_fan_out_falls_back_and_a_rejected_sign_off_fails(
    live_server: Any, agents: Any
) -> None:
    # The sign-off run holds the board while it waits for its answer.
    submit(live_server, example("sign-off.yaml"), 201)
    await_value(
        lambda: steps_of(run_view(live_server, "sign-off"))["sign-off"][0] == "ASKED",
        "the sign-off to be asked",
        timeout=60,
    )
    submit(live_server, example("fan-out.yaml", "fan-out-no-board"), 201)
    view = await_state(live_server, "fan-out-no-board", "SUCCEEDED", "FAILED", timeout=60)
    assert view["state"] == "SUCCEEDED", view
    states = steps_of(view)
    assert states["on-hardware"] == ("DONE", None)
    assert states["hw-test"][0] == "SKIPPED"
    assert states["sim-test"] == ("DONE", "host-1")
    assert states["report"] == ("DONE", "host-1")
    blob = live_server.get("/v1/runs/fan-out-no-board/blob/on-hardware")
    assert blob.json() == {"state": "unavailable"}

    answer = live_server.post(
        "/v1/runs/sign-off/steps/2/answer",
        {"verdict": "reject", "note": "the boot log shows a warning"},
        headers={"X-Enode-Principal": "qa@lab.example"},
    )
    assert answer.status_code == 200, answer.text
    view = await_state(live_server, "sign-off", "SUCCEEDED", "FAILED", timeout=60)
    assert view["state"] == "FAILED", view
    assert steps_of(view)["publish"] == ("DONE", "board-1")
    checks = {c["step"]: c for c in view["verdict"]["checks"]}
    assert checks["boot"]["ok"] is True
    assert checks["publish"]["ok"] is False and checks["publish"]["got"] == 1
