"""Bodies the original clients send, built in their Go structs' field order, and the few steps
every compatibility test takes (a node advertised, a run submitted, a step claimed)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import requests

from tests.compat.clients import EnodeClient, RunctlClient
from tests.compat.gowire import ADVERT_RESPONSE, CLAIMED_STEP, RUN, decode, go_time
from tests.support.record_contents import tar_files

NODE = "9c1f0e7a5b3d2468"  # node ids are hashes (email ‖ hostname ‖ config path)
LABEL = "owner@lab.test@bench-7"


def capability(name: str = "agent.reason", **attrs: str) -> dict[str, Any]:
    """contract.Capability: {capability, attrs} with the attrs map's keys sorted (Go maps)."""
    return {"capability": name, "attrs": dict(sorted(attrs.items()))}


def advert(
    node_id: str = NODE,
    caps: list[dict[str, Any]] | None = None,
    *,
    label: str = LABEL,
    instance: str = "life-1",
    drain: str = "",
) -> dict[str, Any]:
    """contract.Advert as json.Marshal writes it: label always, instance omitempty, capabilities
    null for a nil slice, policy omitzero."""
    body: dict[str, Any] = {"node_id": node_id, "label": label}
    if instance:
        body["instance"] = instance
    body["capabilities"] = caps
    if drain:
        body["policy"] = {"drain": drain}
    return body


def result(node: str = NODE, *, exit_code: int | None = 0, **fields: Any) -> dict[str, Any]:
    """enode.Result in its field order, each field omitempty as in Go."""
    order = (
        "produced",
        "harness",
        "workspace",
        "changed",
        "error",
        "environment",
        "exited_at",
        "finalized_at",
        "finalize",
        "upload",
        "reason",
        "diagnostics",
    )
    unknown = set(fields) - set(order)
    assert not unknown, f"enode.Result has no field {sorted(unknown)}"
    body: dict[str, Any] = {"node": node}
    if exit_code is not None:
        body["exit_code"] = exit_code
    for key in order:
        if fields.get(key) not in (None, "", [], {}):
            body[key] = fields[key]
    return body


def now_go() -> str:
    return go_time(datetime.now(UTC))


def command_result(*produced: str, exit_code: int = 0, **more: Any) -> dict[str, Any]:
    """What claim.go (Worker.execute) reports for a command that ran to its end: exit code,
    the uploaded names, the environment and the finalize/upload fields of afterExit."""
    fields: dict[str, Any] = {
        "produced": list(produced),
        "environment": {"runtime": "native"},
        "exited_at": now_go(),
        "finalized_at": now_go(),
        "finalize": "ok",
        "upload": "ok",
        "diagnostics": {"changes": "not_measured", "effect": "build"},
    }
    fields.update(more)
    return result(exit_code=exit_code, **fields)


def contract_file(doc: dict[str, Any]) -> bytes:
    """A contract as a person keeps it in a file: indented JSON (runctl sends the bytes as they
    are)."""
    return (json.dumps(doc, indent=2) + "\n").encode()


def one_step(run_id: str = "example-command", **step: Any) -> dict[str, Any]:
    """internal/contract/examples/command.json with ``step`` merged into its one step."""
    doc: dict[str, Any] = {
        "run_id": run_id,
        "work": {"id": {"system": "manual", "change_id": run_id}, "system": "manual"},
        "requires": [{"as": "worker", "capability": "agent.reason"}],
        "steps": [
            {
                "id": "greet",
                "uses": "worker",
                "run": ["sh", "-c", "echo hello > $OUT/greeting.txt"],
                "out": ["greeting.txt"],
                **step,
            }
        ],
        "success_when": [{"step": "greet", "exit_code": 0, "produced": ["greeting.txt"]}],
    }
    return doc


def node_up(enode: EnodeClient, node_id: str = NODE, **attrs: str) -> dict[str, Any]:
    """The agent's first advert with one agent.reason capability; it must be taken."""
    resp = enode.advertise(advert(node_id, [capability(**attrs)]))
    assert resp.status_code == 200, resp.text
    return decode(ADVERT_RESPONSE, resp.content)


def submitted(runctl: RunctlClient, doc: dict[str, Any], status: int = 201) -> dict[str, Any]:
    """runctl submit of ``doc``; the answer must have ``status``. Returns the decoded Run."""
    resp = runctl.submit(contract_file(doc))
    assert resp.status_code == status, resp.text
    return decode(RUN, resp.content)


def claimed(enode: EnodeClient, node_id: str = NODE) -> tuple[dict[str, Any], dict[str, Any]]:
    """A claim that must hand out a step: (the raw JSON object, the decoded enode.Step)."""
    resp = enode.claim(node_id)
    assert resp.status_code == 200, (resp.status_code, resp.text)
    return resp.json(), decode(CLAIMED_STEP, resp.content)


def reported(
    enode: EnodeClient, step: dict[str, Any], body: dict[str, Any] | None = None, **fields: Any
) -> requests.Response:
    """The step's result (``body``, else :func:`result` of ``fields``) as the agent reports it;
    it must be 200."""
    resp = enode.report(step["run_id"], step["seq"], body if body is not None else result(**fields))
    assert resp.status_code == 200, resp.text
    return resp


def view(runctl: RunctlClient, run_id: str) -> dict[str, Any]:
    resp = runctl.status(run_id)
    assert resp.status_code == 200, resp.text
    return resp.json()


def record_files(runctl: RunctlClient, run_id: str) -> dict[str, bytes]:
    """The sealed Record, downloaded as runctl record does: path inside the run's directory ->
    bytes."""
    resp = runctl.record(run_id)
    assert resp.status_code == 200, resp.text
    return tar_files(resp.content, in_run=True)
