"""Cancel (docs/queue.md#leaving-the-queue)."""

from __future__ import annotations

from app.context import Caller, Context
from app.errors import Forbidden, NotFound
from app.faults import fault
from app.models import Run
from app.services.after_commit import settle_and_wake
from app.services.end_run import cancelled_verdict, settle_cancelled
from app.services.notify import AfterCommit
from app.services.tx import retrying
from app.states import RUN_FINISHED, RUNNING
from app.store.runs import LockedRun, fail_running_run, lock_run, lock_run_row


def may_cancel(caller: Caller, run: Run | LockedRun) -> bool:
    """Whether ``caller`` may cancel ``run`` (docs/security.md#authorisation): an operator any run,
    anyone else only the runs submitted with its own token. The cancel below and the run's page
    (which shows Cancel only to those who may) both ask this; the roles of the route itself are
    checked before."""
    return "operator" in caller.roles or run.token_name == caller.token_name


@retrying
def _cancel(ctx: Context, run_id: str, caller: Caller, after: AfterCommit) -> str:
    with ctx.db.begin() as s:
        locked = lock_run_row(s, run_id)
        if locked is None:
            raise NotFound(f"no such run: {run_id}")
        if not may_cancel(caller, locked):
            raise Forbidden("a submitter may cancel only its own runs")
        # Read under the lock: it may have been promoted, or have ended, a moment ago.
        if locked.state in RUN_FINISHED:
            return locked.state
        cause = f"cancelled by {caller.by}"
        freed: list[str] | None = None
        if locked.state == RUNNING:
            # The common cancel in one statement (docs/design.md#targets: a cancel costs no
            # more than a placed submit and its wake).
            note = f"cancelled by: {caller.by}"
            freed = fail_running_run(
                s,
                run_id,
                verdict=cancelled_verdict(note),
                step_error=note,
                cause=cause,
                by=caller.by,
                by_declared_token=caller.declared_token,
            )
        if freed is None:
            run = lock_run(s, run_id)  # held already: the ORM's copy of the row
            assert run is not None
            freed = settle_cancelled(s, run, caller.by, cause, caller.declared_token)
        after.settled.append(run_id)
        after.released(run_id, freed)
        after.wake_anyway = f"cancel of {run_id}"
        fault("cancel.before_commit")
        return "FAILED"


def cancel_run(ctx: Context, run_id: str, caller: Caller) -> dict[str, str]:
    """Cancel a QUEUED or RUNNING run; idempotent: a finished run answers with its state. After
    commit: wake the queue, seal the Record (docs/queue.md#leaving-the-queue)."""
    after = AfterCommit()
    state = _cancel(ctx, run_id, caller, after)
    fault("cancel.after_commit")
    settle_and_wake(ctx, after)
    return {"run_id": run_id, "state": state}
