"""Shared pieces of the priority and reservation tests: contracts with a priority, waiting until
a run has waited long enough by the database's own clock, and the reservation rows."""

from __future__ import annotations

from typing import Any

from tests.support.concurrency import await_condition
from tests.support.contracts import contract, role


def single(run_id: str, priority: int = 0, **attrs: str) -> dict[str, Any]:
    """One board, one step; ``queue.priority`` when not 0."""
    doc = contract(run_id, role("dut", **attrs))
    if priority:
        doc["queue"] = {"priority": priority}
    return doc


def wide(run_id: str, count: int = 2, priority: int = 0, **queue: Any) -> dict[str, Any]:
    """``count`` boards in one role, one step on them."""
    doc = contract(run_id, role("duts", count=count))
    if priority or queue:
        doc["queue"] = {**queue, **({"priority": priority} if priority else {})}
    return doc


def has_waited(sql: Any, run_id: str, seconds: float) -> None:
    """Return once the run was created ``seconds`` ago by the database clock (the clock of the
    reservation age): time passing has no event to await."""
    await_condition(
        lambda: sql.execute(
            "select now() - created_at >= make_interval(secs => %s) from runs where run_id = %s",
            (seconds, run_id),
        ).fetchone()[0],
        f"{run_id} to wait {seconds} s",
        timeout=seconds + 10,
    )


def reservations(sql: Any) -> dict[str, str]:
    """node -> holder, as stored."""
    return dict(sql.execute("select node_id, run_id from reservations").fetchall())


def events_like(sql: Any, run_id: str, pattern: str) -> list[str]:
    return [
        r[0]
        for r in sql.execute(
            "select cause from run_events where run_id = %s and cause like %s order by id",
            (run_id, pattern),
        )
    ]
