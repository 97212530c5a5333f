"""Ending a run (docs/design.md#settle-and-the-verdict, docs/queue.md#leaving-the-queue): the run
row is locked by the caller's transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app.models import Run
from app.states import FAILED, QUEUED, RUN_ALIVE
from app.store.leases import delete_leases_of_run
from app.store.reservations import release_reservations
from app.store.runs import add_event, settle_run
from app.store.steps import fail_open_steps


def settle_failed(
    s: Session,
    run: Run,
    *,
    checks: list[dict[str, Any]],
    step_error: str,
    cause: str,
    by: str | None,
    by_declared_token: str | None = None,
    reject: dict[str, Any] | None = None,
) -> list[str]:
    """Run -> FAILED with ``ended_at`` and the verdict; its open steps FAILED; its leases deleted.
    Returns the freed nodes: the caller wakes the queue after commit. Guarded by the run state, so
    a run that ended meanwhile is left as it is (returns []). A QUEUED run's reservations are
    deleted too (cancel, queue timeout:
    docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits); the caller's wake hands
    those nodes on."""
    verdict = {"state": FAILED, "checks": checks}
    previous = run.state  # the guarded UPDATE refreshes the ORM object
    if not settle_run(
        s, run.run_id, from_states=RUN_ALIVE, state=FAILED, verdict=verdict, reject=reject
    ):
        return []
    fail_open_steps(s, run.run_id, step_error)
    if previous == QUEUED:
        # A waiting run holds no lease, only perhaps reservations.
        release_reservations(s, run.run_id)
        add_event(s, run.run_id, previous, FAILED, cause, by, by_declared_token)
        return []
    freed = delete_leases_of_run(s, run.run_id)
    add_event(s, run.run_id, previous, FAILED, cause, by, by_declared_token)
    return freed


def step_did_not_complete(step_id: str) -> dict[str, Any]:
    """The check of a run that failed because a step failed (the check ``ran``:
    docs/design.md#settle-and-the-verdict)."""
    return {
        "step": step_id,
        "what": "ran",
        "want": "DONE",
        "got": FAILED,
        "ok": False,
        "note": "a step did not complete",
    }


def cancelled_verdict(note: str) -> dict[str, Any]:
    """The verdict of a cancelled run (docs/queue.md#leaving-the-queue)."""
    return {"state": FAILED, "checks": [{"what": "cancelled", "ok": False, "note": note}]}


def settle_cancelled(
    s: Session, run: Run, by: str, cause: str, by_declared_token: str | None = None
) -> list[str]:
    """A cancelled run is FAILED with the verdict note ``cancelled by: <by>``
    (docs/queue.md#leaving-the-queue, and the at-boundary drain of
    docs/operators.md#graceful-and-at-boundary with ``drain:<node>``); a self-declared ``by`` is
    marked on the event with the token it was declared under (docs/tokens.md#principal)."""
    note = f"cancelled by: {by}"
    return settle_failed(
        s,
        run,
        checks=cancelled_verdict(note)["checks"],
        step_error=note,
        cause=cause,
        by=by,
        by_declared_token=by_declared_token,
    )
