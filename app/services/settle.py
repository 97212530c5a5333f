"""What a commit leaves settled (docs/design.md#settle-and-the-verdict, docs/contract.md#ask,
docs/design.md#records): verdicts of runs whose VERIFYING has committed, ask webhooks, sealing and
run webhooks. Never wakes the queue and never notifies claims: that is
:func:`app.services.after_commit.settle_and_wake`, one layer up, and a wake scan's own
promotions, which hold the scan gate themselves."""

from __future__ import annotations

from typing import Any

from app.context import Context
from app.logs import log
from app.services.execution import step_facts
from app.services.health import health_verdict
from app.services.marks import mark_wake
from app.services.notify import AfterCommit, post_webhook
from app.services.records import seal_run
from app.services.tx import retrying
from app.states import VERIFYING
from app.store.leases import delete_leases_of_run
from app.store.nodes import live_adverts
from app.store.runs import add_event, get_run, lock_run, settle_run
from app.store.steps import lock_steps
from app.verdict import evaluate


@retrying
def complete_verdict(ctx: Context, run_id: str, after: AfterCommit) -> list[str]:
    """The verdict of a run whose VERIFYING has committed (docs/design.md#settle-and-the-verdict);
    also the reaper's re-settle after a crash in between. Its leases are deleted, and a verdict that
    freed nodes takes a wake mark right after its commit; returns the freed nodes (also recorded in
    ``after`` as the cause of the wake that follows)."""
    with ctx.db.begin() as s:
        run = lock_run(s, run_id)
        if run is None or run.state != VERIFYING:
            return []
        steps = lock_steps(s, run_id)
        conditions = run.contract.get("success_when") or []
        # The fleet is read only for a verdict that asks about it (``fleet_has``): a run's end
        # does not pay a read of the whole fleet otherwise.
        fleet = live_adverts(s) if any("fleet_has" in c for c in conditions) else []
        verdict = evaluate(conditions, step_facts(s, run, steps), fleet)
        if not settle_run(
            s, run_id, from_states=[VERIFYING], state=verdict["state"], verdict=verdict
        ):
            return []
        freed = delete_leases_of_run(s, run_id)
        add_event(s, run_id, VERIFYING, verdict["state"], "verdict", None)
        if run.pinned_node is not None:
            health_verdict(s, run, verdict["state"], after)  # last: the node's row
    if freed:
        # The verdict's commit is the one that frees the run's nodes, after the commit that made
        # it VERIFYING: its own mark, before anything else can fail (docs/queue.md, "Which commit
        # frees, and its mark"). A submit that read the fleet between the two commits scans
        # because of this mark.
        mark_wake(ctx)
    after.settled.append(run_id)
    after.released(run_id, freed)
    return freed


def settle_committed(ctx: Context, after: AfterCommit) -> set[str]:
    """Everything a committed change leaves settled, in order: verdicts of runs that reached
    VERIFYING (each verdict that freed nodes has taken its wake mark), ask webhooks, then sealing
    and run webhooks of the runs that ended. Returns the nodes the verdicts freed; the caller
    decides how the queue is scanned for them."""
    freed: set[str] = set()
    for run_id in list(after.verifying):
        try:
            freed.update(complete_verdict(ctx, run_id, after))
        except Exception:
            # The run stays VERIFYING; the reaper settles it again
            # (docs/design.md#settle-and-the-verdict).
            log.exception("verdict failed; the reaper settles it again", run_id=run_id)
    for event in after.asks:
        post_webhook(
            ctx.config["notify.asks_url"], with_page_url(ctx, event), **webhook_limits(ctx)
        )
    for run_id in dict.fromkeys(after.settled):
        seal_run(ctx, run_id)
        announce_settled(ctx, run_id)
    return freed


def webhook_limits(ctx: Context) -> dict[str, Any]:
    """The configured queue size and delivery time-out of webhooks
    (docs/configuration.md#webhooks)."""
    return {
        "queue_size": ctx.config["notify.queue_size"],
        "timeout": ctx.config["notify.timeout_seconds"],
    }


def with_page_url(ctx: Context, event: dict[str, Any]) -> dict[str, Any]:
    """An ask's notification with ``page_url``, where a person answers it in a browser, when
    ``ui.public_url`` says where the pages are (docs/pages.md#asks-asks)."""
    base = ctx.config["ui.public_url"]
    if not base:
        return event
    anchor = f"ask-{event['run_id']}-{event['seq']}"
    return {**event, "page_url": f"{base.rstrip('/')}/asks#{anchor}"}


def announce_settled(ctx: Context, run_id: str) -> None:
    """``notify.runs_url``: a best-effort POST of the run's end (docs/configuration.md#webhooks)."""
    url = ctx.config["notify.runs_url"]
    if not url:
        return
    with ctx.db.read() as s:
        run = get_run(s, run_id)
    if run is not None:
        post_webhook(
            url,
            {"event": "run", "run_id": run_id, "state": run.state, "verdict": run.verdict},
            **webhook_limits(ctx),
        )
