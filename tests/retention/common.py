"""Runs played to their end through the API, then made old in the database: retention reads only
the database's ``ended_at`` against ``now()`` of the database, so these tests move timestamps back
with SQL rather than sleeping or touching a clock."""

from __future__ import annotations

from typing import Any

from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done, put_blob
from tests.support.contracts import contract, role
from tests.support.rows import scalar
from tests.support.submitter import submit

# Every table that holds rows of a run, with the column naming it.
RUN_TABLES = ("runs", "steps", "run_events", "blobs", "leases")


def finished_run(client: Any, run_id: str, node: str = "n1", *, work: str | None = None) -> None:
    """``run_id`` on ``node`` (a board, advertised here): one step that logs, uploads a blob and
    succeeds; the run ends SUCCEEDED and its Record is sealed."""
    advertise(client, node, cap("board", serial=node))
    top: dict[str, Any] = {}
    if work:  # work key gerrit:<work>; the ledger then shows earlier runs of the work
        top = {"work": {"system": "gerrit", "change_id": work}, "ledger": {"scope": "work"}}
    doc = contract(
        run_id,
        role("dut", serial=node),
        steps=[{"id": "boot", "uses": "dut", "run": ["boot"], "out": ["result.json"]}],
        **top,
    )
    submit(client, doc, 201)
    step = claimed(client, node)
    assert (step["run_id"], step["seq"]) == (run_id, 1)
    assert client.put(f"/v1/runs/{run_id}/steps/1/log", data=b"booted\n").status_code == 200
    assert put_blob(client, run_id, 1, "result.json", b'{"ok": true}') == 204
    assert done(client, run_id, 1, node, produced=["result.json"])["run_state"] == "SUCCEEDED"


def rejected_run(client: Any, run_id: str) -> None:
    """A submit no node of the fleet could ever take: 422, stored FAILED with its reject."""
    submit(client, contract(run_id, role("dut", "no-such-capability")), 422)


def age(sql: Any, run_id: str, days: float) -> None:
    """Make the run ``days`` older: it was created, and ended, that long before it did."""
    sql.execute(
        "update runs set created_at = created_at - make_interval(secs => %s), "
        "ended_at = ended_at - make_interval(secs => %s) where run_id = %s",
        (days * 86400, days * 86400, run_id),
    )


def rows_of(sql: Any, run_id: str) -> dict[str, int]:
    """The run's rows in every table that holds any."""
    return {
        t: scalar(sql, f"select count(*) from {t} where run_id = %s", run_id) for t in RUN_TABLES
    }


def no_rows(sql: Any, run_id: str) -> bool:
    return all(n == 0 for n in rows_of(sql, run_id).values())


def tombstone(sql: Any, run_id: str) -> tuple[bool] | None:
    """(record_pending,) of the run's tombstone, or None when it has none."""
    return sql.execute(
        "select record_pending from run_tombstones where run_id = %s", (run_id,)
    ).fetchone()
