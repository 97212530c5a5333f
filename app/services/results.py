"""Claims and results (docs/api.md#node-agents)."""

from __future__ import annotations

import json
import random
import time
from typing import Any

from sqlalchemy import func
from sqlalchemy.orm import Session

from app.context import Context
from app.contract import parse_json
from app.errors import BadRequest, NotClaimed
from app.estimate import KINDS_TIMED, duration_key, roles_by_name
from app.faults import fault
from app.healthcheck import fits_check
from app.logs import log
from app.metrics import CLAIMS_WAITING
from app.models import Node, Run, Step
from app.services.after_commit import settle_and_reply
from app.services.end_run import settle_cancelled
from app.services.execution import (
    Picture,
    advance,
    release_roles,
    settle,
)
from app.services.notify import AfterCommit
from app.services.operators import strike
from app.services.records import ledger_entries, record_of
from app.services.tx import retrying
from app.states import CLAIMED, DONE, FAILED, PENDING, RUN_FINISHED, RUNNING, SKIPPED
from app.store.blobs import accepted_blob_names
from app.store.clock import await_replicated
from app.store.leases import lease_of_node
from app.store.node_health import ResultView, reset_strikes, result_view
from app.store.nodes import is_live
from app.store.runs import get_run, lock_run
from app.store.steps import claim_step, held_step, lock_steps, reset_steps
from app.wire import ts

# ---------------------------------------------------------------- claim

# How long a claim of a node without a live advert waits (docs/security.md#input-and-load).
NO_ADVERT_WAIT_SECONDS = 1.0


def held_seconds(wait: float, jitter: float, draw: float) -> float:
    """How long a claim that finds nothing is held: the window less ``draw`` (in [0, 1)) times
    ``jitter`` of it. Claims that started together (a fleet restarted) then end spread over the
    last ``jitter`` of the window instead of together, and their next first looks come spread
    too (a claim waits up to the window, never longer:
    docs/api.md#post-v1nodesnode_idclaim--the-next-step-for-a-node)."""
    return wait * (1.0 - jitter * draw)


def claim_body(ctx: Context, step: Step, node_id: str) -> dict[str, Any]:
    """The step as the node agent reads it
    (docs/api.md#post-v1nodesnode_idclaim--the-next-step-for-a-node): ``workspace``, ``feedback``,
    ``check_changed`` and ``attempt`` only when they have a value, ``ledger`` only for a step with
    ``see.ledger: "list"``."""
    spec = step.spec
    with ctx.db.read() as s:
        run = get_run(s, step.run_id)
        assert run is not None  # a claimed step's run is never deleted while it runs
        lease = lease_of_node(s, node_id)
        see = spec.get("see") or {}
        ledger = ledger_entries(s, run, marked=False) if see.get("ledger") == "list" else None
    body: dict[str, Any] = {
        "step_id": f"{step.run_id}#{step.seq:02d}",
        "run_id": step.run_id,
        "seq": step.seq,
        "name": step.step_id,
        "uses": step.uses,
        "kind": step.kind,
        step.kind: spec[step.kind],
        "env": spec.get("env") or [],
        "collect": spec.get("collect") or {},
        "in": spec.get("in") or {},
        "out": spec.get("out") or [],
        "schema": spec.get("schema") or {},
        "requester": run.principal,
        "envelope_key": step.envelope_key,
        "lease": {
            "run_id": step.run_id,
            "node": node_id,
            "capability": lease.capability if lease else None,
            "not_after": ts(lease.not_after) if lease else None,
            "nonce": lease.nonce if lease else None,
        },
    }
    if spec.get("workspace"):
        body["workspace"] = spec["workspace"]
    if step.attempt:
        body["attempt"] = step.attempt
    if spec.get("feedback"):
        body["feedback"] = spec["feedback"]
    changed = check_changed(run.contract, step.step_id)
    if changed:
        body["check_changed"] = changed
    if ledger is not None:
        body["ledger"] = ledger
    return body


def check_changed(contract: dict[str, Any], step_id: str) -> list[str]:
    """The paths of ``success_when[].changed`` for this step, in order, once each: what the
    agent checks for change and reports in ``changed``
    (docs/api.md#post-v1nodesnode_idclaim--the-next-step-for-a-node)."""
    paths: dict[str, None] = {}
    for cond in contract.get("success_when") or []:
        if isinstance(cond, dict) and cond.get("step") == step_id:
            paths.update(dict.fromkeys(cond.get("changed") or []))
    return list(paths)


def claim_once(
    ctx: Context, node_id: str, instance: str | None, *, ask_live: bool = False
) -> tuple[dict[str, Any] | None, bool]:
    """One look, one short transaction: redeliver the step this instance holds, else claim the
    next one (docs/api.md#post-v1nodesnode_idclaim--the-next-step-for-a-node). Returns the step's
    body (None: nothing for this node) and, when nothing was found and ``ask_live``, whether the
    node has a live advert (else True)."""
    with ctx.db.begin() as s:
        step = held_step(s, node_id, instance) if instance else None
        if step is not None:
            # A redelivery re-reads an earlier claim's commit: this transaction's commit waits
            # for the synchronous standby to hold it too (docs/deploy.md#11-a-database-with-a-standby).
            await_replicated(s)
        else:
            step = claim_step(s, node_id, instance)
        if step is None:
            return None, not ask_live or is_live(s, node_id)
    return claim_body(ctx, step, node_id), True


def claim(
    ctx: Context, node_id: str, instance: str | None, wait_seconds: float
) -> dict[str, Any] | None:
    """Long poll: no connection is held while waiting; the process's LISTEN thread wakes this
    request when a step may have become claimable on this node, and a slow re-check
    (``claim.recheck_seconds``) covers a lost notification."""
    with CLAIMS_WAITING.track_inprogress():
        return _claim(ctx, node_id, instance, wait_seconds)


def _claim(
    ctx: Context, node_id: str, instance: str | None, wait_seconds: float
) -> dict[str, Any] | None:
    """The claim's ticket is registered once (docs/security.md#input-and-load), for the whole claim,
    so that a newer claim of the same node can supersede it (one waiting claim per node id and
    process).

    After its first look (docs/design.md#claims-and-the-long-poll) the claim only waits on its
    ticket, which is set by a notification naming its node, by the listener reconnecting, by the
    process's safety-net pass finding its node claimable, or by a newer claim superseding it; it
    looks again only then, so an idle claim costs the database nothing of its own."""
    listener = ctx.claims
    ticket = listener.register(node_id)
    jitter = ctx.config["claim.long_poll_jitter"]
    deadline = ticket.started + held_seconds(wait_seconds, jitter, random.random())
    first = True
    try:
        while True:
            ticket.clear()  # before the look: a notification during it wakes the wait below
            with listener.looking():
                body, live = claim_once(ctx, node_id, instance, ask_live=first)
            ticket.looks += 1
            if body is not None:
                return body  # taken: a newer claim of the node does not take it away
            if not live:
                # No claims held for node ids no agent advertises (docs/security.md#input-and-load).
                deadline = min(deadline, ticket.started + NO_ADVERT_WAIT_SECONDS)
            first = False
            remaining = deadline - time.monotonic()
            if ticket.superseded or remaining <= 0:
                return None
            if not ticket.wait(remaining) or ticket.superseded:
                return None
    finally:
        listener.unregister(node_id, ticket)


# ---------------------------------------------------------------- result


def _until_met(until: dict[str, Any], exit_code: int | None, produced: set[str]) -> bool:
    if "exit_code" in until and exit_code != until["exit_code"]:
        return False
    return all(n in produced for n in until.get("produced") or [])


def _rollback(
    pic: Picture, st: Step, exit_code: int | None, error: str | None, produced: set[str]
) -> tuple[list[int], list[Step]]:
    """The rollback check, before any effect (docs/design.md#rollbacks). Returns the seqs to reset
    (empty: no rollback) and the steps whose attempts ran out (marked ``exhausted`` for the
    verdict)."""
    exhausted = []
    loop = st.spec.get("loop")
    if loop and error is None and not _until_met(loop.get("until") or {}, exit_code, produced):
        if _attempts_left(pic.run, st, loop["max"]):
            start = pic.by_id[loop["back_to"]].seq
            return _range(pic, start, st.seq), []
        exhausted.append(st)
    passed = error is None and exit_code in (None, 0)
    if not passed:
        for validated in pic.ordered():
            if validated.spec.get("validate_with") != st.step_id:
                continue
            if _attempts_left(pic.run, validated, int(validated.spec.get("max_attempts", 1))):
                return _range(pic, validated.seq, st.seq), []
            exhausted.append(validated)
    return [], exhausted


def _attempts_left(run: Run, st: Step, allowed: int) -> bool:
    """Whether a reset may happen: N allowed attempts are 0 … N−1, so one more is allowed while
    attempt + 1 < N (docs/contract.md#loop), counted from the run's base (1 for runs created before
    attempts were counted from 0)."""
    return st.attempt - run.attempt_base + 1 < allowed


def _range(pic: Picture, first: int, last: int) -> list[int]:
    """The steps a rollback resets: ``first..last`` without acquire steps (the Mediator's own,
    done once), and without a step whose skip was decided outside the range — by an acquire, by
    a dispatch that is not reset, or by needs that all stay SKIPPED — so a branch not taken is
    not run after all."""
    deciders: dict[str, list[Step]] = {}
    for st in pic.ordered():
        targets = list((st.spec.get("dispatch") or {}).get("to") or [])
        acquire = st.spec.get("acquire") or {}
        targets += [acquire.get("acquired"), acquire.get("unavailable")]
        for target in targets:
            if target:
                deciders.setdefault(target, []).append(st)
    reset: list[int] = []
    kept_skipped: set[int] = set()
    for k in range(first, last + 1):
        step = pic.steps.get(k)
        if step is None or step.kind == "acquire":
            continue
        if step.state == SKIPPED:
            decided_outside = any(
                d.kind == "acquire" or not first <= d.seq <= last
                for d in deciders.get(step.step_id, [])
            )
            needs_stay = bool(step.needs) and all(
                pic.steps[n].state == SKIPPED and (n < first or n in kept_skipped)
                for n in step.needs
                if n in pic.steps
            )
            if decided_outside or needs_stay:
                kept_skipped.add(k)
                continue
        reset.append(k)
    return reset


def _dispatch_choice(ctx: Context, pic: Picture, st: Step) -> tuple[str | None, str | None]:
    """``dispatch``: the string at the JSON path of the produced blob picks one target: returns
    ``(target, None)``, or ``(None, reason)`` when it names none of them (the step then FAILS
    instead of becoming DONE)."""
    d = st.spec["dispatch"]
    path = d["from"]
    outs = sorted((o for o in st.spec.get("out") or [] if path.startswith(o + ".")), key=len)
    value: Any = None
    if outs:
        name = outs[-1]
        raw = ctx.records.read_blob(record_of(pic.run), st.seq, st.attempt, name)
        try:
            value = parse_json(raw) if raw is not None else None
            for field in path[len(name) + 1 :].split("."):
                value = value.get(field) if isinstance(value, dict) else None
        except BadRequest:
            value = None
    if isinstance(value, str) and value in d["to"]:
        return value, None
    return None, f"dispatch: {path} is {json.dumps(value)}, not one of {json.dumps(d['to'])}"


def _dispatch(pic: Picture, st: Step, s: Session, chosen: str) -> None:
    """The dispatch step is DONE: its chosen target is marked, the others are SKIPPED (and skips
    propagate in :func:`advance`)."""
    for target in st.spec["dispatch"]["to"]:
        step = pic.by_id[target]
        if target == chosen:
            pic.change(s, step, [PENDING], chosen=True)
        elif step.state == PENDING:
            pic.change(s, step, [PENDING], state=SKIPPED, chosen=False)


def complete_step(
    s: Session,
    ctx: Context,
    pic: Picture,
    st: Step,
    after: AfterCommit,
    *,
    expect: str,
    exit_code: int | None,
    error: str | None,
    reported: list[str],
    node: str | None,
    **values: Any,
) -> dict[str, Any]:
    """The result path, shared by node results and answers, in the order of
    docs/design.md#results-and-settle: rollback check, the step's new state, effects (dispatch,
    release), acquire and asks, settle, and the at-boundary drain. The run and its steps are locked
    by the caller."""
    run = pic.run
    schema = st.spec.get("schema") or {}
    produced = accepted_blob_names(s, run.run_id, {st.seq: st.attempt})[st.seq] | {
        n for n in reported if n not in schema
    }
    seqs, exhausted = _rollback(pic, st, exit_code, error, produced)
    view = _NodeView(s, node)
    agent_error = error  # a dispatch's refusal below is the run's, not the board's
    if seqs and not view.at_boundary():
        # A rollback frees nothing: no wake (docs/design.md#rollbacks). The reset steps are
        # claimable again, and an ask among them is raised again (docs/design.md#rollbacks), or the
        # run would wait forever.
        reset_steps(s, run.run_id, seqs)
        advance(s, ctx, Picture(run, lock_steps(s, run.run_id)), after)
        view.move_strikes(ctx, after, done=True)
        return {"run_id": run.run_id, "seq": st.seq, "rolled_back": True}
    if seqs:
        # The node drains at this step boundary (docs/operators.md#graceful-and-at-boundary): the
        # run is cancelled, not rolled back onto a node that is leaving.
        _cancel_for_drain(s, run, node, after)
        view.move_strikes(ctx, after, done=True)
        return {"run_id": run.run_id, "seq": st.seq, "run_state": FAILED}
    chosen = None
    if not error and st.spec.get("dispatch"):
        chosen, error = _dispatch_choice(ctx, pic, st)
    pic.change(
        s,
        st,
        [expect],
        state=FAILED if error else DONE,
        exit_code=exit_code,
        produced=reported,
        error=error,
        ended_at=func.now(),
        duration_key=_duration_key(pic, st) if expect == CLAIMED else None,
        **values,
    )
    for ex in exhausted:
        pic.change(s, ex, [ex.state], result=dict(ex.result or {}, exhausted=True))
    if st.state == DONE and chosen is not None:
        _dispatch(pic, st, s, chosen)
    if st.state == DONE and st.spec.get("release"):
        after.released(run.run_id, release_roles(s, pic, st.spec["release"]))
    advance(s, ctx, pic, after)
    settle(s, pic, after)
    if run.state == RUNNING and view.at_boundary():
        _cancel_for_drain(s, run, node, after)
    # Last in the transaction (docs/queue.md, "Lock order"): the node's strikes.
    if expect == CLAIMED:
        view.move_strikes(ctx, after, done=st.state == DONE, error=agent_error)
    # Wake even while the run goes on (wake point 1, docs/design.md#wake-points), also when nothing
    # above named a freed node.
    after.wake_anyway = f"result of {run.run_id}#{st.seq:02d}"
    fault("result.before_commit")
    return {
        "run_id": run.run_id,
        "seq": st.seq,
        "run_state": run.state if run.state in RUN_FINISHED else "",
    }


def _duration_key(pic: Picture, st: Step) -> str | None:
    """The key a run or agent step's duration is recorded under as it ends with a result (the
    expected start of queued runs reads them: docs/queue.md, "What a QUEUED run's view
    explains"); None for the other kinds."""
    if st.kind not in KINDS_TIMED:
        return None
    roles = roles_by_name(pic.run.requires or [], (x.spec for x in pic.steps.values()))
    return duration_key(st.step_id, st.kind, st.spec, roles.get(st.uses or ""))


@retrying
def _report(
    ctx: Context, run_id: str, seq: int, body: dict[str, Any], after: AfterCommit
) -> dict[str, Any]:
    node = body["node"]
    not_claimed = NotClaimed(f"reported a step that was not claimed ({run_id}#{seq:02d})")
    with ctx.db.begin() as s:
        run = lock_run(s, run_id)
        if run is None:
            raise not_claimed
        pic = Picture(run, lock_steps(s, run_id))
        st = pic.steps.get(seq)
        if st is None or st.state != CLAIMED or st.node_id != node or run.state != RUNNING:
            raise not_claimed
        lease = lease_of_node(s, node)
        if lease is None or lease.run_id != run_id:
            raise not_claimed
        if body.get("nonce") is not None and body["nonce"] != lease.nonce:
            # Fencing: a result from an earlier lease of this node (docs/queue.md#leases).
            raise NotClaimed(f"lease nonce is not current for {node} in {run_id}")
        result = result_document(body, f"{run_id}#{seq:02d}")
        return complete_step(
            s,
            ctx,
            pic,
            st,
            after,
            expect=CLAIMED,
            exit_code=body.get("exit_code"),
            error=bounded_error(body.get("error")),
            reported=[n for n in body.get("produced") or [] if n in (st.spec.get("out") or [])],
            node=node,
            result=result,
        )


ERROR_LIMIT = 64 * 1024


def bounded_error(text: str | None) -> str | None:
    """A result's ``error`` as stored: any length is taken, cut at 64 KiB of UTF-8 with a note
    saying how long it was
    (docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl); empty is no
    error."""
    if not text:
        return None
    data = text.encode()
    if len(data) <= ERROR_LIMIT:
        return text
    kept = data[:ERROR_LIMIT].decode(errors="ignore")
    return kept + f"\n[error truncated at 64 KiB: {len(data)} bytes in all]"


# The result fields kept verbatim in the step's document when well-formed
# (docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl).
_RESULT_FIELDS: dict[str, tuple[type, ...]] = {
    "harness": (dict, list, str, int, float, bool),
    "workspace": (str, dict),
    "changed": (list,),
    "exited_at": (str,),
    "diagnostics": (dict, list, str),
    "environment": (dict, list, str),
}


def result_document(body: dict[str, Any], step: str) -> dict[str, Any] | None:
    """The newer result fields as the step keeps them; a malformed one is dropped with a log
    line, never refused (the agent would rerun the step)."""
    out: dict[str, Any] = {}
    for key, kinds in _RESULT_FIELDS.items():
        value: Any = body.get(key)
        if value is None:
            continue
        ok = isinstance(value, kinds)
        if ok and key == "changed":
            ok = all(isinstance(p, str) for p in value)
        if ok:
            out[key] = value
        else:
            log.warning("result field dropped: malformed", step=step, field=key)
    return out or None


class _NodeView:
    """The reporting node as a result needs it, read once and only when needed: its effective
    drain (the advert's or an operator's hold, docs/operators.md) and its strikes."""

    def __init__(self, s: Session, node_id: str | None) -> None:
        self.s = s
        self.node_id = node_id
        self._view: ResultView | None = None

    def _read(self) -> ResultView | None:
        if self.node_id is None:
            return None
        if self._view is None:
            self._view = result_view(self.s, self.node_id)
        return self._view

    def at_boundary(self) -> bool:
        view = self._read()
        return view is not None and view.at_boundary

    def move_strikes(
        self, ctx: Context, after: AfterCommit, *, done: bool, error: str | None = None
    ) -> None:
        """A DONE step (a rollback counts as one) resets the node's strikes; an agent's error
        is a strike only when a health run could lift the quarantine it may bring: the health
        check is set and the node fits its first role (docs/operators.md, "Quarantine")."""
        view = self._read()
        if view is None or self.node_id is None:
            return
        if done and view.strikes:
            reset_strikes(self.s, self.node_id)
        elif error and not done and ctx.health_check is not None:
            node = self.s.get(Node, self.node_id)
            if node is not None and fits_check(ctx.health_check, node.capabilities):
                strike(ctx, self.s, self.node_id, f"the agent's error: {error[:200]}", after)


def _cancel_for_drain(s: Session, run: Run, node: str | None, after: AfterCommit) -> None:
    """An at-boundary drain (docs/operators.md#graceful-and-at-boundary): the run is cancelled by
    ``drain:<node>`` in the result's transaction."""
    after.released(run.run_id, settle_cancelled(s, run, f"drain:{node}", f"drain:{node}"))
    run.state = FAILED
    after.settled.append(run.run_id)


def report_result(ctx: Context, run_id: str, seq: int, body: dict[str, Any]) -> dict[str, Any]:
    after = AfterCommit()
    reply = _report(ctx, run_id, seq, body, after)
    fault("result.after_commit")
    return settle_and_reply(ctx, after, reply)
