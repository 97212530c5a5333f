"""Submit and dry-run (SPEC §6), and queueing a run (SPEC §7)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.context import Caller, Context
from app.contract import Contract, validate_contract
from app.errors import Forbidden, NoCandidate
from app.faults import fault
from app.match import Assignment, Reject, match, width_exceeded
from app.reserve import reserved_against
from app.services.execution import start_steps
from app.services.finish import finish
from app.services.notify import AfterCommit
from app.services.observe import render_run
from app.services.placement import assigned_json, grants, node_for_role
from app.services.queue import wake_after_commit
from app.services.tx import retrying
from app.states import FAILED, QUEUED, RUNNING
from app.store import DuplicateRun, NodeTaken
from app.store.leases import insert_leases
from app.store.nodes import live_adverts, unavailable_node_ids
from app.store.reservations import held_reservations
from app.store.runs import get_run, insert_run
from app.store.steps import insert_steps
from app.wire import ts


@dataclass(frozen=True)
class Submitted:
    status: int  # 200 known, 201 RUNNING, 202 QUEUED
    view: dict[str, Any]


def _view(ctx: Context, run_id: str) -> dict[str, Any]:
    with ctx.db.read() as s:
        run = get_run(s, run_id)
        assert run is not None, "a run that was committed is gone"
        return render_run(s, run, reserve_after=ctx.config["queue.reserve_after_seconds"])


def _manifest(contract: Contract, caller: Caller, state: str, created_at: Any) -> dict[str, Any]:
    return {
        "run_id": contract.run_id,
        "work_id": contract.work_id,
        "requester": caller.principal,
        "token": caller.token_name,
        "contract": contract.document,
        "created_at": ts(created_at),
        "state": state,
    }


@retrying
def _store_rejected(
    ctx: Context, contract: Contract, caller: Caller, reject: dict[str, Any]
) -> None:
    """A rejected submit is born FAILED, with ``reject`` and no steps; it has no Record."""
    with ctx.db.begin() as s:
        insert_run(
            s,
            contract,
            state=FAILED,
            principal=caller.principal,
            token_name=caller.token_name,
            reject=reject,
        )


@retrying
def _create_running(
    ctx: Context, contract: Contract, caller: Caller, assignment: Assignment, after: AfterCommit
) -> None:
    """SPEC §6.7 in one transaction. The run row goes first (a duplicate run_id fails on its key
    before anything else); a node taken since the match fails on ``pk_leases`` and the whole
    transaction rolls back (:class:`NodeTaken`)."""
    with ctx.db.begin() as s:
        created_at = insert_run(
            s,
            contract,
            state=RUNNING,
            principal=caller.principal,
            token_name=caller.token_name,
            assigned=assigned_json(assignment),
        )
        fault("submit.after_insert")
        insert_leases(
            s,
            contract.run_id,
            grants(assignment, contract.requires),
            ctx.config["lease.ttl_seconds"],
        )
        insert_steps(s, contract.run_id, contract.steps, node_for_role(assignment))
        start_steps(s, ctx, contract.run_id, after)
        ctx.records.open(contract.run_id, _manifest(contract, caller, RUNNING, created_at))


@retrying
def _queue(ctx: Context, contract: Contract, caller: Caller) -> None:
    """Queue a run (SPEC §7): the run, its steps through the same function as RUNNING creation,
    its Record opened before commit. It takes no lease, runs no acquire and raises no ask."""
    with ctx.db.begin() as s:
        created_at = insert_run(
            s, contract, state=QUEUED, principal=caller.principal, token_name=caller.token_name
        )
        insert_steps(s, contract.run_id, contract.steps, {})
        ctx.records.open(contract.run_id, _manifest(contract, caller, QUEUED, created_at))
        fault("submit.queued")


LEGACY_MAX_PRIORITY = 100  # the legacy single token, like an operator (SPEC §7a, §13)


def max_priority(caller: Caller) -> int:
    """The highest ``queue.priority`` this caller's token may ask for."""
    return int(getattr(caller, "max_priority", LEGACY_MAX_PRIORITY))


def check_priority(contract: Contract, caller: Caller) -> None:
    """After validation, before the run_id lookup: above the token's bound is 403, nothing stored
    (SPEC §7a)."""
    bound = max_priority(caller)
    if contract.priority > bound:
        raise Forbidden(
            f"queue.priority {contract.priority} is above this token's max_priority {bound}"
        )


def _reserved_for(ctx: Context, contract: Contract) -> int | None:
    """The priority whose reserved nodes a new run may not use (None: reservations are off)."""
    if ctx.config["queue.reserve_after_seconds"] <= 0:
        return None
    return contract.priority


def _reject_body(role: str, reason: str) -> dict[str, Any]:
    return {"Code": 422, "As": role, "Reason": reason}


def submit_run(ctx: Context, doc: Any, caller: Caller) -> Submitted:
    contract = validate_contract(doc, capabilities=ctx.config["contract.capabilities"])
    check_priority(contract, caller)
    with ctx.db.read() as s:
        known = get_run(s, contract.run_id)
        if known is not None:
            # The run_id is the idempotency key: the body is not compared (SPEC §6.2).
            reserve_after = ctx.config["queue.reserve_after_seconds"]
            return Submitted(200, render_run(s, known, reserve_after=reserve_after))
        adverts = live_adverts(s)
        unavailable = unavailable_node_ids(s, reserved_for=_reserved_for(ctx, contract))
    outcome = match(contract.requires, adverts, unavailable)
    try:
        if isinstance(outcome, Reject) and outcome.code == 422:
            _store_rejected(ctx, contract, caller, _reject_body(outcome.role, outcome.reason))
            raise NoCandidate(outcome.reason)
        if isinstance(outcome, Assignment):
            over = width_exceeded(outcome, ctx.config["lease.max_per_run"])
            if over:
                _store_rejected(ctx, contract, caller, _reject_body("", over))
                raise NoCandidate(over)
            try:
                after = AfterCommit()
                _create_running(ctx, contract, caller, outcome, after)
                finish(ctx, after)  # asks raised, claims notified (SPEC §6.7)
                return Submitted(201, _view(ctx, contract.run_id))
            except NodeTaken:
                pass  # rolled back whole; "no room now" like all busy (SPEC §7)
        _queue(ctx, contract, caller)
    except DuplicateRun:
        # A concurrent submit of the same run_id won: answer like a resubmit.
        return Submitted(200, _view(ctx, contract.run_id))
    # Close the submit window: a resource freed after our read, whose own scan ran before our
    # QUEUED row was visible, is seen by this scan (SPEC §7).
    wake_after_commit(ctx, f"submit of {contract.run_id}")
    view = _view(ctx, contract.run_id)
    return Submitted(201 if view["state"] == RUNNING else 202, view)


def dry_run(ctx: Context, doc: Any, caller: Caller) -> dict[str, Any]:
    """Match against live adverts only; busy and draining nodes are not read; nothing stored.
    Reserved nodes count as free, with a warning per assigned node reserved against the run."""
    contract = validate_contract(doc, capabilities=ctx.config["contract.capabilities"])
    check_priority(contract, caller)
    with ctx.db.read() as s:
        adverts = live_adverts(s)
        outcome = match(contract.requires, adverts, set())
        if isinstance(outcome, Reject):
            raise NoCandidate(outcome.reason)
        over = width_exceeded(outcome, ctx.config["lease.max_per_run"])
        if over:
            raise NoCandidate(over)
        warnings = list(contract.warnings) + _reserved_warnings(s, ctx, contract, outcome)
    # The labels of the adverts the match read: no second look at the nodes.
    labels = {a.node_id: a.label for a in adverts}
    return {
        "run_id": contract.run_id,
        "state": "DRY_RUN",
        "assigned": [
            {"as": role, "nodes": [{"node": n, "label": labels.get(n)} for n in nodes]}
            for role, nodes in outcome.roles
        ],
        "warnings": warnings,
    }


def _reserved_warnings(s: Any, ctx: Context, contract: Contract, outcome: Assignment) -> list[str]:
    if ctx.config["queue.reserve_after_seconds"] <= 0:
        return []
    held = held_reservations(s)
    against = reserved_against(held, None, contract.priority)
    return [
        f"node {n} is reserved by run {held[n].run_id} (priority {held[n].priority})"
        for n in outcome.nodes()
        if n in against
    ]
