"""A promotion that outlasts ``gate.idle_seconds`` (here: its run row held by another
transaction) may lose the scanning lock while it waits: PostgreSQL ends the idle gate session.
The promotion checks the lock before it commits, rolls back and stops the scan, which leaves a
mark; and the promotions the scan committed before it are told to their nodes' claims all the
same (docs/queue.md, "Which commit frees, and its mark")."""

from __future__ import annotations

from typing import Any

import pytest

from app.listener import CLAIM_CHANNEL
from app.services.queue import wake_queued
from app.store.gate import GateLost
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import app_on, client_of
from tests.support.concurrency import (
    Background,
    await_condition,
    backends_waiting_on_locks,
    connect,
    states,
)
from tests.support.contracts import contract, role
from tests.support.invariants import marks
from tests.support.submitter import submit

IDLE_SECONDS = 1.0


def _gate_sessions(sql: Any) -> int:
    return sql.execute(
        "select count(*) from pg_stat_activity where datname = current_database()"
        " and application_name = 'mediator-gate'"
    ).fetchone()[0]


@pytest.fixture
def scan_lost_in_a_promotion(fresh_db_url: str, tmp_path: Any) -> Any:
    """Two runs waiting for two freed nodes: ``scope-run`` (older, promoted first) and
    ``board-run``, whose row is held while the scan tries to promote it, until the gate's idle
    session has been ended by PostgreSQL. Yields (sql, the scan's outcome, the notifications
    on the claim channel, the marks before the scan)."""
    keys = {"gate.idle_seconds": IDLE_SECONDS}
    with (
        app_on(fresh_db_url, tmp_path / "r", **keys) as app,
        connect(fresh_db_url) as sql,
        connect(fresh_db_url) as holder,
        connect(fresh_db_url) as listener,
    ):
        client = client_of(app)
        advertise(client, "n1", cap("board"))
        advertise(client, "s1", cap("scope"))
        submit(client, contract("h-board"), 201)
        submit(client, contract("h-scope", role("m", "scope")), 201)
        submit(client, contract("scope-run", role("m", "scope")), 202)
        submit(client, contract("board-run"), 202)
        sql.execute("delete from leases")  # both nodes free, and no scan has run since
        before = marks(sql)
        listener.execute(f"listen {CLAIM_CHANNEL}")
        holder.execute("begin")
        holder.execute("select 1 from runs where run_id = 'board-run' for update")
        scan = Background(lambda: wake_queued(app.extensions["mediator"], "nodes freed"))
        await_condition(
            lambda: backends_waiting_on_locks(sql) == 1, "the promotion waiting on its run row"
        )
        await_condition(
            lambda: _gate_sessions(sql) == 0,
            "PostgreSQL ending the idle gate session",
            timeout=30 * IDLE_SECONDS + 30,
        )
        holder.execute("rollback")
        outcome: dict[str, Any] = {}
        try:
            outcome["report"] = scan.result(30)
        except Exception as exc:
            outcome["error"] = exc
        notes = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
        yield sql, outcome, notes, before


def test_a_promotion_that_lost_the_gate_while_it_waited_rolls_back_and_stops_the_scan(
    scan_lost_in_a_promotion: Any,
) -> None:
    sql, outcome, _, before = scan_lost_in_a_promotion
    assert isinstance(outcome.get("error"), GateLost), outcome
    assert states(sql, ["scope-run", "board-run"]) == {
        "scope-run": "RUNNING",
        "board-run": "QUEUED",
    }
    mark, covered = marks(sql)
    assert mark > before[0] and covered < mark  # owed: a mark no scan has covered
    assert sql.execute("select count(*) from wake_debt").fetchone()[0] == 1


def test_a_scan_that_raises_still_tells_the_claims_of_the_runs_it_promoted(
    scan_lost_in_a_promotion: Any,
) -> None:
    _, _, notes, _ = scan_lost_in_a_promotion
    assert notes and "s1" in notes[0], notes
