"""Builders for contracts and adverts, and small HTTP helpers used across tests."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row


def role(name: str, capability: str = "board", count: int = 1, **attrs: str) -> dict[str, Any]:
    r: dict[str, Any] = {"as": name, "capability": capability, **attrs}
    if count != 1:
        r["count"] = count
    return r


def contract(
    run_id: str, *roles: dict[str, Any], steps: list[dict[str, Any]] | None = None, **top: Any
) -> dict[str, Any]:
    roles = roles or (role("dut"),)
    if steps is None:
        steps = [{"id": f"use-{r['as']}", "uses": r["as"], "run": ["true"]} for r in roles]
    return {"run_id": run_id, "requires": list(roles), "steps": steps, **top}


def cap(capability: str = "board", **attrs: str) -> dict[str, Any]:
    return {"capability": capability, "attrs": dict(attrs)}


def advertise(client: Any, node_id: str, *caps: dict[str, Any], **body: Any) -> Any:
    payload = {"node_id": node_id, "capabilities": list(caps) or [cap()], **body}
    resp = client.post("/v1/nodes", json=payload)
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()


def submit(client: Any, doc: dict[str, Any], status: int | None = None) -> Any:
    resp = client.post("/v1/runs", json=doc)
    if status is not None:
        assert resp.status_code == status, resp.get_json()
    return resp


def state_of(client: Any, run_id: str) -> str:
    resp = client.get(f"/v1/runs/{run_id}")
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()["state"]


def two_steps(run_id: str, uses: str = "dut", **top: Any) -> dict[str, Any]:
    """flash then boot on one node of role ``uses``; boot needs flash (the default)."""
    return contract(
        run_id,
        role(uses),
        steps=[
            {"id": "flash", "uses": uses, "run": ["flash"]},
            {"id": "boot", "uses": uses, "run": ["boot"]},
        ],
        **top,
    )


def chain_over_two_nodes(run_id: str = "run-1") -> dict[str, Any]:
    """Step 1 on the host (node A), step 2 on the board (node B) needing step 1."""
    return contract(
        run_id,
        role("host", "agent.reason"),
        role("dut"),
        steps=[
            {"id": "build", "uses": "host", "run": ["build"]},
            {"id": "boot", "uses": "dut", "run": ["boot"]},
        ],
    )


# Rows, read the way an operator would, over a plain psycopg connection.


def one(sql: Any, query: str, *args: Any) -> dict[str, Any]:
    row = sql.cursor(row_factory=dict_row).execute(query, args).fetchone()
    assert row is not None, (query, args)
    return row


def scalar(sql: Any, query: str, *args: Any) -> Any:
    return sql.execute(query, args).fetchone()[0]
