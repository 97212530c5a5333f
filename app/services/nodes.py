"""Node adverts (SPEC §4): upsert, restart detection, drain, renewal, wake on new capacity."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from app.context import Context
from app.services.ending import end_run_failed, step_did_not_complete
from app.services.finish import finish
from app.services.notify import AfterCommit
from app.services.tx import retrying
from app.states import CLAIMED, RUNNING
from app.store.leases import leases_of_node, renew_leases
from app.store.nodes import lock_previous_advert, upsert_node
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


def _leases_reply(ctx: Context, node_id: str) -> list[dict[str, Any]]:
    with ctx.db.read() as s:
        return [
            {
                "run_id": lease.run_id,
                "node": lease.node_id,
                "capability": lease.capability,
                "not_after": ts(lease.not_after),
                "nonce": lease.nonce,
            }
            for lease in leases_of_node(s, node_id)
        ]


@retrying
def _store_advert(
    ctx: Context, advert: Advert, principal: str | None, after: AfterCommit
) -> list[str]:
    """One transaction in the global lock order: runs failed by a restart (run, steps, leases),
    then lease renewal, then the node row last. Returns the reasons to wake the queue."""
    causes: list[str] = []
    window = ctx.lease_window_seconds
    with ctx.db.begin() as s:
        if advert.instance:
            for run_id, seq in claimed_by_other_instance(s, advert.node_id, advert.instance):
                run = lock_run(s, run_id)
                if run is None or run.state != RUNNING:
                    continue  # ended meanwhile; the reaper fails open steps of finished runs
                if not fail_step(s, run_id, seq, from_states=[CLAIMED], error=RESTARTED):
                    continue
                step_id = next(
                    (c["id"] for i, c in enumerate(run.contract["steps"], 1) if i == seq), str(seq)
                )
                end_run_failed(
                    s,
                    run,
                    checks=[step_did_not_complete(step_id)],
                    step_error="run failed: " + RESTARTED,
                    cause="node restarted",
                    by=f"node:{advert.node_id}",
                )
                causes.append(f"node restarted: {advert.node_id} failed {run_id}")
                after.ended.append(run_id)
        renew_leases(s, advert.node_id, window)
        previous = lock_previous_advert(s, advert.node_id)
        upsert_node(
            s,
            node_id=advert.node_id,
            label=advert.label,
            principal=principal,
            instance=advert.instance,
            capabilities=advert.capabilities,
            drain=advert.drain,
            window_seconds=window,
        )
    if previous is None or not previous.live:
        causes.append(f"node {advert.node_id} is live")
    elif _canonical(previous.capabilities) != _canonical(advert.capabilities):
        causes.append(f"capabilities of {advert.node_id} changed")
    if previous is not None and previous.drain and not advert.drain:
        causes.append(f"drain lifted on {advert.node_id}")
    return causes


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
    for cause in _store_advert(ctx, advert, principal, after):
        after.wake(cause)
    finish(ctx, after)
    # Read after the wake: a run promoted onto this node by it is in this very reply.
    return {
        "leases": _leases_reply(ctx, advert.node_id),
        "renew_seconds": ctx.config["lease.renew_seconds"],
        "drain": advert.drain,
    }
