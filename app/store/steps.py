"""Step rows: created by one function for every path, bound to nodes, failed."""

from __future__ import annotations

import functools
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Select, Text, and_, bindparam, case, func, insert, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session, aliased

from app.contract import is_valid_id
from app.contract.types import StepDef
from app.models import Lease, Run, Step, StepDuration
from app.states import (
    ASKED,
    CLAIMED,
    DONE,
    FAILED,
    NODE_KINDS,
    PENDING,
    RUNNING,
    SKIPPED,
    STEP_OPEN,
    check_step_change,
)
from app.store import rowcount


def step_rows(
    run_id: str, steps: Sequence[StepDef], node_for_role: Mapping[str, str]
) -> list[dict[str, object]]:
    """The rows of a run's steps: the one builder for RUNNING creation and for queueing alike
    (two copies would let one contract run in a different order depending on its path;
    docs/design.md#submit-and-dry-run).
    A queued run passes no nodes; promotion binds them with :func:`bind_steps`."""
    return [
        {
            "run_id": run_id,
            "seq": st.seq,
            "step_id": st.id,
            "kind": st.kind,
            "uses": st.uses,
            "node_id": node_for_role.get(st.uses) if st.uses else None,
            "needs": list(st.needs),
            "spec": st.spec,
        }
        for st in steps
    ]


def bind_steps(s: Session, run_id: str, node_for_role: Mapping[str, str]) -> None:
    """Set ``steps.node_id`` for each role at promotion (the run row is locked by the promotion)."""
    if not node_for_role:
        return
    s.execute(
        update(Step)
        .where(Step.run_id == run_id, Step.uses.in_(list(node_for_role)))
        .values(node_id=case(node_for_role, value=Step.uses))
    )


def steps_of(s: Session, run_id: str) -> list[Step]:
    return list(s.execute(select(Step).where(Step.run_id == run_id).order_by(Step.seq)).scalars())


def steps_of_runs(s: Session, run_ids: Sequence[str]) -> dict[str, list[Step]]:
    out: dict[str, list[Step]] = {r: [] for r in run_ids}
    if run_ids:
        q = select(Step).where(Step.run_id.in_(list(run_ids))).order_by(Step.run_id, Step.seq)
        for st in s.execute(q).scalars():
            out[st.run_id].append(st)
    return out


def claimed_by_other_instance(s: Session, node_id: str, instance: str) -> list[tuple[str, int]]:
    """CLAIMED steps on this node whose claiming instance is known and differs (restart detection,
    docs/queue.md#heartbeats-what-a-node-learns), in (run_id, seq) order: the order their runs are
    locked in. A claim made without an instance header cannot be told apart and is left alone."""
    rows = s.execute(
        select(Step.run_id, Step.seq)
        .where(
            Step.node_id == node_id,
            Step.state == CLAIMED,
            Step.claimed_instance.is_not(None),
            Step.claimed_instance != instance,
        )
        .order_by(Step.run_id, Step.seq)
    ).all()
    return [(r.run_id, r.seq) for r in rows]


def fail_step(s: Session, run_id: str, seq: int, *, from_states: Sequence[str], error: str) -> bool:
    """Guarded: only a step still in ``from_states`` fails (the caller holds the run lock)."""
    check_step_change(from_states, FAILED)
    row = s.execute(
        update(Step)
        .where(Step.run_id == run_id, Step.seq == seq, Step.state.in_(from_states))
        .values(state=FAILED, error=error, ended_at=func.now())
        .returning(Step.seq)
    ).first()
    return row is not None


def fail_open_steps(s: Session, run_id: str, error: str) -> int:
    """PENDING, CLAIMED and ASKED steps of a run that ended become FAILED."""
    result = s.execute(
        update(Step)
        .where(Step.run_id == run_id, Step.state.in_(STEP_OPEN))
        .values(state=FAILED, error=error, ended_at=func.now())
    )
    return rowcount(result)


def lock_steps(s: Session, run_id: str) -> list[Step]:
    """The run's steps ``FOR UPDATE`` in seq order: second in the lock order, after the run row."""
    q = (
        select(Step)
        .where(Step.run_id == run_id)
        .order_by(Step.seq)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    return list(s.execute(q).scalars())


def update_step(
    s: Session,
    run_id: str,
    seq: int,
    expect: Sequence[str],
    *,
    duration_key: str | None = None,
    **values: object,
) -> Step | None:
    """One guarded change of one step: only while its state is one of ``expect``. Returns the
    step as it is now (the session's copy is refreshed), or None when the guard did not hold.
    A new ``state`` must be one every state of ``expect`` may become (``app/states.py``).

    ``duration_key``: the step ends with a result, and the same statement records how long it
    ran since its claim under that key (``step_durations``, docs/queue.md "What a QUEUED run's
    view explains"): no round trip of its own on the result path. The insert's CTE reads the
    row as it was before the update, under the same guard; the caller holds the step's row
    lock, so the two cannot disagree."""
    if "state" in values:
        check_step_change(expect, str(values["state"]))
    guard = (Step.run_id == run_id, Step.seq == seq, Step.state.in_(list(expect)))
    q = update(Step).where(*guard).values(**values)
    if duration_key is not None:
        took = select(
            bindparam("duration_key", duration_key, type_=Text),
            func.extract("epoch", func.now() - Step.started_at),
            func.now(),
        ).where(*guard, Step.started_at.is_not(None))
        recorded = insert(StepDuration).from_select(["key", "seconds", "ended_at"], took)
        q = q.add_cte(recorded.cte("recorded"))
    return s.execute(
        q.returning(Step).execution_options(populate_existing=True)
    ).scalar_one_or_none()


def reset_steps(s: Session, run_id: str, seqs: Sequence[int]) -> None:
    """A rollback: the steps go back to PENDING with attempt + 1 and nothing of their last attempt
    (docs/contract.md#loop, docs/contract.md#validate_with-and-max_attempts). The run row is locked
    by the caller."""
    if not seqs:
        return
    s.execute(
        update(Step)
        .where(Step.run_id == run_id, Step.seq.in_(list(seqs)))
        .values(
            state=PENDING,
            attempt=Step.attempt + 1,
            claimed_instance=None,
            envelope_key=None,
            exit_code=None,
            produced=None,
            error=None,
            result=None,
            # ``chosen`` stays: a dispatch that is reset too chooses again
            # (docs/contract.md#dispatch).
            answered_by=None,
            answered_by_declared_token=None,
            asked_at=None,
            ask_deadline=None,
            started_at=None,
            ended_at=None,
        )
    )


def _claimable_where(node_id: Any) -> list[Any]:
    """PENDING run/agent steps bound to the node, in a RUNNING run that holds a lease on the node,
    whose needs are all DONE or SKIPPED
    (docs/api.md#post-v1nodesnode_idclaim--the-next-step-for-a-node). ``node_id``: a node's id, or
    ``Step.node_id`` (each step's own node)."""
    need = aliased(Step)
    unmet = (
        select(need.seq)
        .where(
            need.run_id == Step.run_id,
            need.seq == func.any(Step.needs),
            need.state.not_in([DONE, SKIPPED]),
        )
        .exists()
    )
    return [
        Lease.run_id == Step.run_id,
        Lease.node_id == node_id,
        Step.node_id == node_id,
        Step.state == PENDING,
        Step.kind.in_(["run", "agent"]),
        Run.state == RUNNING,
        ~unmet,
    ]


@functools.cache
def _claim_next() -> Select[Any]:
    """The first claimable step of ``:node_id`` (:func:`_claimable_where`), in claim order,
    locked ``FOR UPDATE OF steps SKIP LOCKED``; built once (every claim's first look runs it,
    and building the statement cost more CPU than running it)."""
    node = bindparam("node_id", type_=Text)
    where = _claimable_where(node)
    return (
        select(Step)
        .join(Run, Run.run_id == Step.run_id)
        .join(Lease, and_(*where[:2]))
        .where(*where[2:])
        .order_by(Run.created_at, Step.run_id, Step.seq)
        .limit(1)
        .with_for_update(of=Step, skip_locked=True)
    )


@functools.cache
def _claimable_nodes() -> Select[Any]:
    """The nodes among ``:nodes`` with a claimable step; built once."""
    nodes = bindparam("nodes", type_=ARRAY(Text))
    where = _claimable_where(Step.node_id)
    return (
        select(Step.node_id)
        .distinct()
        .join(Run, Run.run_id == Step.run_id)
        .join(Lease, and_(*where[:2]))
        .where(Step.node_id == func.any(nodes), *where[2:])
    )


@functools.cache
def _held() -> Select[Any]:
    """The step ``:instance`` of ``:node_id`` holds (:func:`held_step`); built once."""
    node, instance = bindparam("node_id", type_=Text), bindparam("instance", type_=Text)
    return (
        select(Step)
        .join(Run, Run.run_id == Step.run_id)
        .join(Lease, (Lease.run_id == Step.run_id) & (Lease.node_id == node))
        .where(
            Step.node_id == node,
            Step.state == CLAIMED,
            Step.claimed_instance == instance,
            Run.state == RUNNING,
            # never a step whose lease has run out
            # (docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl)
            Lease.not_after > func.now(),
        )
        .order_by(Run.created_at, Step.seq)
        .limit(1)
    )


def held_step(s: Session, node_id: str, instance: str) -> Step | None:
    """The step this node instance already holds (CLAIMED, run RUNNING, lease held and not past
    its ``not_after``): redelivered unchanged when the earlier claim response was lost."""
    return s.execute(_held(), {"node_id": node_id, "instance": instance}).scalar_one_or_none()


def nodes_with_claimable_steps(s: Session, node_ids: list[str]) -> set[str]:
    """Which of these nodes have a step :func:`claim_step` would hand out (the conditions of
    :func:`_claimable_where`), in one statement for them all: the claims' safety net
    (docs/design.md#claims-and-the-long-poll). A plain read; nothing is locked (the claim that looks
    next locks what it takes)."""
    if not node_ids:
        return set()
    return set(s.connection().execute(_claimable_nodes(), {"nodes": node_ids}).scalars())


def claim_step(s: Session, node_id: str, instance: str | None) -> Step | None:
    """Hand out the next claimable step: ``FOR UPDATE OF steps SKIP LOCKED`` so two claims never
    get the same step and a claim never waits on a step another transaction holds; the guarded
    UPDATE makes the step CLAIMED with a fresh envelope key."""
    row = s.execute(_claim_next(), {"node_id": node_id}).scalar_one_or_none()
    if row is None:
        return None
    claimed = s.execute(
        update(Step)
        .where(Step.run_id == row.run_id, Step.seq == row.seq, Step.state == PENDING)
        .values(
            state=CLAIMED,
            started_at=func.now(),
            claimed_instance=instance,
            envelope_key=secrets.token_hex(16),
        )
        .returning(Step)
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()
    return claimed


def open_asks(s: Session) -> list[tuple[Step, Run]]:
    """ASKED steps of RUNNING runs, oldest first (docs/api.md#get-v1asks--the-open-asks)."""
    q = (
        select(Step, Run)
        .join(Run, Run.run_id == Step.run_id)
        .where(Step.state == ASKED, Run.state == RUNNING)
        .order_by(Step.asked_at, Step.run_id, Step.seq)
    )
    return [(r[0], r[1]) for r in s.execute(q).all()]


def get_step(s: Session, run_id: str, seq: int) -> Step | None:
    if not is_valid_id(run_id):
        return None
    return s.execute(
        select(Step).where(Step.run_id == run_id, Step.seq == seq)
    ).scalar_one_or_none()


def share_claimed_step(s: Session, run_id: str, seq: int, attempt: int) -> bool:
    """``SELECT … FOR SHARE`` of the step while it is CLAIMED in ``attempt`` and of a kind a node
    runs: whether an upload of its artifacts may be written
    (docs/security.md#runs-records-and-uploads). Taken after the run row (``share_run``,
    docs/queue.md#lock-order) and held until the upload commits, so the step's result or reset (an
    UPDATE of this row) waits for an upload begun before it, and an upload after it finds the step
    no longer CLAIMED in that attempt."""
    row = s.execute(
        select(Step.seq)
        .where(
            Step.run_id == run_id,
            Step.seq == seq,
            Step.state == CLAIMED,
            Step.attempt == attempt,
            Step.kind.in_(NODE_KINDS),
        )
        .with_for_update(read=True)
    ).first()
    return row is not None


def step_node(s: Session, run_id: str, seq: int) -> tuple[bool, str | None]:
    """Whether the run has step ``seq``, and the node it is bound to (None before placement):
    what a node token's binding is checked against. A plain read; nothing is locked."""
    if not is_valid_id(run_id):
        return False, None
    row = s.execute(select(Step.node_id).where(Step.run_id == run_id, Step.seq == seq)).first()
    return (True, row[0]) if row is not None else (False, None)
