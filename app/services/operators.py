"""Operators and broken boards (docs/operators.md): an operator's hold (drain) of a node, strikes
and quarantine, and the node's line as ``GET /v1/nodes`` shows it.

Every transaction here takes its row locks in the global order (docs/queue.md, "Lock order"):
the run a change cancels first (re-read under its lock), then its steps, events and leases, and
the node's ``node_health`` row last."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.context import Caller, Context
from app.contract import is_valid_id
from app.errors import BadRequest, NotFound
from app.models import Run, Step
from app.names import NAME_RULE
from app.services.after_commit import settle_and_wake
from app.services.end_run import settle_cancelled
from app.services.nodechanges import MEDIATOR, lift_quarantine, note_change
from app.services.notify import AfterCommit
from app.services.tx import retrying
from app.states import CLAIMED, PENDING, RUN_FINISHED, RUNNING
from app.store.leases import lease_of_node
from app.store.node_health import (
    Health,
    add_node_event,
    add_strike,
    health_by_node,
    lock_health,
    node_seen,
    write_health,
)
from app.store.nodes import NodeRow, listed_nodes
from app.store.runs import lock_run
from app.wire import ts

HOLD_MODES = ("graceful", "at-boundary")
MAX_REASON_BYTES = 1024


# ---------------------------------------------------------------- the node's line


def effective_drain(advert_drain: str, hold_mode: str | None) -> str:
    """The node drains while either its advert or an operator's hold says so, in the stronger
    mode (at-boundary over graceful); "" when neither does."""
    modes = {advert_drain or "", hold_mode or ""}
    if "at-boundary" in modes:
        return "at-boundary"
    return "graceful" if "graceful" in modes else ""


def node_line(row: NodeRow, health: Health) -> dict[str, Any]:
    """A node as ``GET /v1/nodes`` lists it: its advert, its lease, its effective drain
    (``draining`` a boolean, its mode ``drain_mode``), the operator's ``hold`` and its
    ``health``."""
    n = row.node
    hold = None
    if health.hold_mode is not None:
        hold = {
            "mode": health.hold_mode,
            "reason": health.hold_reason,
            "by": health.hold_by,
            "at": ts(health.hold_at),
        }
    state: dict[str, Any] = {
        "state": "quarantined" if health.quarantined else "ok",
        "strikes": health.strikes,
    }
    if health.quarantined:
        state["since"] = ts(health.quarantined_at)
        state["reason"] = health.quarantine_reason
    mode = effective_drain(n.drain, health.hold_mode)
    return {
        "node_id": n.node_id,
        "label": n.label,
        "instance": n.instance,
        "capabilities": n.capabilities,
        "seen_at": ts(n.seen_at),
        "expires_at": ts(n.expires_at),
        "live": row.live,
        "lease": None
        if row.lease is None
        else {"run_id": row.lease.run_id, "not_after": ts(row.lease.not_after)},
        "draining": bool(mode),
        "drain_mode": mode or None,
        "hold": hold,
        "health": state,
    }


def nodes_lines(s: Session, node_id: str | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """The database's time and the nodes' lines (one node's with ``node_id``, live or not)."""
    now, rows = listed_nodes(s, node_id)
    health = health_by_node(s, [r.node.node_id for r in rows])
    return now, [node_line(r, health.get(r.node.node_id, Health())) for r in rows]


def _line_of(ctx: Context, node_id: str) -> dict[str, Any]:
    with ctx.db.read() as s:
        _, lines = nodes_lines(s, node_id)
    return lines[0]


# ---------------------------------------------------------------- what a request asks


def check_reason(body: Any) -> str:
    """``reason``: required, 1 byte to 1 KiB of UTF-8 (400 naming the field)."""
    reason = body.get("reason") if isinstance(body, dict) else None
    if not isinstance(reason, str) or not reason:
        raise BadRequest("reason: required, a text of 1 byte to 1 KiB")
    if len(reason.encode()) > MAX_REASON_BYTES:
        raise BadRequest(f"reason: at most {MAX_REASON_BYTES} bytes, got {len(reason.encode())}")
    return reason


def check_mode(body: Any) -> str:
    mode = body.get("mode") if isinstance(body, dict) else None
    if mode not in HOLD_MODES:
        raise BadRequest(f"mode: must be one of {', '.join(HOLD_MODES)}, got {json.dumps(mode)}")
    assert isinstance(mode, str)
    return mode


def _known(s: Session, node_id: str) -> None:
    if not is_valid_id(node_id):  # node ids share the run_id grammar (docs/contract.md)
        raise BadRequest(f"node_id must be {NAME_RULE}, got {node_id!r}")
    if not node_seen(s, node_id):
        raise NotFound(f"no such node: {node_id}")


# ---------------------------------------------------------------- after the commit


# ---------------------------------------------------------------- strikes


def strike(ctx: Context, s: Session, node_id: str, why: str, after: AfterCommit) -> None:
    """One strike on the node, in the transaction that ended its run (docs/operators.md,
    "Quarantine"), written last; at ``health.failures_in_a_row`` the node is quarantined."""
    limit = ctx.config["health.failures_in_a_row"]
    if limit <= 0:
        return
    strikes, already = add_strike(s, node_id)
    add_node_event(s, node_id, "strike", why, MEDIATOR)
    if already or strikes < limit:
        return
    reason = f"{strikes} failures in a row; the last: {why}"
    write_health(
        s, node_id, quarantined_at=func.now(), quarantine_reason=reason, quarantine_by=MEDIATOR
    )
    note_change(s, after, node_id, "quarantined", reason, MEDIATOR)
    # A reservation may hold the node: its holder may let go of its other nodes (wake point 10).
    after.wake(f"quarantine of {node_id}")


# ---------------------------------------------------------------- an operator's hold


def _open_steps_on(s: Session, run_id: str, node_id: str) -> set[str]:
    return set(
        s.execute(
            select(Step.state).where(
                Step.run_id == run_id, Step.node_id == node_id, Step.state.in_((PENDING, CLAIMED))
            )
        ).scalars()
    )


def cancel_at_boundary(
    s: Session, node_id: str, by: str, after: AfterCommit, declared_token: str | None = None
) -> str | None:
    """An at-boundary drain takes effect at once when the node's leased run has a step PENDING
    there and none CLAIMED (docs/operators.md, "Drain"): the run is cancelled by ``by``. The run
    is locked first and looked at again under its lock. Returns the cancelled run."""
    lease = lease_of_node(s, node_id)
    if lease is None:
        return None
    run: Run | None = lock_run(s, lease.run_id)
    if run is None or run.state != RUNNING:
        return None
    states = _open_steps_on(s, run.run_id, node_id)
    if CLAIMED in states or PENDING not in states:
        return None
    freed = settle_cancelled(s, run, by, f"cancelled by {by}", declared_token)
    after.settled.append(run.run_id)
    after.released(run.run_id, freed)
    after.wake_anyway = f"at-boundary drain of {node_id}"
    return run.run_id


@retrying
def _hold(
    ctx: Context, node_id: str, mode: str, reason: str, caller: Caller, after: AfterCommit
) -> None:
    with ctx.db.begin() as s:
        _known(s, node_id)
        if mode == "at-boundary":
            cancel_at_boundary(s, node_id, caller.by, after, caller.declared_token)
        lock_health(s, node_id)
        write_health(
            s, node_id, hold_mode=mode, hold_reason=reason, hold_by=caller.by, hold_at=func.now()
        )
        note_change(s, after, node_id, f"drain {mode}", reason, caller.by)
        # A reservation may hold the node (wake point 10).
        after.wake(f"drain of {node_id}")


def hold_node(ctx: Context, node_id: str, body: Any, caller: Caller) -> dict[str, Any]:
    """``POST /v1/nodes/{id}/drain``: an operator's hold, replacing one before it."""
    mode, reason = check_mode(body), check_reason(body)
    return _acted(ctx, node_id, _hold, mode, reason, caller)


@retrying
def _resume(ctx: Context, node_id: str, caller: Caller, after: AfterCommit) -> None:
    with ctx.db.begin() as s:
        _known(s, node_id)
        health = lock_health(s, node_id)
        if health.hold_mode is None:
            return
        write_health(s, node_id, hold_mode=None, hold_reason=None, hold_by=None, hold_at=None)
        note_change(s, after, node_id, "drain lifted", health.hold_reason, caller.by)
        after.wake(f"drain lifted on {node_id}")  # wake points 5 and 9: one wake


def resume_node(ctx: Context, node_id: str, caller: Caller) -> dict[str, Any]:
    """``DELETE /v1/nodes/{id}/drain``: idempotent; lifting a hold wakes the queue before the
    answer."""
    return _acted(ctx, node_id, _resume, caller)


# ---------------------------------------------------------------- quarantine by hand


@retrying
def _quarantine(
    ctx: Context, node_id: str, reason: str, caller: Caller, after: AfterCommit
) -> None:
    with ctx.db.begin() as s:
        _known(s, node_id)
        health = lock_health(s, node_id)
        since = health.quarantined_at if health.quarantined else func.now()
        write_health(
            s, node_id, quarantined_at=since, quarantine_reason=reason, quarantine_by=caller.by
        )
        note_change(s, after, node_id, "quarantined", reason, caller.by)
        after.wake(f"quarantine of {node_id}")  # a reservation may hold it (wake point 10)


def quarantine_node(ctx: Context, node_id: str, body: Any, caller: Caller) -> dict[str, Any]:
    """``POST /v1/nodes/{id}/quarantine``: a repeat replaces the reason (``since`` stays)."""
    reason = check_reason(body)
    return _acted(ctx, node_id, _quarantine, reason, caller)


@retrying
def _lift(ctx: Context, node_id: str, caller: Caller, after: AfterCommit) -> None:
    with ctx.db.begin() as s:
        _known(s, node_id)
        # The open health run first (its run row, docs/queue.md "Lock order"), cancelled in
        # this transaction; then the node's row.
        for run_id in open_health_runs(s, node_id):
            run = lock_run(s, run_id)
            if run is not None and run.state not in RUN_FINISHED:
                freed = settle_cancelled(
                    s, run, caller.by, f"cancelled by {caller.by}", caller.declared_token
                )
                after.settled.append(run_id)
                after.released(run_id, freed)
        health = lock_health(s, node_id)
        if not health.quarantined and not health.strikes:
            return
        if health.quarantined:
            lift_quarantine(s, after, node_id, health.quarantine_reason, caller.by)
        else:
            write_health(s, node_id, strikes=0)


def lift_node(ctx: Context, node_id: str, caller: Caller) -> dict[str, Any]:
    """``DELETE /v1/nodes/{id}/quarantine``: idempotent; resets the strikes and cancels the
    node's open health run."""
    return _acted(ctx, node_id, _lift, caller)


def open_health_runs(s: Session, node_id: str) -> list[str]:
    """The node's health runs not finished (at most one, docs/operators.md)."""
    return sorted(
        s.execute(
            select(Run.run_id).where(
                Run.pinned_node == node_id, Run.state.not_in(tuple(RUN_FINISHED))
            )
        ).scalars()
    )


def _acted(ctx: Context, node_id: str, act: Callable[..., None], *args: Any) -> dict[str, Any]:
    """``act(ctx, node_id, *args, after)`` in its transaction, then what it settled and woke
    (before the answer), and the node's line as it is now."""
    after = AfterCommit()
    act(ctx, node_id, *args, after)
    settle_and_wake(ctx, after)
    return _line_of(ctx, node_id)
