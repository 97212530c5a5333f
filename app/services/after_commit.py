"""The after-commit work of a request (docs/design.md#results-and-settle): what the commit left
settled, then one wake of the queue and one claim notification for the request and its wake's
promotions (at most one NOTIFY a request: docs/design.md#claims-and-the-long-poll)."""

from __future__ import annotations

from typing import Any

from app.context import Context
from app.services.marks import mark_wake
from app.services.notify import AfterCommit, notify_claimable, post_webhook
from app.services.queue import wake_after_commit
from app.services.settle import settle_committed, webhook_limits
from app.states import RUN_FINISHED
from app.store.runs import get_run


def settle_and_wake(ctx: Context, after: AfterCommit, *, wake: bool = True) -> None:
    """Settle what the commit left, wake the queue once for its causes, then notify the claims of
    the request's nodes and of the wake's promotions. ``wake=False``: the caller wakes itself (the
    reaper's pass wakes once, at its end)."""
    # The mark right after the freeing commit, before the settle, which reads the database
    # (verdicts, webhooks, seals) and can fail; and a failed settle still wakes. Only a commit
    # that freed something marks here: a run that reached VERIFYING frees its nodes in its
    # verdict's commit, which takes its own mark (docs/queue.md, "Which commit frees, and its
    # mark").
    marked = wake and bool(after.wake_causes)
    if marked:
        mark_wake(ctx)
    try:
        if settle_committed(ctx, after):
            marked = True  # a verdict freed nodes and took its mark after its commit
    finally:
        # Even when the settle raised: its freeing commit is followed by a scan.
        causes = after.causes()
        if wake and causes:
            report = wake_after_commit(ctx, "; ".join(causes), notify=False, marked=marked)
            if report is not None:
                after.claim_nodes |= report.claim_nodes
    notify_claimable(ctx, after.claim_nodes)
    announce_node_changes(ctx, after.node_changes)


def announce_node_changes(ctx: Context, changes: list[dict[str, Any]]) -> None:
    """``notify.nodes_url``: a best-effort POST of each change of a node's hold or quarantine,
    after its commit (docs/operators.md)."""
    url = ctx.config["notify.nodes_url"]
    if url:
        for change in changes:
            post_webhook(url, change, **webhook_limits(ctx))


def settle_and_reply(ctx: Context, after: AfterCommit, reply: dict[str, Any]) -> dict[str, Any]:
    """Run the after-commit work; a run that reached VERIFYING in this request has its verdict
    by now, so the reply names the final state."""
    settle_and_wake(ctx, after)
    if after.verifying and "run_state" in reply:
        with ctx.db.read() as s:
            run = get_run(s, reply["run_id"])
            if run is not None and run.state in RUN_FINISHED:
                reply["run_state"] = run.state
    return reply
