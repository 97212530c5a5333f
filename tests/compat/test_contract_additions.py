"""The contract fields the original fleet's contracts carry besides those of
docs/contract.md#writing-contracts
(docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl), submitted as runctl
submits a contract file (internal/runctl/client.go, Client.Submit), and what each one changes on the
wire: the claim, the verdict, the warnings."""

from __future__ import annotations

from typing import Any

import pytest

from tests.compat.clients import EnodeClient, RunctlClient
from tests.compat.gowire import ASKS, FAIL, VERDICT, Time, decode, decode_value
from tests.compat.scenario import (
    claimed,
    command_result,
    contract_file,
    node_up,
    one_step,
    reported,
    submitted,
    view,
)

WORKSPACE = {"repo": "gerrit.lab.test/kernel/linux", "rev": "4711abc"}


def refused(runctl: RunctlClient, doc: dict[str, Any]) -> str:
    """runctl submit of ``doc`` must be 400; returns the Fail's reason."""
    resp = runctl.submit(contract_file(doc))
    assert resp.status_code == 400, resp.text
    return decode(FAIL, resp.content)["error"]["reason"]


def only_an_ask(run_id: str, after: str) -> dict[str, Any]:
    """One ask step raised at creation, timing out ``after`` (a Go duration)."""
    return {
        "run_id": run_id,
        "requires": [{"as": "worker", "capability": "agent.reason"}],
        "steps": [
            {"id": "build", "uses": "worker", "run": ["make"]},
            {
                "id": "sign-off",
                "needs": [],
                "ask": {"prompt": "Ship it?", "timeout": {"after": after, "then": "fail"}},
                "out": ["decision"],
                "schema": {
                    "decision": {
                        "type": "object",
                        "properties": {"verdict": {"enum": ["approve", "reject"]}},
                    }
                },
            },
        ],
    }


# ---------------------------------------------------------------------------------- work


def test_work_patchset_parent_rev_and_patch_rev_are_accepted(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/contract/contract.go (Work: system, change_id, patchset int,
    parent_rev, patch_rev) as Gerrit bridges fill it: accepted, the work key unchanged."""
    node_up(enode)
    doc = one_step("gerrit-4711-3")
    doc["work"] = {
        "id": {"system": "gerrit", "change_id": "4711"},
        "system": "gerrit",
        "change_id": "4711",
        "patchset": 3,
        "parent_rev": "9fceb02",
        "patch_rev": "1a2b3c4",
    }
    submitted(runctl, doc)
    assert view(runctl, "gerrit-4711-3")["work_id"] == "gerrit:4711"


def test_work_patchset_must_be_an_integer(enode: EnodeClient, runctl: RunctlClient) -> None:
    """mirrors internal/contract/contract.go (Work.Patchset int: a string fails the decode): a
    patchset that is not an integer is 400 naming the field, not an unknown field."""
    node_up(enode)
    doc = one_step()
    doc["work"] = {"system": "gerrit", "change_id": "4711", "patchset": "3"}
    reason = refused(runctl, doc)
    assert "patchset" in reason
    assert "unknown" not in reason


# --------------------------------------------------------------------------------- steps


def test_step_feedback_is_accepted_as_a_list_of_names(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/contract/contract.go (Step.Feedback []string)."""
    node_up(enode)
    submitted(runctl, one_step(feedback=["greeting.txt"]))


def test_step_feedback_that_is_not_a_list_of_strings_is_400(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/contract/contract.go (Step.Feedback []string: anything else fails the
    decode)."""
    node_up(enode)
    reason = refused(runctl, one_step(feedback="greeting.txt"))
    assert "feedback" in reason
    assert "unknown field" not in reason


@pytest.mark.parametrize("ledger", ["", "none", "list"])
def test_see_ledger_values_are_accepted(
    enode: EnodeClient, runctl: RunctlClient, ledger: str
) -> None:
    """mirrors internal/contract/contract.go (See.Ledger: "", "none", "list")."""
    node_up(enode)
    submitted(runctl, one_step(see={"ledger": ledger, "from": []}))


def test_see_from_that_is_not_empty_is_400(enode: EnodeClient, runctl: RunctlClient) -> None:
    """mirrors internal/contract/contract.go (Contract.Validate: see.from does not exist yet and
    is refused rather than ignored)."""
    node_up(enode)
    assert "see.from" in refused(runctl, one_step(see={"from": ["greeting.txt"]}))


def test_see_ledger_of_an_unknown_value_is_400(enode: EnodeClient, runctl: RunctlClient) -> None:
    """mirrors internal/contract/contract.go (Contract.Validate: an unknown see.ledger is
    refused)."""
    node_up(enode)
    assert "see.ledger" in refused(runctl, one_step(see={"ledger": "all"}))


def test_collect_is_accepted_and_carried_to_the_claim(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/contract/contract.go (Step.Collect: artifact -> workspace path) and
    internal/enode/claim.go (Step.Collect)."""
    node_up(enode)
    submitted(
        runctl,
        one_step(out=["zImage"], workspace=WORKSPACE, collect={"zImage": "arch/arm64/boot/Image"})
        | {"success_when": []},
    )
    _, step = claimed(enode)
    assert step["collect"] == {"zImage": "arch/arm64/boot/Image"}


# ------------------------------------------------------------------ success_when changed


def changed_contract(paths: list[str], *, workspace: bool = True) -> dict[str, Any]:
    extra = {"workspace": WORKSPACE} if workspace else {}
    doc = one_step("change-1", **extra)
    doc["success_when"] = [{"step": "greet", "changed": paths}]
    return doc


def test_success_when_changed_needs_a_workspace(enode: EnodeClient, runctl: RunctlClient) -> None:
    """mirrors internal/contract/contract.go (Condition.Changed: paths in the step's
    workspace): a step without a workspace cannot be judged by it
    (docs/contract.md#success_when)."""
    node_up(enode)
    assert "workspace" in refused(runctl, changed_contract(["a.c"], workspace=False))


def test_success_when_changed_is_ok_when_every_path_changed(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Result.Changed: the check_changed paths the node saw
    changed)."""
    node_up(enode)
    submitted(runctl, changed_contract(["drivers/a.c", "drivers/b.c"]))
    _, step = claimed(enode)
    reported(enode, step, command_result(changed=["drivers/a.c", "drivers/b.c"]))
    run = view(runctl, "change-1")
    assert run["state"] == "SUCCEEDED"
    assert all(c["ok"] for c in decode_value(VERDICT, run["verdict"])["checks"])


def test_success_when_changed_fails_with_a_note_naming_the_paths_not_changed(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Result.Changed) and cmd/runctl/main.go (printRun shows
    each check's note): ``not changed during this step: b, c`` (docs/contract.md#success_when)."""
    node_up(enode)
    submitted(runctl, changed_contract(["a.c", "b.c", "c.c"]))
    _, step = claimed(enode)
    reported(enode, step, command_result(changed=["a.c"]))
    run = view(runctl, "change-1")
    assert run["state"] == "FAILED"
    notes = [c["note"] for c in decode_value(VERDICT, run["verdict"])["checks"] if not c["ok"]]
    assert notes == ["not changed during this step: b.c, c.c"]


# ------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("after", "seconds"), [("1.5h", 5400), ("1h30m", 5400), ("90s", 90), ("250ms", 0.25)]
)
def test_go_durations_are_read_as_go_reads_them(
    enode: EnodeClient, runctl: RunctlClient, after: str, seconds: float
) -> None:
    """mirrors internal/contract/contract.go (AskTimeout.After, read with time.ParseDuration):
    the ask's deadline is its raise time plus that duration (docs/contract.md#top-level)."""
    node_up(enode)
    submitted(runctl, only_an_ask("dur-1", after))
    resp = runctl.asks()
    [item] = decode(ASKS, resp.content)["asks"]
    assert item["step"] == "sign-off"
    raised = decode_value(Time(), resp.json()["asks"][0].get("asked_at"))
    assert item["deadline"] is not None and raised is not None
    assert abs((item["deadline"] - raised).total_seconds() - seconds) < 0.01


def test_queue_timeout_takes_a_go_duration(enode: EnodeClient, runctl: RunctlClient) -> None:
    """mirrors internal/contract/contract.go (durations are Go duration strings everywhere)."""
    node_up(enode)
    doc = one_step()
    doc["queue"] = {"timeout": "1h30m"}
    submitted(runctl, doc)


# ---------------------------------------------------------------------------- requires


def test_requires_count_0_means_1(enode: EnodeClient, runctl: RunctlClient) -> None:
    """mirrors internal/contract/contract.go (Require.Wanted: "0 reads as 1")."""
    node_up(enode)
    doc = one_step()
    doc["requires"] = [{"as": "worker", "capability": "agent.reason", "count": 0}]
    run = submitted(runctl, doc)
    assert [len(a["nodes"]) for a in run["assigned"]] == [1]


# ------------------------------------------------------------------------ unknown keys


@pytest.mark.parametrize("where", ["top", "step", "condition"])
def test_an_unknown_key_is_accepted_with_a_warning_naming_it(
    enode: EnodeClient, runctl: RunctlClient, where: str
) -> None:
    """mirrors internal/contract/contract.go (encoding/json ignores fields the Contract, Step
    and Condition types do not have) and cmd/runctl/main.go (printRun prints every warning
    first): 2xx with a line in warnings (docs/contract.md#warnings)."""
    node_up(enode)
    doc = one_step()
    if where == "top":
        doc["expands_from"] = "plan-7"
    elif where == "step":
        doc["steps"][0]["expands_from"] = "plan-7"
    else:
        doc["success_when"][0]["expands_from"] = "plan-7"
    run = submitted(runctl, doc)
    assert [w for w in run["warnings"] or [] if "expands_from" in w], run["warnings"]


@pytest.mark.parametrize("where", ["agent", "in"])
def test_an_unknown_key_inside_agent_or_in_is_400(
    enode: EnodeClient, runctl: RunctlClient, where: str
) -> None:
    """mirrors internal/enode/claim.go (parseAgentParams, and the agent's in{prompt, from}):
    keys the agent would not understand there stay a 400 (docs/contract.md#warnings)."""
    node_up(enode)
    doc = one_step()
    step = doc["steps"][0]
    del step["run"]
    step["agent"] = {"max_turns": 5}
    step["in"] = {"prompt": "Summarise the workspace."}
    step[where]["temperature"] = 0.2
    doc["success_when"] = [{"step": "greet", "produced": ["greeting.txt"]}]
    assert "temperature" in refused(runctl, doc)


def test_the_run_id_character_set_still_applies(enode: EnodeClient, runctl: RunctlClient) -> None:
    """mirrors internal/runctl/client.go (Client.Status puts the run id in the path as it is):
    Run ids keep their character set (docs/contract.md#top-level)."""
    node_up(enode)
    assert "run_id" in refused(runctl, one_step("kernel/4711"))
