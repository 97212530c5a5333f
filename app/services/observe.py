"""Observation (docs/api.md#readers): run view, run list, nodes, capabilities. Reads only."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from app.context import Caller, Context
from app.contract.types import Contract, role_from_wire
from app.errors import NotFound
from app.estimate import BUDGET
from app.match import Advert, Assignment, satisfies
from app.models import Run, Step
from app.reserve import Held, reserved_against
from app.services.cancel import may_cancel
from app.services.expected import (
    DEFAULT_MAX_AHEAD,
    EstimateBudget,
    QueuedShapes,
    TeamsNow,
    expected_of,
)
from app.services.operators import nodes_lines
from app.services.placement import node_for_role
from app.services.records import event_document, ledger_entries
from app.services.teams import Shares
from app.states import PENDING, QUEUED, RUNNING
from app.store.clock import database_now
from app.store.nodes import Candidates, candidate_adverts, live_nodes, node_labels
from app.store.queue import QueuedRun, QueuePlace, queue_place
from app.store.runs import get_run, list_runs, run_events
from app.store.steps import steps_of
from app.teams import Standing
from app.wire import mark_declared, ts


@dataclass(frozen=True)
class _NewRun:
    """What :func:`run_summary` reads of a run just created (no ORM instance on the hot path)."""

    run_id: str
    state: str
    created_at: datetime
    work_id: str
    principal: str | None
    token_name: str | None
    principal_self_declared: bool
    priority: int = 0
    team: str = "default"
    ended_at: None = None
    requires_key: str = ""


@dataclass(frozen=True)
class _NewStep:
    """What :func:`_step_view` reads of a step just created PENDING."""

    seq: int
    step_id: str
    kind: str
    needs: list[int]
    uses: str | None
    node_id: str | None
    state: str = PENDING
    chosen: bool = False
    attempt: int = 0
    started_at: None = None
    ended_at: None = None
    error: None = None
    exit_code: None = None


def _step_view(st: Step | _NewStep, ids: dict[int, str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "seq": st.seq,
        "id": st.step_id,
        "kind": st.kind,
        "state": st.state,
        "needs": [ids[n] for n in st.needs if n in ids],
        "chosen": st.chosen,
    }
    if st.attempt:  # omitted on a first attempt (docs/contract.md#loop)
        out["attempt"] = st.attempt
    if st.uses:
        out["uses"] = st.uses
    if st.node_id:
        out["node"] = st.node_id
    if st.started_at:
        out["started_at"] = ts(st.started_at)
    if st.ended_at:
        out["ended_at"] = ts(st.ended_at)
    if st.error:
        out["error"] = st.error
    if st.exit_code is not None:
        out["exit_code"] = st.exit_code
    return out


def explain_roles(
    requires: list[dict[str, Any]],
    adverts: list[Advert],
    draining: set[str],
    holders: dict[str, str],
    held: dict[str, Held],
    against: set[str],
    quarantined: set[str] | None = None,
) -> list[dict[str, Any]]:
    """Each role of a queued run as on the wire, with its candidates {live, busy, draining,
    reserved}, the runs holding the busy ones and the holders of the reserved ones (``holders``:
    node_id -> run, for the live adverts at least; ``held``: node -> its reservation's holder;
    ``against``: the nodes reserved against this run)."""
    lines = []
    for wire in requires:
        role = role_from_wire(wire)
        cands = [a.node_id for a in adverts if satisfies(a, role)]
        busy = [n for n in cands if n in holders]
        line = dict(wire)
        line["candidates"] = {
            "live": len(cands),
            "busy": len(busy),
            "draining": len([n for n in cands if n in draining and n not in holders]),
            # docs/operators.md: live, not busy, not draining, quarantined.
            "quarantined": len(
                [
                    n
                    for n in cands
                    if n in (quarantined or ()) and n not in holders and n not in draining
                ]
            ),
            "reserved": len([n for n in cands if n in against]),
        }
        line["held_by"] = sorted({holders[n] for n in busy})
        line["reserved_by"] = sorted({held[n].run_id for n in cands if n in against})
        lines.append(line)
    return lines


def _queue_explanation(
    s: Session | Connection,
    run: Run | _NewRun,
    requires: list[dict[str, Any]],
    view: dict[str, Any],
    reserve_after: int,
    place: QueuePlace,
    budget: EstimateBudget | None = None,
    shares: Shares | None = None,
    standing: Standing | None = None,
    found: Candidates | None = None,
) -> None:
    """Per role: candidates {live, busy, draining, reserved}, the runs holding the busy ones and
    the holders of the reserved ones; the run's priority, its own reservation and its place in
    the queue, at read time (docs/queue.md#what-a-queued-runs-view-explains,
    docs/priorities.md#what-you-see); with ``shares``, its team's share (docs/teams.md, "What a
    queued run shows"). A statement for the candidates with their leases, drains and reservations,
    ``place``, and one for the share."""
    if found is None:
        found = candidate_adverts(
            s, [role_from_wire(wire) for wire in requires], with_holders=True, with_leases=True
        )
    held = found.held
    against = reserved_against(held, run.run_id, run.priority)
    view["requires"] = explain_roles(
        requires, found.adverts, found.draining, found.holders, held, against, found.quarantined
    )
    view["candidates_at"] = ts(place.now)
    view["priority"] = run.priority
    waited = (place.now - run.created_at).total_seconds()
    view["reserving"] = bool(place.own) or (reserve_after > 0 and waited >= reserve_after)
    if view["reserving"]:
        view["reserved"] = place.own
    view["queue"] = {"position": place.ahead + 1, "ahead": place.ahead}
    if shares is not None:
        counts = [int(wire.get("count", 1)) for wire in requires]
        standing = standing if standing is not None else shares.read(s)
        view["share"] = shares.view(standing, run.team, counts)
    queued = QueuedRun(
        run.run_id, run.created_at, run.requires_key, requires, run.priority, run.team
    )
    budget = budget or EstimateBudget(DEFAULT_MAX_AHEAD, QueuedShapes())
    teams = _teams_now(shares, standing, run.team)
    view.update(
        expected_of(s, queued, found, now=place.now, ahead=place.ahead, budget=budget, teams=teams)
    )


def estimate_budget(ctx: Context) -> EstimateBudget:
    """A request's budget of runs ahead, with the process's list of queued shapes."""
    return EstimateBudget(ctx.config["estimate.max_ahead"], ctx.estimate_shapes)


def _teams_now(shares: Shares | None, standing: Standing | None, team: str) -> TeamsNow | None:
    """What the expected start of a queued run of ``team`` reads of the teams (None without)."""
    if shares is None or standing is None:
        return None
    return TeamsNow(
        Shares.order(standing, team),
        standing,
        float(shares.running_charge_seconds),
        float(shares.half_life_seconds),
    )


def render_run(
    s: Session,
    run: Run,
    *,
    reserve_after: int = 0,
    budget: EstimateBudget | None = None,
    shares: Shares | None = None,
) -> dict[str, Any]:
    """The run view (docs/api.md#get-v1runsrun_id--the-run-view); ``reserve_after`` is
    ``queue.reserve_after_seconds`` (a QUEUED run that waited that long shows as reserving);
    ``budget``: the runs ahead its expected start may look at (``estimate.max_ahead``)."""
    view = run_summary(run)
    if run.assigned:
        labels = node_labels(s, sorted({n for a in run.assigned for n in a["nodes"]}))
        view["assigned"] = [
            {"as": a["as"], "nodes": [{"node": n, "label": labels.get(n)} for n in a["nodes"]]}
            for a in run.assigned
        ]
    if run.reject:
        view["reject"] = run.reject
    if run.verdict:
        view["verdict"] = run.verdict
    steps = steps_of(s, run.run_id)
    ids = {st.seq: st.step_id for st in steps}
    view["steps"] = [_step_view(st, ids) for st in steps]
    if run.warnings:
        view["warnings"] = run.warnings
    view["requires"] = run.requires
    if run.state == QUEUED:
        standing = shares.read(s) if shares is not None else None
        place = queue_place(
            s,
            run.run_id,
            run.priority,
            run.created_at,
            reserve_after=reserve_after,
            order=Shares.order(standing, run.team) if standing is not None else None,
        )
        _queue_explanation(
            s, run, run.requires, view, reserve_after, place, budget, shares, standing
        )
    return view


def _new_run(contract: Contract, caller: Caller, state: str, created_at: datetime) -> _NewRun:
    return _NewRun(
        run_id=contract.run_id,
        state=state,
        created_at=created_at,
        work_id=contract.work_id,
        principal=caller.principal,
        token_name=caller.token_name,
        principal_self_declared=caller.self_declared,
        priority=contract.priority,
        team=contract.team,
        requires_key=contract.requires_key,
    )


def _new_steps(contract: Contract, bound: dict[str, str]) -> list[dict[str, Any]]:
    ids = {st.seq: st.id for st in contract.steps}
    steps = [
        _NewStep(
            seq=st.seq,
            step_id=st.id,
            kind=st.kind,
            needs=list(st.needs),
            uses=st.uses,
            node_id=bound.get(st.uses) if st.uses else None,
        )
        for st in contract.steps
    ]
    return [_step_view(st, ids) for st in steps]


def new_run_view(
    contract: Contract,
    *,
    caller: Caller,
    created_at: datetime,
    assignment: Assignment,
    labels: dict[str, str | None],
) -> dict[str, Any]:
    """The view of a run just created RUNNING whose steps are all PENDING, built from what was
    written (:func:`render_run` would read it back): the submit's answer."""
    view = run_summary(_new_run(contract, caller, RUNNING, created_at))
    view["assigned"] = [
        {"as": role, "nodes": [{"node": n, "label": labels.get(n)} for n in nodes]}
        for role, nodes in assignment.roles
    ]
    view["steps"] = _new_steps(contract, node_for_role(assignment))
    if contract.warnings:
        view["warnings"] = list(contract.warnings)
    view["requires"] = [r.to_wire() for r in contract.requires]
    return view


def queued_run_view(
    s: Session | Connection,
    contract: Contract,
    *,
    caller: Caller,
    created_at: datetime,
    place: QueuePlace,
    reserve_after: int,
    budget: EstimateBudget | None = None,
    shares: Shares | None = None,
    standing: Standing | None = None,
    found: Candidates | None = None,
) -> dict[str, Any]:
    """The view of a run just queued and still QUEUED at ``place``, built from what was written
    (its steps all PENDING on no node) with the explanation of its wait, as :func:`render_run`
    would show it: the submit's 202. ``found``: the candidates as the placement read them, with
    their holders, leases and drains (else read now)."""
    run = _new_run(contract, caller, QUEUED, created_at)
    view = run_summary(run)
    view["steps"] = _new_steps(contract, {})
    if contract.warnings:
        view["warnings"] = list(contract.warnings)
    requires = [r.to_wire() for r in contract.requires]
    _queue_explanation(
        s, run, requires, view, reserve_after, place, budget, shares, standing, found
    )
    return view


def run_view(ctx: Context, run_id: str) -> dict[str, Any]:
    with ctx.db.read(snapshot=True) as s:
        run = get_run(s, run_id)
        if run is None:
            raise NotFound(f"no such run: {run_id}")
        return render_run(
            s,
            run,
            reserve_after=ctx.config["queue.reserve_after_seconds"],
            budget=estimate_budget(ctx),
            shares=Shares.of(ctx),
        )


def run_page(ctx: Context, run_id: str, caller: Caller) -> dict[str, Any]:
    """What a run's page shows (docs/pages.md#a-run-runsrun_id), from one snapshot: the run view,
    its events, the artifacts of the run itself (its ledger without earlier runs of the same work),
    and whether ``caller`` may cancel it by the cancel's own rule (the page's Cancel is for those
    who may)."""
    with ctx.db.read(snapshot=True) as s:
        run = get_run(s, run_id)
        if run is None:
            raise NotFound(f"no such run: {run_id}")
        view = render_run(
            s,
            run,
            reserve_after=ctx.config["queue.reserve_after_seconds"],
            budget=estimate_budget(ctx),
            shares=Shares.of(ctx),
        )
        events = [event_document(e) for e in run_events(s, run_id)]
        artifacts = [e for e in ledger_entries(s, run) if e.get("run_id", run_id) == run_id]
    return {
        "run": view,
        "events": events,
        "artifacts": artifacts,
        "may_cancel": may_cancel(caller, run),
    }


def run_summary(run: Run | _NewRun) -> dict[str, Any]:
    out: dict[str, Any] = {
        "run_id": run.run_id,
        "state": run.state,
        "created_at": ts(run.created_at),
        # As stored, configured or not (docs/teams.md).
        "team": run.team,
    }
    if run.work_id:
        out["work_id"] = run.work_id
    if run.principal:
        out["principal"] = run.principal
        mark_declared(out, "principal", run.token_name if run.principal_self_declared else None)
    if run.ended_at:
        out["ended_at"] = ts(run.ended_at)
    return out


def runs_list(
    ctx: Context,
    *,
    state: str | None,
    since: datetime | None,
    work: str | None,
    before: tuple[datetime, str] | None,
    limit: int,
    team: str | None = None,
) -> dict[str, Any]:
    with ctx.db.read() as s:
        now = database_now(s)
        rows = list_runs(
            s, state=state, since=since, work=work, before=before, limit=limit, team=team
        )
        summaries = [run_summary(r) for r in rows]
        _expected_in_rows(ctx, s, rows, summaries)
    out: dict[str, Any] = {"observed_at": ts(now), "runs": summaries}
    if len(rows) == limit:
        last = rows[-1]
        out["next"] = f"{ts(last.created_at)},{last.run_id}"
    return out


def _expected_in_rows(
    ctx: Context, s: Session, rows: list[Run], summaries: list[dict[str, Any]]
) -> None:
    """``expected_start`` and ``expected_basis`` of each QUEUED row (docs/queue.md, "What a
    QUEUED run's view explains"), under one budget of ``estimate.max_ahead`` runs for the whole
    list, each row estimated counting as one: once it is spent, the rows after get null with
    basis ``budget`` and cost no statement. Rows are estimated in queue order (priority, then
    age), whatever the list's order."""
    queued = [(r, out) for r, out in zip(rows, summaries, strict=True) if r.state == QUEUED]
    if not queued:
        return
    # The front of the queue first: its estimates are the ones a budget should not go without.
    queued.sort(key=lambda pair: (-pair[0].priority, pair[0].created_at, pair[0].run_id))
    budget = estimate_budget(ctx)
    shares = Shares.of(ctx)
    standing = shares.read(s) if shares is not None else None
    for run, out in queued:
        if budget.left <= 0:
            out.update(expected_start=None, expected_basis=BUDGET)
            continue
        budget.left -= 1
        teams = _teams_now(shares, standing, run.team)
        place = queue_place(
            s,
            run.run_id,
            run.priority,
            run.created_at,
            reserve_after=ctx.config["queue.reserve_after_seconds"],
            order=teams.order if teams is not None else None,
        )
        if place.state != QUEUED:
            continue  # left the queue since the list's read
        found = candidate_adverts(
            s, [role_from_wire(w) for w in run.requires], with_holders=True, with_leases=True
        )
        me = QueuedRun(
            run.run_id, run.created_at, run.requires_key, run.requires, run.priority, run.team
        )
        out.update(
            expected_of(s, me, found, now=place.now, ahead=place.ahead, budget=budget, teams=teams)
        )


def nodes_list(ctx: Context) -> dict[str, Any]:
    """``GET /v1/nodes``: each node with its lease, its effective drain, an operator's hold and
    its health (docs/operators.md)."""
    with ctx.db.read() as s:
        now, lines = nodes_lines(s)
    return {"observed_at": ts(now), "nodes": lines}


def capabilities(ctx: Context) -> dict[str, Any]:
    """Per capability name over live adverts: how many nodes, and every attribute's values."""
    with ctx.db.read() as s:
        _, nodes = live_nodes(s)
    count: dict[str, set[str]] = defaultdict(set)
    attrs: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for n in nodes:
        for c in n.capabilities or []:
            name = c.get("capability")
            if not isinstance(name, str):
                continue
            count[name].add(n.node_id)
            for k, v in (c.get("attrs") or {}).items():
                attrs[name][k].add(str(v))
    return {
        "capabilities": [
            {
                "capability": name,
                "nodes": len(count[name]),
                "attrs": {k: sorted(v) for k, v in sorted(attrs[name].items())},
            }
            for name in sorted(count)
        ]
    }


def events_of(ctx: Context, run_id: str) -> dict[str, Any]:
    with ctx.db.read() as s:
        if get_run(s, run_id) is None:
            raise NotFound(f"no such run: {run_id}")
        events = run_events(s, run_id)
    return {"events": [event_document(e) for e in events]}
