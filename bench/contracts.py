"""The bodies the benchmark sends: adverts and contracts as a node agent and a submitter send
them (docs/contract.md#writing-contracts, docs/api.md#post-v1nodes--advertise-the-heartbeat), small
and of one shape, so every request of a kind costs the same."""

from __future__ import annotations

import json
from typing import Any

TOKEN = "mediator-bench-token-long-enough-for-32"
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def advert(node_id: str, instance: str = "boot-1", **attrs: str) -> dict[str, Any]:
    return {
        "node_id": node_id,
        "instance": instance,
        "capabilities": [{"capability": "board", "attrs": dict(attrs)}],
    }


def two_steps(run_id: str, **attrs: str) -> dict[str, Any]:
    """flash then boot on one board whose attributes contain ``attrs``: the placed submit of the
    benchmark (one run, one lease, two steps)."""
    return {
        "run_id": run_id,
        "requires": [{"as": "dut", "capability": "board", **attrs}],
        "steps": [
            {"id": "flash", "uses": "dut", "run": ["flash", "image.bin"]},
            {"id": "boot", "uses": "dut", "run": ["boot-test"]},
        ],
    }


def one_step(run_id: str, **attrs: str) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "requires": [{"as": "dut", "capability": "board", **attrs}],
        "steps": [{"id": "work", "uses": "dut", "run": ["work"]}],
    }


def body(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()
