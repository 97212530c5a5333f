"""Health runs (docs/operators.md, "Health runs"): the reaper queues one for each quarantined,
live node that fits the health check and has none open, and a health run that SUCCEEDS lifts
its node's quarantine in its verdict's transaction."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import func, text
from sqlalchemy.orm import Session

from app.context import Context
from app.healthcheck import HEALTH_PRINCIPAL, fits_check, health_run
from app.models import Run
from app.records import record_location
from app.services.nodechanges import MEDIATOR, lift_quarantine
from app.services.notify import AfterCommit
from app.services.records import manifest
from app.services.tx import retrying
from app.states import QUEUED, SUCCEEDED
from app.store.node_health import add_node_event, lock_health, write_health
from app.store.runs import create_run
from app.store.steps import step_rows

# The quarantined, live nodes whose health run is due: none open, and none queued since the
# quarantine began, or the last one ended at least :recheck seconds ago.
_DUE = """
    SELECT h.node_id, n.capabilities, h.health_runs FROM node_health h
    JOIN nodes n ON n.node_id = h.node_id
    WHERE h.quarantined_at IS NOT NULL AND n.expires_at > now()
      AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.pinned_node = h.node_id
                      AND r.state IN ('QUEUED', 'RUNNING', 'VERIFYING'))
      AND (h.health_queued_at IS NULL OR h.health_queued_at < h.quarantined_at
           OR (SELECT max(r.ended_at) FROM runs r WHERE r.pinned_node = h.node_id)
              <= now() - make_interval(secs => :recheck))
"""
_DUE_NODES = text(_DUE + " ORDER BY h.node_id")
# One of them, locked (another reaper's pass skips it), looked at again under the lock.
_LOCK_DUE = text(_DUE + " AND h.node_id = :node FOR UPDATE OF h SKIP LOCKED")


def queue_due_health_runs(ctx: Context, check: Callable[[], None] = lambda: None) -> list[str]:
    """Step 5 of the reaper's pass: one health run for each node whose run is due, each in a
    transaction of its own (the node's row, then the new run, which waits on nothing). Returns
    the queued run ids. Without ``health.check_contract`` nothing is due."""
    if ctx.health_check is None:
        return []
    recheck = ctx.config["health.recheck_seconds"]
    with ctx.db.read() as s:
        due = s.execute(_DUE_NODES, {"recheck": recheck}).all()
    queued = []
    for node_id, capabilities, _ in due:
        if not fits_check(ctx.health_check, capabilities):
            continue  # no health run can lift it: an operator does
        check()
        run_id = _queue_one(ctx, node_id, recheck)
        if run_id is not None:
            queued.append(run_id)
    return queued


@retrying
def _queue_one(ctx: Context, node_id: str, recheck: int) -> str | None:
    assert ctx.health_check is not None
    with ctx.db.begin() as s:
        row = s.execute(_LOCK_DUE, {"node": node_id, "recheck": recheck}).first()
        if row is None:
            return None  # queued by another pass, lifted, or no longer live
        n = int(row.health_runs) + 1
        contract = health_run(ctx.health_check, node_id, n)
        write_health(s, node_id, health_runs=n, health_queued_at=func.now())
        location = record_location(contract.run_id)
        created_at = create_run(
            s,
            contract,
            state=QUEUED,
            principal=HEALTH_PRINCIPAL,
            token_name=None,
            record_location=location,
            steps=step_rows(contract.run_id, contract.steps, {}),
            pinned_node=node_id,
            cause=f"health check of {node_id}",
        )
        add_node_event(s, node_id, "health run queued", contract.run_id, MEDIATOR)
        ctx.records.open(
            location,
            manifest(
                run_id=contract.run_id,
                work_id=contract.work_id,
                principal=HEALTH_PRINCIPAL,
                token_name=None,
                contract=contract.document,
                created_at=created_at,
                state=QUEUED,
                team=contract.team,
            ),
        )
    return contract.run_id


def health_verdict(s: Session, run: Run, state: str, after: AfterCommit) -> None:
    """In a health run's verdict's transaction, last (its node's row, docs/queue.md "Lock
    order"): on SUCCEEDED the quarantine is lifted and the strikes reset (wake point 9); a FAILED
    one keeps it, and the next is due ``health.recheck_seconds`` after it ended."""
    node_id = run.pinned_node
    if node_id is None or state != SUCCEEDED:
        return
    health = lock_health(s, node_id)
    if not health.quarantined:
        return
    lift_quarantine(s, after, node_id, f"{run.run_id} passed", MEDIATOR, health_ended_at=func.now())
