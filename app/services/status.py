"""The status page's picture (docs/pages.md#overview-): the queue and what each queued run waits
for, the running runs and their nodes, the nodes, open asks and recent verdicts, read in one
snapshot."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from app.context import Context
from app.reserve import reserved_against
from app.services.observe import explain_roles
from app.services.operators import effective_drain
from app.states import ASKED, CLAIMED, RUNNING, STEP_SETTLED, VERIFYING
from app.store.clock import database_now
from app.store.leases import all_holders
from app.store.node_health import Health, health_by_node
from app.store.nodes import listed_nodes, live_adverts, node_labels
from app.store.queue import queue_depth
from app.store.reservations import draining_and_reserved
from app.store.runs import queued_runs, recently_finished, runs_in_states
from app.store.steps import open_asks, steps_of_runs
from app.wire import ts

SHOWN_QUEUED = 100  # the page lists this many queued runs, oldest first; the depth counts all
SHOWN_RUNNING = 100
SHOWN_FINISHED = 20


def _ago(now: datetime, then: datetime | None) -> str:
    """How long ago, in the largest whole unit: "42 s", "5 min", "3 h", "2 d"."""
    if then is None:
        return ""
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _requirement(wire: dict[str, Any]) -> str:
    """``board soc=imx8mp ×2``: a role's capability, attributes and count (its wire form)."""
    attrs: dict[str, Any] = wire["attrs"] if isinstance(wire.get("attrs"), dict) else {}
    text = " ".join([str(wire.get("capability", "")), *(f"{k}={v}" for k, v in attrs.items())])
    count = wire.get("count", 1)
    return text + (f" ×{count}" if count != 1 else "")


def _until(now: datetime, then: datetime | None) -> str:
    """How long until, like :func:`_ago`; "passed" when it has."""
    if then is None:
        return ""
    if then <= now:
        return "passed"
    return "in " + _ago(then, now)


def _waits_for(line: dict[str, Any]) -> str:
    """One role's wait in words, from its candidates."""
    c = line["candidates"]
    if c["live"] == 0:
        return "no live node matches"
    parts = [f"{c['live']} live", f"{c['busy']} busy"]
    if c["draining"]:
        parts.append(f"{c['draining']} draining")
    if c.get("reserved"):
        parts.append(f"{c['reserved']} reserved")
    text = ", ".join(parts)
    if line["held_by"]:
        text += "; held by " + ", ".join(line["held_by"])
    if line.get("reserved_by"):
        text += "; reserved by " + ", ".join(line["reserved_by"])
    return text


def status(ctx: Context) -> dict[str, Any]:
    """What the overview shows (docs/pages.md#overview-), from one snapshot: the queue in queue
    order with what each role waits for, the running runs, the nodes, the open asks and the runs
    that ended last."""
    with ctx.db.read(snapshot=True) as s:
        now = database_now(s)
        return {
            "observed_at": ts(now),
            "depth": queue_depth(s),
            "queued": _queued(s, now),
            "running": _running(s, now),
            "nodes": _nodes(s, now),
            "asks": _asks(s, now),
            "finished": _finished(s, now),
            "shown_queued": SHOWN_QUEUED,
        }


def _queued(s: Session, now: datetime) -> list[dict[str, Any]]:
    """The first :data:`SHOWN_QUEUED` queued runs, each role with its candidates, who holds them
    and what it waits for."""
    adverts = live_adverts(s)
    draining, held = draining_and_reserved(s)
    holders = all_holders(s)
    # Queued runs share a few requirement shapes: each shape is matched against the fleet once.
    # What is reserved against a run depends on its priority (and on whether it holds some).
    explained: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    holding = {h.run_id for h in held.values()}
    queued = []
    for position, run in enumerate(queued_runs(s, SHOWN_QUEUED), start=1):
        key = (run.requires_key, run.priority, run.run_id if run.run_id in holding else "")
        lines = explained.get(key)
        if lines is None:
            against = reserved_against(held, run.run_id, run.priority)
            lines = explained[key] = explain_roles(
                run.requires, adverts, draining, holders, held, against
            )
        roles = [
            {
                "as": line.get("as"),
                "requirement": _requirement(wire),
                "candidates": line["candidates"],
                "held_by": line["held_by"],
                "waits_for": _waits_for(line),
            }
            for wire, line in zip(run.requires, lines, strict=True)
        ]
        queued.append(
            {
                "run_id": run.run_id,
                "position": position,
                "priority": run.priority,
                "principal": run.principal,
                "created_at": ts(run.created_at),
                "waiting": _ago(now, run.created_at),
                "roles": roles,
            }
        )
    return queued


def _running(s: Session, now: datetime) -> list[dict[str, Any]]:
    """The first :data:`SHOWN_RUNNING` running or verifying runs: their nodes and progress."""
    running_rows = runs_in_states(s, (RUNNING, VERIFYING), SHOWN_RUNNING)
    steps = steps_of_runs(s, [r.run_id for r in running_rows])
    assigned_nodes = sorted(
        {n for r in running_rows for a in (r.assigned or []) for n in a["nodes"]}
    )
    labels = node_labels(s, assigned_nodes)
    running = []
    for run in running_rows:
        run_steps = steps.get(run.run_id, [])
        running.append(
            {
                "run_id": run.run_id,
                "state": run.state,
                "principal": run.principal,
                "since": ts(run.promoted_at or run.created_at),
                "running_for": _ago(now, run.promoted_at or run.created_at),
                "nodes": [
                    {"as": a["as"], "node": n, "label": labels.get(n)}
                    for a in (run.assigned or [])
                    for n in a["nodes"]
                ],
                "done": sum(1 for st in run_steps if st.state in STEP_SETTLED),
                "total": len(run_steps),
                "active": [
                    {"id": st.step_id, "state": st.state, "node": st.node_id}
                    for st in run_steps
                    if st.state in (CLAIMED, ASKED)
                ],
            }
        )
    return running


def _nodes(s: Session, now: datetime) -> list[dict[str, Any]]:
    """Every node: liveness, lease, drain, when it was last seen and its capabilities."""
    _, node_rows = listed_nodes(s)
    health = health_by_node(s, [r.node.node_id for r in node_rows])
    return [
        {
            "node_id": row.node.node_id,
            "label": row.node.label,
            "live": row.live,
            "lease": None
            if row.lease is None
            else {
                "run_id": row.lease.run_id,
                "not_after": ts(row.lease.not_after),
                "until": _until(now, row.lease.not_after),
            },
            # The advert's drain or an operator's hold, the stronger (docs/operators.md).
            "draining": effective_drain(
                row.node.drain, health.get(row.node.node_id, Health()).hold_mode
            ),
            "quarantined": health.get(row.node.node_id, Health()).quarantined,
            "seen_at": ts(row.node.seen_at),
            "seen": _ago(now, row.node.seen_at),
            "capabilities": ", ".join(
                str(c.get("capability"))
                for c in (row.node.capabilities or [])
                if isinstance(c, dict)
            ),
        }
        for row in node_rows
    ]


def _asks(s: Session, now: datetime) -> list[dict[str, Any]]:
    """The open asks: prompt, how long ago, and the deadline."""
    return [
        {
            "run_id": st.run_id,
            "seq": st.seq,
            "step": st.step_id,
            "prompt": (st.spec.get("ask") or {}).get("prompt"),
            "asked": _ago(now, st.asked_at),
            "deadline": ts(st.ask_deadline),
            "deadline_in": _until(now, st.ask_deadline),
        }
        for st, _run in open_asks(s)
    ]


def _finished(s: Session, now: datetime) -> list[dict[str, Any]]:
    """The last :data:`SHOWN_FINISHED` runs to end, with why in a few words."""
    return [
        {
            "run_id": run.run_id,
            "state": run.state,
            "ended_at": ts(run.ended_at),
            "ended": _ago(now, run.ended_at),
            "why": _why(run.verdict, run.reject),
        }
        for run in recently_finished(s, SHOWN_FINISHED)
    ]


def _why(verdict: Any, reject: Any) -> str:
    """A finished run's verdict in a few words: the reject's reason, or the failed checks."""
    if isinstance(reject, dict) and reject.get("Reason"):
        return str(reject["Reason"])
    if isinstance(verdict, dict):
        checks = verdict.get("checks")
        if isinstance(checks, list):
            failed = [c for c in checks if isinstance(c, dict) and c.get("ok") is False]
            if failed:
                return "; ".join(_check(c) for c in failed)
            return f"{len(checks)} checks passed" if checks else ""
    return ""


def _check(c: dict[str, Any]) -> str:
    """``boot: exit_code wanted 0, got 1`` (and the check's note)."""
    text = f"{c.get('step', 'run')}: {c.get('what')}"
    if "want" in c:
        text += f" wanted {c['want']}, got {c.get('got')}"
    if c.get("note"):
        text += f" ({c['note']})"
    return text
