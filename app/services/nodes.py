"""Node adverts (docs/queue.md#heartbeats-what-a-node-learns): upsert, restart detection, drain,
renewal, wake on new capacity."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from app.context import Context
from app.models import Lease, Run
from app.services.after_commit import settle_and_wake
from app.services.end_run import settle_failed, step_did_not_complete
from app.services.notify import AfterCommit
from app.services.operators import cancel_at_boundary, strike
from app.services.tx import retrying
from app.states import CLAIMED, RUNNING
from app.store.clock import durable_commit
from app.store.leases import leases_of_node
from app.store.nodes import LeaseLine, heartbeat
from app.store.runs import lock_run
from app.store.steps import claimed_by_other_instance, fail_step
from app.wire import ts

DRAINS = ("", "graceful", "at-boundary")
RESTARTED = "node restarted; in-flight step cannot be trusted"


@dataclass(frozen=True)
class Advert:
    node_id: str
    label: str | None
    instance: str | None
    capabilities: list[dict[str, Any]]
    drain: str


def _canonical(capabilities: Any) -> str:
    entries = capabilities if isinstance(capabilities, list) else []
    return json.dumps(sorted(json.dumps(c, sort_keys=True) for c in entries))


def _reply_line(lease: LeaseLine | Lease) -> dict[str, Any]:
    return {
        "run_id": lease.run_id,
        "node": lease.node_id,
        "capability": lease.capability,
        "not_after": ts(lease.not_after),
        "nonce": lease.nonce,
    }


def _leases_reply(ctx: Context, node_id: str) -> list[dict[str, Any]]:
    with ctx.db.read() as s:
        return [_reply_line(lease) for lease in leases_of_node(s, node_id)]


@dataclass(frozen=True)
class _Stored:
    causes: list[str]  # why to wake the queue
    leases: list[dict[str, Any]]  # the reply's lease list, as the commit left it
    at_boundary: bool = False  # the advert's own drain became at-boundary


def _restart(
    ctx: Context, s: Session, advert: Advert, after: AfterCommit, causes: list[str]
) -> None:
    """Fail the runs whose step this node claimed under another instance (restart detection,
    docs/queue.md#heartbeats-what-a-node-learns). The advert holds its node's row already (the one
    lock taken before runs, docs/queue.md, "Lock order"); then every such run's row in run_id order,
    and only then what they own: the steps, the events, the leases."""
    assert advert.instance
    durable_commit(s)  # runs end here: not soft state like the heartbeat itself
    claimed = claimed_by_other_instance(s, advert.node_id, advert.instance)
    runs: dict[str, Run] = {}
    struck = False
    for run_id in sorted({run_id for run_id, _ in claimed}):
        run = lock_run(s, run_id)
        if run is not None and run.state == RUNNING:
            runs[run_id] = run  # else ended meanwhile; the reaper fails open steps of those
    for run_id, seq in claimed:
        run = runs.get(run_id)
        if run is None or not fail_step(s, run_id, seq, from_states=[CLAIMED], error=RESTARTED):
            continue
        step_id = next(
            (c["id"] for i, c in enumerate(run.contract["steps"], 1) if i == seq), str(seq)
        )
        settle_failed(
            s,
            run,
            checks=[step_did_not_complete(step_id)],
            step_error="run failed: " + RESTARTED,
            cause="node restarted",
            by=f"node:{advert.node_id}",
        )
        causes.append(f"node restarted: {advert.node_id} failed {run_id}")
        after.settled.append(run_id)
        struck = True
    if struck:
        # After the runs' locks, the node's node_health row (docs/queue.md, "Lock order", the
        # advert's exception): one strike for the restart that ended its runs.
        strike(ctx, s, advert.node_id, "it restarted mid-step", after)


@retrying
def _store_advert(
    ctx: Context, advert: Advert, principal: str | None, after: AfterCommit
) -> _Stored:
    """The heartbeat's one statement (:func:`heartbeat`) in autocommit: it commits by itself, in
    its one round trip, with no transaction around it (an advert that changes nothing costs one
    small statement: docs/design.md#targets). A restart of the node writes nothing there; it is
    looked at again in one transaction that holds the node row: its failed runs first, then the same
    renewal and store."""
    causes: list[str] = []
    fields: dict[str, Any] = {
        "node_id": advert.node_id,
        "label": advert.label,
        "principal": principal,
        "instance": advert.instance,
        "capabilities": advert.capabilities,
        "drain": advert.drain,
        "window_seconds": ctx.lease_window_seconds,
    }
    with ctx.db.transaction() as conn:
        beat = heartbeat(conn, **fields)
        if beat.restarted:
            beat = heartbeat(conn, **fields, begin=True)  # BEGIN: the row's lock is kept
        if beat.restarted:
            with Session(bind=conn, expire_on_commit=False) as s:  # joins the transaction
                _restart(ctx, s, advert, after, causes)
                s.flush()
            beat = heartbeat(conn, **fields, check_restart=False)
        previous = beat.previous
    if previous is None or not previous.live:
        causes.append(f"node {advert.node_id} is live")
    elif _canonical(previous.capabilities) != _canonical(advert.capabilities):
        causes.append(f"capabilities of {advert.node_id} changed")
    if previous is not None and previous.drain and not advert.drain:
        causes.append(f"drain lifted on {advert.node_id}")
    became = advert.drain == "at-boundary" and (previous is None or previous.drain != "at-boundary")
    if advert.drain and (previous is None or not previous.drain):
        causes.append(f"drain of {advert.node_id}")  # a reservation may hold it (wake point 10)
    return _Stored(causes, [_reply_line(lease) for lease in beat.leases], became)


@retrying
def _cancel_at_boundary(ctx: Context, node_id: str, after: AfterCommit) -> None:
    """The advert's drain became at-boundary: a leased run with a step PENDING on the node and
    none CLAIMED there is cancelled at once (docs/operators.md, "Drain"), by ``drain:<node>``.
    A transaction of its own after the heartbeat's: the run's row first, as everywhere."""
    with ctx.db.begin() as s:
        cancel_at_boundary(s, node_id, f"drain:{node_id}", after)


def advertise(ctx: Context, body: dict[str, Any], principal: str | None) -> dict[str, Any]:
    """Store the advert, wake the queue if capacity appeared, reply with the full lease list."""
    drain = (body.get("policy") or {}).get("drain") or ""
    advert = Advert(
        node_id=body["node_id"],
        label=body.get("label"),
        instance=body.get("instance"),
        capabilities=[
            {"capability": c["capability"], "attrs": dict(c.get("attrs") or {})}
            for c in body.get("capabilities") or []
        ],
        # An unknown drain value is folded to "": a 400 would drop the node from the fleet.
        drain=drain if drain in DRAINS else "",
    )
    after = AfterCommit()
    stored = _store_advert(ctx, advert, principal, after)
    if stored.at_boundary:
        _cancel_at_boundary(ctx, advert.node_id, after)
    for cause in stored.causes:
        after.wake(cause)
    settle_and_wake(ctx, after)
    # After a wake, read again: a run promoted onto this node by it is in this very reply.
    leases = _leases_reply(ctx, advert.node_id) if after.causes() else stored.leases
    return {
        "leases": leases,
        "renew_seconds": ctx.config["lease.renew_seconds"],
        "drain": advert.drain,
    }
