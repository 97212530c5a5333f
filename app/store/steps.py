"""Step rows: created by one function for every path, bound to nodes, failed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import case, func, insert, select, update
from sqlalchemy.orm import Session

from app.contract.types import StepDef
from app.models import Step
from app.states import CLAIMED, FAILED, STEP_OPEN


def insert_steps(
    s: Session, run_id: str, steps: Sequence[StepDef], node_for_role: Mapping[str, str]
) -> None:
    """The one function that creates a run's steps, for RUNNING creation and for queueing alike
    (SPEC §7: two copies would let one contract run in a different order depending on its path).
    A queued run passes no nodes; promotion binds them with :func:`bind_steps`."""
    s.execute(
        insert(Step),
        [
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
        ],
    )


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
    """CLAIMED steps on this node whose claiming instance is known and differs (SPEC §4 restart
    detection). A claim made without an instance header cannot be told apart and is left alone."""
    rows = s.execute(
        select(Step.run_id, Step.seq).where(
            Step.node_id == node_id,
            Step.state == CLAIMED,
            Step.claimed_instance.is_not(None),
            Step.claimed_instance != instance,
        )
    ).all()
    return [(r.run_id, r.seq) for r in rows]


def fail_step(s: Session, run_id: str, seq: int, *, from_states: Sequence[str], error: str) -> bool:
    """Guarded: only a step still in ``from_states`` fails (the caller holds the run lock)."""
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
    return result.rowcount or 0
