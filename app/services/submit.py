"""Submit and dry-run, and queueing a run (docs/queue.md#on-submit-placed-queued-or-rejected)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from app.context import Caller, Context
from app.contract import Contract, validate_contract
from app.errors import BadRequest, Conflict, Forbidden, MediatorError, NoCandidate
from app.faults import fault
from app.healthcheck import HEALTH_PREFIX
from app.match import (
    NEVER,
    NOT_NOW,
    Assignment,
    Reject,
    fit_within_cap,
    match,
    match_firsts,
    width_exceeded,
)
from app.metrics import SUBMITS
from app.records import record_location
from app.reserve import Held, reserved_against
from app.services.after_commit import settle_and_wake
from app.services.execution import start_steps, starts_anything
from app.services.notify import AfterCommit, commit_notifying
from app.services.observe import estimate_budget, new_run_view, queued_run_view, render_run
from app.services.placement import assigned_json, grants, node_for_role
from app.services.queue import scan_ended_at_marks, wake_after_commit
from app.services.records import manifest
from app.services.teams import Shares, check_queue_room, choose_team, token_team
from app.services.tx import retrying
from app.states import FAILED, QUEUED, RUNNING
from app.store import DuplicateRun, NodeTaken, PrunedRunId
from app.store.clock import await_replicated
from app.store.gate import last_mark
from app.store.leases import lease_rows
from app.store.nodes import Candidates, candidate_adverts, first_candidates
from app.store.queue import queue_place
from app.store.runs import create_run, get_run
from app.store.steps import step_rows
from app.store.teams import OverQuota
from app.teams import Quota, quota_refusal


@dataclass(frozen=True)
class Submitted:
    status: int  # 200 known, 201 RUNNING, 202 QUEUED
    view: dict[str, Any]
    queued: bool = False  # the run was queued (201: promoted by the submit's own wake scan)


@dataclass(frozen=True)
class _Placed:
    """A run created RUNNING: what its answer is built from (no read after commit)."""

    created_at: datetime
    assignment: Assignment
    labels: dict[str, str | None]
    started: bool  # start_steps changed steps at creation: the answer is read back


@dataclass(frozen=True)
class _Refused:
    """A rejected submit, stored FAILED (docs/queue.md#on-submit-placed-queued-or-rejected):
    answered 422 with this reason."""

    reason: str


@dataclass(frozen=True)
class _Queued:
    """Stored QUEUED (docs/queue.md#on-submit-placed-queued-or-rejected). ``mark``: the last wake
    mark read before the candidate read that queued it, and its ``created_at`` (None: not known; the
    submit then scans whatever the marks say and reads the run back)."""

    mark: int | None = None
    created_at: datetime | None = None
    # Every candidate as placement read it, when it read them all: the 202's explanation.
    candidates: Candidates | None = None


def _view(ctx: Context, run_id: str) -> dict[str, Any]:
    with ctx.db.read() as s:
        run = get_run(s, run_id)
        assert run is not None, "a run that was committed is gone"
        return render_run(
            s,
            run,
            reserve_after=ctx.config["queue.reserve_after_seconds"],
            budget=estimate_budget(ctx),
            shares=Shares.of(ctx),
        )


def _manifest(contract: Contract, caller: Caller, state: str, created_at: Any) -> dict[str, Any]:
    return manifest(
        run_id=contract.run_id,
        work_id=contract.work_id,
        principal=caller.principal,
        token_name=caller.token_name,
        contract=contract.document,
        created_at=created_at,
        state=state,
        principal_self_declared=caller.self_declared,
        team=contract.team,
    )


def check_priority(contract: Contract, caller: Caller) -> None:
    """After validation, before anything is read or stored: above the token's ``max_priority``
    is 403, nothing stored (docs/priorities.md#priority, docs/tokens.md#configuring-tokens)."""
    bound = caller.max_priority
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


def _remember_shape(ctx: Context, key: str, queued: bool) -> None:
    """Whether the last submit of shape ``key`` found every candidate busy (see _place)."""
    shapes = ctx.queued_shapes
    if queued:
        if len(shapes) >= SHAPES_REMEMBERED:
            shapes.clear()
        shapes[key] = True
    else:
        shapes.pop(key, None)


SHAPES_REMEMBERED = 10_000


@retrying
def _place(
    ctx: Context, contract: Contract, caller: Caller, after: AfterCommit
) -> _Placed | _Refused | _Queued:
    """Submit in one transaction (docs/design.md#submit-and-dry-run): read the first candidates of
    each role (one statement, bounded by the run's counts, not by the fleet; no locks), match, then
    write the outcome in one round trip — the run RUNNING with its steps, then its nodes' rows,
    placements and leases in the lock order (docs/queue.md, "Lock order"), the run QUEUED with its
    steps, or the rejected submit FAILED with its reject and no steps. A first choice wider than
    ``lease.max_per_run`` reads every candidate once more and searches for one that reuses nodes
    (docs/contract.md#requirements-and-how-runs-are-placed). The read runs before the transaction's
    BEGIN, which goes with the write (``Database.transaction``): in READ COMMITTED it has a snapshot
    of its own either way.

    The run row goes first: a duplicate run_id fails on its key (:class:`DuplicateRun`); a node
    taken since the read fails on ``pk_leases`` and the whole transaction rolls back
    (:class:`NodeTaken`). A run that queues, of a team with ``max_queued``, is then counted
    with its team's queue and may roll back as 429 (docs/teams.md, "Queue length")."""
    location = record_location(contract.run_id)
    who: dict[str, Any] = {
        "principal": caller.principal,
        "token_name": caller.token_name,
        "record_location": location,
        "principal_self_declared": caller.self_declared,  # docs/tokens.md#principal
    }
    with ctx.db.transaction() as s:
        # The last wake mark before the candidate read that queues a run
        # (docs/queue.md#on-submit-placed-queued-or-rejected, closing the submit window): a resource
        # freed after that read takes a mark above it, which is how the submit knows whether its own
        # scan can find anything the read did not. The mark must be read before the read's snapshot
        # is taken, so in a statement of its own: read first when the run's shape queued last time
        # in this process, else only once the read found every candidate busy, and then the read
        # again, after it: that read is of every candidate with what the 202 explains of each,
        # so a run that queues reads its candidates once more at most, never for its 202.
        reserved_for = _reserved_for(ctx, contract)

        def look_whole() -> tuple[Candidates, Assignment | Reject]:
            # The run is expected to queue: every candidate, with what the 202 explains of
            # each (its lease's run, its drain, its reservation), read once for the match and
            # for the explanation (docs/queue.md#what-a-queued-runs-view-explains).
            every = candidate_adverts(
                s,
                contract.requires,
                reserved_for=reserved_for,
                with_holders=True,
                with_leases=True,
            )
            return every, match(contract.requires, every.adverts, every.unavailable, ordered=True)

        quota = ctx.teams.quota(contract.team)
        wide = _wider_than_quota(contract, quota, max(r.count for r in contract.requires))
        if wide:
            create_run(s, contract, state=FAILED, reject=_reject_body("", wide), **who)
            return _Refused(wide)
        mark = last_mark(s) if ctx.queued_shapes.get(contract.requires_key) else None
        every: Candidates | None = None
        if mark is None:
            found = first_candidates(s, contract.requires, reserved_for=reserved_for)
            outcome = match_firsts(contract.requires, found.firsts)
            labels = found.labels
            if isinstance(outcome, Reject) and outcome.why is NOT_NOW:
                mark = last_mark(s)
                every, outcome = look_whole()
        else:
            every, outcome = look_whole()
        if every is not None:
            labels = {a.node_id: a.label for a in every.adverts}
        _remember_shape(
            ctx, contract.requires_key, isinstance(outcome, Reject) and outcome.why is NOT_NOW
        )
        if isinstance(outcome, Reject) and outcome.why is NEVER:
            reason = outcome.reason
            create_run(s, contract, state=FAILED, reject=_reject_body(outcome.role, reason), **who)
            return _Refused(reason)
        if isinstance(outcome, Reject):
            created_at = create_run(
                s,
                contract,
                state=QUEUED,
                steps=step_rows(contract.run_id, contract.steps, {}),
                **who,
            )
            # After the run_id lookup (the insert: a known run_id is answered as it is), and
            # only when the run queues (docs/teams.md, "Queue length").
            check_queue_room(ctx, s, contract.team)
            ctx.records.open(location, _manifest(contract, caller, QUEUED, created_at))
            fault("submit.queued")
            return _Queued(mark, created_at, every)
        cap = ctx.config["lease.max_per_run"]
        over = width_exceeded(outcome, cap)
        if over:
            # The first candidates of each role may take a node apiece where one node could fill
            # several roles (docs/contract.md): only then is every candidate read, once.
            every = every or candidate_adverts(s, contract.requires, reserved_for=reserved_for)
            within = fit_within_cap(
                contract.requires, every.adverts, every.unavailable, cap, ordered=True
            )
            if within is not None:
                outcome, over = within, None
                labels = {a.node_id: a.label for a in every.adverts}
        over = over or _wider_than_quota(contract, quota, len(outcome.nodes()))
        if over:
            create_run(s, contract, state=FAILED, reject=_reject_body("", over), **who)
            return _Refused(over)
        bound = node_for_role(outcome)
        created_at = create_run(
            s,
            contract,
            state=RUNNING,
            assigned=assigned_json(outcome),
            leases=lease_rows(
                contract.run_id,
                grants(outcome, contract.requires),
                ctx.config["lease.ttl_seconds"],
                contract.team,
            ),
            steps=step_rows(contract.run_id, contract.steps, bound),
            # A reservation written after our read must not be passed
            # (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits): NodeTaken
            # rolls the creation back whole.
            unreserved_for=reserved_for,
            # Over its team's quota: OverQuota rolls the creation back whole, and the run queues.
            quota=quota,
            **who,
        )
        fault("submit.after_insert")
        started = starts_anything(contract.steps)
        if started:
            # The ORM's work (acquire steps, asks) joins this transaction.
            with Session(bind=s, expire_on_commit=False) as orm:
                start_steps(orm, ctx, contract.run_id, after)
                orm.flush()
        ctx.records.open(location, _manifest(contract, caller, RUNNING, created_at))
        if not started:
            # Every step is PENDING and nothing starts by itself: the claims of the steps'
            # nodes are all the commit leaves to do, notified in the commit's round trip.
            commit_notifying(s, {bound[st.uses] for st in contract.steps if st.uses in bound})
        return _Placed(created_at, outcome, {n: labels.get(n) for n in outcome.nodes()}, started)


@retrying
def _queue(ctx: Context, contract: Contract, caller: Caller) -> None:
    """Queue a run (docs/queue.md#on-submit-placed-queued-or-rejected) after its placement lost a
    node: the run, its steps through the same builder as RUNNING creation, its Record opened before
    commit. It takes no lease, runs no acquire and raises no ask."""
    location = record_location(contract.run_id)
    with ctx.db.begin() as s:
        created_at = create_run(
            s,
            contract,
            state=QUEUED,
            principal=caller.principal,
            token_name=caller.token_name,
            principal_self_declared=caller.self_declared,
            record_location=location,
            steps=step_rows(contract.run_id, contract.steps, {}),
        )
        check_queue_room(ctx, s, contract.team)
        ctx.records.open(location, _manifest(contract, caller, QUEUED, created_at))
        fault("submit.queued")


def checked_contract(ctx: Context, doc: Any, caller: Caller) -> Contract:
    """The contract validated, its priority checked and its team chosen (docs/teams.md): all
    before the run_id lookup, so a refusal stores nothing. Submit and dry-run alike."""
    contract = validate_contract(doc, capabilities=ctx.config["contract.capabilities"])
    if contract.run_id.startswith(HEALTH_PREFIX):
        # The Mediator's own health runs (docs/operators.md, "Health runs").
        raise BadRequest(f'run id prefix "{HEALTH_PREFIX}" is reserved')
    check_priority(contract, caller)
    return replace(contract, team=choose_team(ctx.teams, caller, contract.queue_team))


def submit_run(ctx: Context, doc: Any, caller: Caller) -> Submitted:
    """Submit a run (docs/queue.md#on-submit-placed-queued-or-rejected), counted by outcome and team
    for the metrics: a refusal before the team is chosen counts under the team the token would get
    without ``queue.team``."""
    team = token_team(ctx.teams, caller)
    try:
        contract = checked_contract(ctx, doc, caller)
        team = contract.team
        submitted = _submit_run(ctx, contract, caller)
    except MediatorError as exc:
        SUBMITS.labels(_REFUSED.get(exc.status, "error"), ctx.teams.label(team)).inc()
        raise
    except Exception:
        SUBMITS.labels("error", ctx.teams.label(team)).inc()
        raise
    outcome = {200: "duplicate", 202: "queued"}.get(submitted.status)
    if outcome is None:  # 201: placed, or queued and promoted by the submit's own wake scan
        outcome = "queued" if submitted.queued else "placed"
    SUBMITS.labels(outcome, ctx.teams.label(team)).inc()
    return submitted


# A refused submit's status -> its outcome in mediator_submits_total.
_REFUSED = {400: "invalid", 403: "forbidden", 409: "pruned_id", 422: "rejected", 429: "queue_full"}


def _submit_run(ctx: Context, contract: Contract, caller: Caller) -> Submitted:
    after = AfterCommit()
    try:
        try:
            outcome = _place(ctx, contract, caller, after)
        except (NodeTaken, OverQuota):
            # Rolled back whole; "no room now" like all busy
            # (docs/queue.md#on-submit-placed-queued-or-rejected), or its team at its quota
            # (docs/teams.md, "Quotas").
            _queue(ctx, contract, caller)
            outcome = _Queued()
    except DuplicateRun:
        # The run_id is the idempotency key, the body is not compared (docs/contract.md#top-level):
        # the insert itself finds a known run, and the answer is the run as it is. It re-reads
        # another request's commit: first, a commit of its own waits for the synchronous
        # standby to hold that one too (docs/deploy.md#11-a-database-with-a-standby).
        with ctx.db.begin() as s:
            await_replicated(s)
        return Submitted(200, _view(ctx, contract.run_id))
    except PrunedRunId:
        # The id stays the key (docs/retention.md#what-a-pruned-run-looks-like).
        raise Conflict("run id used by a pruned run") from None
    if isinstance(outcome, _Refused):
        raise NoCandidate(outcome.reason)
    if isinstance(outcome, _Placed):
        # asks raised, claims notified (docs/design.md#submit-and-dry-run)
        settle_and_wake(ctx, after)
        if outcome.started:
            return Submitted(201, _view(ctx, contract.run_id))
        return Submitted(
            201,
            new_run_view(
                contract,
                caller=caller,
                created_at=outcome.created_at,
                assignment=outcome.assignment,
                labels=outcome.labels,
            ),
        )
    return _queued_answer(ctx, contract, caller, outcome)


def _queued_answer(ctx: Context, contract: Contract, caller: Caller, queued: _Queued) -> Submitted:
    """Close the submit window (docs/queue.md#on-submit-placed-queued-or-rejected): a resource freed
    after our read, whose own scan ran before our QUEUED row was visible, is seen by a scan the
    submit runs itself.

    That scan ends at its first check when it could not change anything. Every freeing commit
    takes a wake mark once it has committed: when no mark was taken since the one read before
    our candidate read, nothing was freed that the read did not see, and a freeing commit whose
    mark comes later is followed by a scan that starts after our QUEUED row was visible. And when
    the reservation step has no work (no reservation stored, no run waited long enough, no
    lower-priority placement since the oldest queued run arrived,
    docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits), a scan would write
    nothing either. Both are read with the run's place in the queue, which the 202 shows anyway, in
    one statement; the scan then takes no gate and reads no queue."""
    scan = True
    cause = f"submit of {contract.run_id}"
    if queued.mark is not None and queued.created_at is not None:
        reserve_after = ctx.config["queue.reserve_after_seconds"]
        started = time.monotonic()
        # Two statements in autocommit (each its own snapshot, as in a READ COMMITTED read): no
        # BEGIN and no ROLLBACK round trip.
        shares = Shares.of(ctx)
        with ctx.db.autocommit() as s:
            # With teams, where the run's team stands orders its place (docs/teams.md).
            standing = shares.read(s) if shares is not None else None
            place = queue_place(
                s,
                contract.run_id,
                contract.priority,
                queued.created_at,
                reserve_after=reserve_after,
                order=Shares.order(standing, contract.team) if standing is not None else None,
            )
            scan = place.mark > queued.mark or place.reservation_work
            if not scan:
                scan_ended_at_marks(cause, time.monotonic() - started)
                if place.state == QUEUED:
                    view = queued_run_view(
                        s,
                        contract,
                        caller=caller,
                        created_at=queued.created_at,
                        place=place,
                        reserve_after=reserve_after,
                        budget=estimate_budget(ctx),
                        shares=shares,
                        standing=standing,
                        found=queued.candidates,
                    )
                    return Submitted(202, view, queued=True)
    if scan:
        wake_after_commit(ctx, cause)
    view = _view(ctx, contract.run_id)
    # Still QUEUED -> 202. Anything else left the queue by a promotion (that scan's or another's)
    # and may have ended since: it was placed, so 201 with the run as it is, never a 202 that
    # carries a final state.
    return Submitted(202 if view["state"] == QUEUED else 201, view, queued=True)


def dry_run(ctx: Context, doc: Any, caller: Caller) -> dict[str, Any]:
    """Match against live adverts only; busy and draining nodes are not read; nothing stored.
    Reserved nodes count as free, with a warning per assigned node reserved against the run."""
    contract = checked_contract(ctx, doc, caller)
    with ctx.db.read() as s:
        # The first candidates of each role, as a submit reads them (the fleet's size costs
        # nothing: docs/design.md#targets), every live one counted free.
        found = first_candidates(s, contract.requires, dry=True)
        held, labels = found.held, found.labels
        outcome = match_firsts(contract.requires, found.firsts)
        if isinstance(outcome, Reject):
            raise NoCandidate(outcome.reason)
        cap = ctx.config["lease.max_per_run"]
        over = width_exceeded(outcome, cap)
        if over:
            # As at submit: only a first choice wider than the cap reads every candidate.
            every = candidate_adverts(s, contract.requires, with_holders=True)
            within = fit_within_cap(contract.requires, every.adverts, set(), cap, ordered=True)
            if within is not None:
                outcome, over = within, None
                held, labels = every.held, {a.node_id: a.label for a in every.adverts}
        quota = ctx.teams.quota(contract.team)
        over = (
            over
            or _wider_than_quota(contract, quota, max(r.count for r in contract.requires))
            or _wider_than_quota(contract, quota, len(outcome.nodes()))
        )
        if over:
            raise NoCandidate(over)
        if ctx.config["queue.reserve_after_seconds"] <= 0:
            held = {}
        warnings = list(contract.warnings) + _reserved_warnings(held, contract, outcome)
    return {
        "run_id": contract.run_id,
        "state": "DRY_RUN",
        "team": contract.team,
        "assigned": [
            {"as": role, "nodes": [{"node": n, "label": labels.get(n)} for n in nodes]}
            for role, nodes in outcome.roles
        ],
        "warnings": warnings,
    }


def _wider_than_quota(contract: Contract, quota: Quota | None, width: int) -> str | None:
    """A run that needs more nodes than its team's ``max_nodes`` could never be placed: 422 at
    submit and dry-run (docs/teams.md, "Quotas")."""
    if quota is None or width <= quota.max_nodes:
        return None
    return quota_refusal(quota.team, width, quota.max_nodes)


def _reserved_warnings(
    held: Mapping[str, Held], contract: Contract, outcome: Assignment
) -> list[str]:
    """Dry-run assigns as if reserved nodes were free (docs/priorities.md#what-you-see), with a
    warning per assigned node reserved against the run."""
    against = reserved_against(held, None, contract.priority)
    return [
        f"node {n} is reserved by run {held[n].run_id} (priority {held[n].priority})"
        for n in outcome.nodes()
        if n in against
    ]
