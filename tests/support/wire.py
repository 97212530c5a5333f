"""The API's wire as the tests read it: the one error body, a timestamp of a reply, a request sent
as the route table below spells it; and what a caller's request leaves behind (rows and Record
files), a run with a claimed step, and every /v1 route: for tests that check that a refused
request changes nothing."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.contracts import contract, role
from tests.support.submitter import submit


def error_body(status: int, reason: str) -> dict[str, Any]:
    """The one error body of the API (docs/api.md#conventions)."""
    return {"error": {"code": status, "reason": reason}}


def error_of(resp: Any) -> str:
    """The reason of an error body, checked to be exactly ``{"error": {"code", "reason"}}``."""
    body = resp.get_json(silent=True)
    assert isinstance(body, dict) and set(body) == {"error"}, resp.data[:300]
    assert body["error"]["code"] == resp.status_code
    return body["error"]["reason"]


def when(text: str) -> datetime:
    """A timestamp of a reply (ISO 8601, ``Z`` for UTC) as an aware datetime."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def send(client: Any, method: str, path: str, body: Any) -> Any:
    """``method path`` over ``client`` with ``body``: bytes as they are, anything else as JSON
    (a row of :data:`V1_ROUTES`)."""
    if isinstance(body, bytes):
        return client.open(path, method=method, data=body)
    return client.open(path, method=method, json=body)


_SNAPSHOT_SQL = "SELECT " + ", ".join(
    f"(SELECT coalesce(array_agg(to_jsonb(x)::text ORDER BY to_jsonb(x)::text), '{{}}') FROM {t} x)"
    for t in ("nodes", "runs", "steps", "leases", "run_events", "blobs")
)


def snapshot(sql: Any, records: Path) -> dict[str, Any]:
    """Every row of every table, and every file of the Record store: what "nothing stored" means."""
    row = sql.execute(_SNAPSHOT_SQL).fetchone()
    rows = dict(zip(("nodes", "runs", "steps", "leases", "run_events", "blobs"), row, strict=True))
    files = (
        sorted(
            (str(p.relative_to(records)), p.stat().st_size)
            for p in records.rglob("*")
            if p.is_file()
        )
        if records.exists()
        else []
    )
    return {"rows": rows, "files": files}


WORK_STEP = {
    "id": "work",
    "uses": "dut",
    "run": ["true"],
    "out": ["result.json", "raw.log"],
    "schema": {"result.json": {"type": "object"}},
}


ASK_STEP = {
    "id": "q",
    "needs": [],
    "ask": {"prompt": "looks right?"},
    "out": ["decision"],
    "schema": {"decision": {"type": "object", "properties": {"ok": {"type": "boolean"}}}},
}


def claimed_run(client: Any, sql: Any) -> None:
    """r1 RUNNING on n1: step 1 CLAIMED by n1 (instance i1), step 2 an open ask.

    The claim is made with SQL, not the claim route: a claim starts the process's LISTEN thread,
    whose shutdown would cost every one of these tests a second."""
    advertise(client, "n1", cap("board"), instance="i1")
    submit(client, contract("r1", role("dut"), steps=[WORK_STEP, ASK_STEP]), 201)
    claimed = sql.execute(
        "UPDATE steps SET state = 'CLAIMED', claimed_instance = 'i1', started_at = now()"
        " WHERE run_id = 'r1' AND seq = 1 AND state = 'PENDING' RETURNING seq"
    ).fetchall()
    assert claimed == [(1,)]
    ask = sql.execute("SELECT state FROM steps WHERE run_id = 'r1' AND seq = 2").fetchone()
    assert ask == ("ASKED",)


# Every /v1 route of docs/design.md#routes (1-18a), against a run and a step that exist, so that a
# 401 cannot be mistaken for the route's own 404/409.
V1_ROUTES: list[tuple[str, str, Any]] = [
    ("POST", "/v1/nodes", {"node_id": "n1", "capabilities": [{"capability": "board"}]}),
    ("POST", "/v1/nodes/n1/claim?wait=0", None),
    ("POST", "/v1/runs/r1/steps/1/result", {"node": "n1", "exit_code": 0, "produced": []}),
    (
        "POST",
        "/v1/runs",
        {
            "run_id": "r2",
            "requires": [{"as": "dut", "capability": "board"}],
            "steps": [{"id": "s", "uses": "dut", "run": ["true"]}],
        },
    ),
    (
        "POST",
        "/v1/runs/dry-run",
        {
            "run_id": "r2",
            "requires": [{"as": "dut", "capability": "board"}],
            "steps": [{"id": "s", "uses": "dut", "run": ["true"]}],
        },
    ),
    ("GET", "/v1/runs/r1", None),
    ("GET", "/v1/runs", None),
    ("GET", "/v1/nodes", None),
    ("POST", "/v1/nodes/n1/drain", {"mode": "graceful", "reason": "maintenance"}),
    ("DELETE", "/v1/nodes/n1/drain", None),
    ("POST", "/v1/nodes/n1/quarantine", {"reason": "smoke"}),
    ("DELETE", "/v1/nodes/n1/quarantine", None),
    ("GET", "/v1/capabilities", None),
    ("GET", "/v1/teams", None),
    ("GET", "/v1/teams/usage", None),
    ("GET", "/v1/asks", None),
    ("POST", "/v1/runs/r1/steps/2/answer", {"ok": True}),
    ("POST", "/v1/runs/r1/cancel", None),
    ("PUT", "/v1/runs/r1/steps/1/log", b"a line\n"),
    ("PUT", "/v1/runs/r1/steps/1/blob/result.json", b'{"ok": true}'),
    ("GET", "/v1/runs/r1/blob/result.json", None),
    ("GET", "/v1/runs/r1/steps/1/log", None),
    ("GET", "/v1/runs/r1/ledger", None),
    ("GET", "/v1/runs/r1/record", None),
    ("GET", "/v1/runs/r1/events", None),
]
