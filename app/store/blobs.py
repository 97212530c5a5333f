"""Ledger metadata of stored artifacts (the bytes are in the Record)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import and_, exists, func, or_, select, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from app.models import Blob, Run, Step


def record_blob(
    s: Session,
    *,
    run_id: str,
    seq: int,
    attempt: int,
    name: str,
    work_id: str,
    by: str | None,
    size: int,
    sha256: str,
    schema_ok: bool | None,
    by_declared_token: str | None = None,
) -> None:
    """Upsert: a blob put again for the same attempt replaces the earlier one.
    ``by_declared_token``: the token's name when ``by`` is a self-declared principal
    (docs/tokens.md#principal)."""
    values = {
        "run_id": run_id,
        "seq": seq,
        "attempt": attempt,
        "name": name,
        "work_id": work_id,
        "by": by,
        "by_declared_token": by_declared_token,
        "bytes": size,
        "sha256": sha256,
        "schema_ok": schema_ok,
    }
    stmt = pg_insert(Blob).values(**values)
    s.execute(
        stmt.on_conflict_do_update(
            index_elements=[Blob.run_id, Blob.seq, Blob.attempt, Blob.name],
            set_={
                "by": stmt.excluded.by,
                "by_declared_token": stmt.excluded.by_declared_token,
                "bytes": stmt.excluded.bytes,
                "sha256": stmt.excluded.sha256,
                "schema_ok": stmt.excluded.schema_ok,
                "at": func.now(),
            },
        )
    )


def accepted_blob_names(
    s: Session, run_id: str, attempts: Mapping[int, int]
) -> dict[int, set[str]]:
    """seq -> the names that attempt of the step produced, for every step of ``attempts`` (seq ->
    attempt) in one statement: stored, not refused by a schema, and declared in the step's ``out``
    (a step may upload any name; only declared ones count:
    docs/api.md#put-v1runsrun_idstepsseqblobname--upload-an-artifact)."""
    produced: dict[int, set[str]] = {seq: set() for seq in attempts}
    if not attempts:
        return produced
    declared = exists().where(
        Step.run_id == Blob.run_id,
        Step.seq == Blob.seq,
        Step.spec["out"].contains(func.jsonb_build_array(Blob.name)),
    )
    q = select(Blob.seq, Blob.name).where(
        Blob.run_id == run_id,
        tuple_(Blob.seq, Blob.attempt).in_(list(attempts.items())),
        Blob.schema_ok.is_not(False),
        declared,
    )
    for seq, name in s.execute(q).all():
        produced[seq].add(name)
    return produced


def declaring_steps(s: Session, run_id: str, name: str) -> list[int]:
    """The seqs of the run's steps that list ``name`` in their ``out``, and the acquire step whose
    id it is: its outcome is the blob named after it (docs/contract.md#acquire), so an upload of
    that name by another step never stands for it (docs/security.md#runs-records-and-uploads)."""
    q = select(Step.seq).where(
        Step.run_id == run_id,
        or_(
            Step.spec["out"].contains([name]),
            and_(Step.kind == "acquire", Step.step_id == name),
        ),
    )
    return list(s.execute(q).scalars())


def newest_blob(s: Session, run_id: str, name: str) -> Blob | None:
    """The blob a name resolves to in the run (route 15, ``in.from``;
    docs/api.md#put-v1runsrun_idstepsseqblobname--upload-an-artifact). A name some step declares in
    ``out`` resolves only among the blobs of the steps that declare it, newest first; any other name
    (``_cannot``, files a step left in ``$OUT``) among all blobs of the run, newest (attempt, seq)
    first."""
    seqs = declaring_steps(s, run_id, name)
    q = select(Blob).where(Blob.run_id == run_id, Blob.name == name)
    if seqs:
        q = q.where(Blob.seq.in_(seqs)).order_by(
            Blob.at.desc(), Blob.attempt.desc(), Blob.seq.desc()
        )
    else:
        q = q.order_by(Blob.attempt.desc(), Blob.seq.desc())
    return s.execute(q.limit(1)).scalar_one_or_none()


def blobs_of_runs(s: Session, run_ids: Sequence[str]) -> list[Blob]:
    if not run_ids:
        return []
    q = select(Blob).where(Blob.run_id.in_(list(run_ids))).order_by(Blob.at, Blob.seq, Blob.name)
    return list(s.execute(q).scalars())


def earlier_runs_of_work(s: Session, work_id: str, run_id: str) -> list[str]:
    """Earlier runs of the same work, oldest first (``ledger.scope: work``)."""
    me = select(Run.created_at).where(Run.run_id == run_id).scalar_subquery()
    q = (
        select(Run.run_id)
        .where(Run.work_id == work_id, Run.run_id != run_id, Run.created_at <= me)
        .order_by(Run.created_at, Run.run_id)
    )
    return list(s.execute(q).scalars())
