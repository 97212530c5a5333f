"""Execution (docs/design.md#execution-and-claims): what happens to a run's steps once it holds its
nodes.

Every function here runs inside a transaction that has locked the run row and then its steps
(the global lock order), and records in :class:`AfterCommit` what must happen once it commits.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import func
from sqlalchemy.orm import Session

from app.context import Context
from app.contract import parse_duration, parse_requirement
from app.contract.types import StepDef
from app.match import Assignment, match
from app.models import Run, Step
from app.services.end_run import settle_failed, step_did_not_complete
from app.services.notify import AfterCommit
from app.services.records import store_blob
from app.states import (
    ASKED,
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    SKIPPED,
    STEP_OPEN,
    STEP_SETTLED,
    VERIFYING,
)
from app.store.blobs import accepted_blob_names
from app.store.leases import Grant, acquire_lease, delete_leases, run_not_after
from app.store.nodes import Candidates, candidate_adverts
from app.store.runs import add_event, lock_run, set_run_fields, set_run_state
from app.store.steps import bind_steps, lock_steps, update_step
from app.store.teams import OverQuota, take_quota
from app.verdict import StepFacts, changed_paths
from app.wire import ts


class Picture:
    """A locked run and its locked steps, kept in step with every guarded change."""

    def __init__(self, run: Run, steps: Iterable[Step]) -> None:
        self.run = run
        self.steps: dict[int, Step] = {st.seq: st for st in steps}
        self.by_id: dict[str, Step] = {st.step_id: st for st in self.steps.values()}

    def ordered(self) -> list[Step]:
        return [self.steps[k] for k in sorted(self.steps)]

    def needs_met(self, st: Step) -> bool:
        return all(self.steps[n].state in STEP_SETTLED for n in st.needs if n in self.steps)

    def change(self, s: Session, st: Step, expect: Iterable[str], **values: Any) -> bool:
        """One guarded change of a step of the picture (:func:`update_step`); False when the
        step is no longer in one of ``expect``."""
        return update_step(s, st.run_id, st.seq, list(expect), **values) is not None

    def nodes_of_pending(self) -> set[str]:
        return {st.node_id for st in self.steps.values() if st.state == PENDING and st.node_id}


def roles_of(run: Run) -> dict[str, list[str]]:
    """Role -> nodes from ``assigned`` (acquired roles included), minus released roles."""
    return {a["as"]: list(a["nodes"]) for a in run.assigned or [] if not a.get("released")}


def put_mediator_blob(
    s: Session, ctx: Context, run: Run, st: Step, name: str, doc: dict[str, Any]
) -> None:
    """A blob the Mediator writes itself (an acquire step's outcome)."""
    data = json.dumps(doc, sort_keys=True).encode()
    store_blob(s, ctx, run, st.seq, st.attempt, name, data, by="mediator", schema_ok=None)


def _skip(s: Session, pic: Picture, step_id: str | None) -> None:
    target = pic.by_id.get(step_id or "")
    if target is not None and target.state == PENDING:
        pic.change(s, target, [PENDING], state=SKIPPED, ended_at=func.now())


def _quota_room(s: Session, ctx: Context, run: Run) -> bool:
    """Whether the run's team may take one more node (docs/teams.md, "Quotas"): only for a team
    with ``max_nodes``, its ``team_limits`` row locked (created on first use) and its leases
    counted, in a SAVEPOINT, which an over-quota answer rolls back. The row is held to the
    commit, as every placement holds it (docs/queue.md, "Lock order", the acquire after a
    release)."""
    quota = ctx.teams.quota(run.team)
    if quota is None:
        return True
    savepoint = s.begin_nested()
    try:
        take_quota(s, quota.team, quota.apart, 1, quota.max_nodes)
    except OverQuota:
        savepoint.rollback()
        return False
    except BaseException:
        savepoint.rollback()
        raise
    savepoint.commit()
    return True


def run_acquire(s: Session, ctx: Context, pic: Picture, st: Step, after: AfterCommit) -> None:
    """Grab one more node mid-run (docs/contract.md#acquire): live adverts minus unavailable nodes,
    in the matcher's order. A candidate whose lease cannot be had at this moment (its row held by a
    transaction placing a lease there, a reservation written since the read, a lease taken since
    the read: :func:`acquire_lease`) joins the unavailable nodes and the next one is tried; none
    left means "unavailable". It never waits on another transaction (docs/queue.md, "Lock
    order"), and a candidate it did not get leaves no placement behind."""
    spec = st.spec["acquire"]
    want = parse_requirement(spec["want"], f"steps[{st.seq - 1}].acquire.want")
    # Acquire honours reservations like a submit
    # (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits): a running run holds
    # none.
    reserving = ctx.config["queue.reserve_after_seconds"] > 0
    reserved_for = pic.run.priority if reserving else None
    # Its team at its quota: "unavailable", as for a taken node, never a wait.
    if _quota_room(s, ctx, pic.run):
        found = candidate_adverts(s, [want], reserved_for=reserved_for)
    else:
        found = Candidates([], set())
    unavailable = set(found.unavailable)
    ttl = ctx.config["lease.ttl_seconds"]
    not_after: datetime | None = None
    node = None
    # Each look either leases a node or adds one to the unavailable ones: bounded by the fleet.
    while node is None:
        outcome = match([want], found.adverts, unavailable, ordered=True)
        if not isinstance(outcome, Assignment):
            break
        candidate = outcome.roles[0][1][0]
        if not_after is None:
            not_after = run_not_after(s, pic.run.run_id)
        grant = Grant(candidate, want.name, want.capability)
        if acquire_lease(
            s, pic.run.run_id, grant, not_after, ttl, reserved_for=reserved_for, team=pic.run.team
        ):
            node = candidate
        else:
            unavailable.add(candidate)
    if node is not None:
        bind_steps(s, pic.run.run_id, {want.name: node})
        for other in pic.steps.values():
            if other.uses == want.name:
                s.refresh(other)
        assigned = list(pic.run.assigned or []) + [{"as": want.name, "nodes": [node]}]
        set_run_fields(s, pic.run.run_id, assigned=assigned)
        pic.run.assigned = assigned
        put_mediator_blob(s, ctx, pic.run, st, st.step_id, {"state": "acquired", "node": node})
        _skip(s, pic, spec.get("unavailable"))
        after.claim_nodes.add(node)
    else:
        put_mediator_blob(s, ctx, pic.run, st, st.step_id, {"state": "unavailable"})
        _skip(s, pic, spec.get("acquired"))
    pic.change(
        s,
        st,
        [PENDING],
        state=DONE,
        produced=[st.step_id],
        started_at=func.now(),
        ended_at=func.now(),
    )


def raise_ask(s: Session, pic: Picture, st: Step, after: AfterCommit) -> None:
    """PENDING -> ASKED with its deadline (docs/contract.md#ask); the webhook goes out after
    commit."""
    ask = st.spec["ask"]
    timeout = (ask.get("timeout") or {}).get("after")
    values: dict[str, Any] = {"state": ASKED, "asked_at": func.now()}
    if timeout:
        values["ask_deadline"] = func.now() + func.make_interval(
            0, 0, 0, 0, 0, 0, parse_duration(timeout)
        )
    if not pic.change(s, st, [PENDING], **values):
        return
    event: dict[str, Any] = {
        "event": "ask",
        "run_id": st.run_id,
        "seq": st.seq,
        "step": st.step_id,
        "prompt": ask.get("prompt"),
        "answer_path": f"/v1/runs/{st.run_id}/steps/{st.seq}/answer",
    }
    if ask.get("answerers"):
        event["answerers"] = ask["answerers"]
    if st.ask_deadline is not None:
        event["deadline"] = ts(st.ask_deadline)
    after.asks.append(event)


def advance(s: Session, ctx: Context, pic: Picture, after: AfterCommit) -> None:
    """Propagate skips and run acquire steps whose needs are met, to a fixpoint; then raise the
    asks whose needs are met: acquire looks at needs, asks at the picture after it
    (docs/design.md#results-and-settle)."""
    progress = True
    while progress:
        progress = False
        for st in pic.ordered():
            if st.state != PENDING:
                continue
            needs = [pic.steps[n] for n in st.needs if n in pic.steps]
            if needs and all(n.state == SKIPPED for n in needs):
                pic.change(s, st, [PENDING], state=SKIPPED, ended_at=func.now())
                progress = True
            elif st.kind == "acquire" and pic.needs_met(st):
                run_acquire(s, ctx, pic, st, after)
                progress = True
    for st in pic.ordered():
        if st.state == PENDING and st.kind == "ask" and pic.needs_met(st):
            raise_ask(s, pic, st, after)
    after.claim_nodes |= pic.nodes_of_pending()


def settle(s: Session, pic: Picture, after: AfterCommit) -> None:
    """settle_if_done (docs/design.md#settle-and-the-verdict): only a RUNNING or VERIFYING run
    settles. Any step FAILED -> the run FAILED now; nothing open -> VERIFYING, committed before the
    verdict (computed after commit by :func:`app.services.results.complete_verdict`)."""
    run = pic.run
    if run.state not in (RUNNING, VERIFYING):
        return
    failed = [st for st in pic.ordered() if st.state == FAILED]
    if failed:
        freed = settle_failed(
            s,
            run,
            checks=[step_did_not_complete(st.step_id) for st in failed],
            step_error="run failed: a step did not complete",
            cause=f"step {failed[0].step_id} failed",
            by=None,
        )
        run.state = FAILED
        after.settled.append(run.run_id)
        after.released(run.run_id, freed)
        return
    if any(st.state in STEP_OPEN for st in pic.steps.values()):
        return
    if run.state == RUNNING and set_run_state(s, run.run_id, [RUNNING], VERIFYING):
        add_event(s, run.run_id, RUNNING, VERIFYING, "all steps finished", None)
        run.state = VERIFYING
    after.verifying.append(run.run_id)


def step_facts(s: Session, run: Run, steps: Iterable[Step]) -> list[StepFacts]:
    """What the verdict needs of each step. A name counts as produced when an accepted blob of it
    exists for the step's attempt, or the step reported it and no schema judges it (a blob
    rejected by its schema was never stored, so it was not produced)."""
    steps = list(steps)
    accepted_of = accepted_blob_names(s, run.run_id, {st.seq: st.attempt for st in steps})
    facts = []
    for st in steps:
        accepted = accepted_of[st.seq]
        schema = st.spec.get("schema") or {}
        reported = {n for n in (st.produced or []) if n not in schema}
        facts.append(
            StepFacts(
                id=st.step_id,
                kind=st.kind,
                state=st.state,
                exit_code=st.exit_code,
                produced=frozenset(accepted | reported),
                chosen=st.chosen,
                has_result=st.state == DONE,
                exhausted=bool((st.result or {}).get("exhausted")),
                changed=changed_paths(st.result),
            )
        )
    return facts


def release_roles(s: Session, pic: Picture, roles: list[str]) -> list[str]:
    """Delete the leases of the released roles' nodes, unless a node also fills a kept role
    (docs/contract.md#release). The roles are marked released in ``assigned``."""
    current = roles_of(pic.run)
    kept = {n for role, nodes in current.items() if role not in roles for n in nodes}
    freeing = sorted({n for r in roles for n in current.get(r, []) if n not in kept})
    assigned = [dict(a, released=True) if a["as"] in roles else a for a in pic.run.assigned or []]
    set_run_fields(s, pic.run.run_id, assigned=assigned)
    pic.run.assigned = assigned
    return delete_leases(s, pic.run.run_id, freeing)


def starts_anything(steps: Iterable[StepDef]) -> bool:
    """Whether :func:`start_steps` can change a new run's steps. At creation every step is
    PENDING: none is skipped (no need is SKIPPED) and the run cannot settle, so only an acquire
    or an ask step without needs starts by itself."""
    return any(st.kind in ("acquire", "ask") and not st.needs for st in steps)


def start_steps(s: Session, ctx: Context, run_id: str, after: AfterCommit) -> None:
    """At creation RUNNING and at promotion: run acquire steps and raise asks whose needs are
    met, the same order as after a result (docs/design.md#submit-and-dry-run,
    docs/design.md#promotion)."""
    run = lock_run(s, run_id)
    assert run is not None
    pic = Picture(run, lock_steps(s, run_id))
    advance(s, ctx, pic, after)
    settle(s, pic, after)
