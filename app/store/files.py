"""What a run's steps have stored (docs/security.md#runs-records-and-uploads): the run's bytes, each
step's files and each log's length, counted in the database in the transaction that records an
upload, so that one count holds for every process and host that serves the run."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from app.contract import is_valid_id
from app.models import Blob, LogFile, Run, Step


def lock_run_for_files(s: Session, run_id: str) -> Run | None:
    """``SELECT … FOR NO KEY UPDATE`` of the run row: the first lock of a write into the run's
    Record (a log append, a progress chunk, a blob). Held until the write commits, it makes the
    writes of one run take turns — each reads the run's ``stored_bytes`` and its step's files as
    the one before it left them, on whichever host — and the transaction that ends the run
    (``lock_run`` first, docs/queue.md#lock-order) wait for the writes begun before it, so that
    every later write sees the run finished and no write lands in a Record being sealed
    (docs/design.md#records). It does not conflict with the key-share locks of rows that refer to
    the run."""
    if not is_valid_id(run_id):
        return None
    return s.execute(
        select(Run)
        .where(Run.run_id == run_id)
        .with_for_update(key_share=True)  # FOR NO KEY UPDATE
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


def add_run_bytes(s: Session, run_id: str, delta: int, limit: int | None = None) -> bool:
    """``stored_bytes += delta``, guarded by ``limit`` (None: no guard): a growth that would take
    the run past it changes nothing and is False. A shrink always passes. One statement; the caller
    holds the run row (``lock_run_for_files``), so the total it read before is the one it adds to."""
    stmt = update(Run).where(Run.run_id == run_id)
    if limit is not None and delta > 0:
        stmt = stmt.where(Run.stored_bytes + delta <= limit)
    stmt = stmt.values(stored_bytes=Run.stored_bytes + delta).returning(Run.run_id)
    return s.execute(stmt).first() is not None


def add_step_file(s: Session, run_id: str, seq: int, limit: int) -> bool:
    """One more file of the step, guarded by ``limit``: False, and nothing changed, when the step
    has that many already. The step's row lock (taken by this UPDATE, under the run's) orders the
    step's new files on every host."""
    stmt = (
        update(Step)
        .where(Step.run_id == run_id, Step.seq == seq, Step.stored_files < limit)
        .values(stored_files=Step.stored_files + 1)
        .returning(Step.seq)
    )
    return s.execute(stmt).first() is not None


def blob_bytes(s: Session, run_id: str, seq: int, attempt: int, name: str) -> int | None:
    """The length of the blob stored under (seq, attempt, name), or None when there is none."""
    q = select(Blob.bytes).where(
        Blob.run_id == run_id, Blob.seq == seq, Blob.attempt == attempt, Blob.name == name
    )
    return s.execute(q).scalar_one_or_none()


def get_log_file(s: Session, run_id: str, seq: int, kind: str, name: str) -> LogFile | None:
    """The log (``kind`` ``log``) or progress (``progress``) of the step under ``name``, as last
    written; None when the step has no such file."""
    q = select(LogFile).where(
        LogFile.run_id == run_id, LogFile.seq == seq, LogFile.kind == kind, LogFile.name == name
    )
    return s.execute(q.execution_options(populate_existing=True)).scalar_one_or_none()


def record_log_file(
    s: Session, run_id: str, seq: int, kind: str, name: str, *, attempt: int, size: int
) -> None:
    """Upsert of the file's length and attempt after a write; the caller holds the log's lock."""
    stmt = pg_insert(LogFile).values(
        run_id=run_id, seq=seq, kind=kind, name=name, attempt=attempt, bytes=size
    )
    s.execute(
        stmt.on_conflict_do_update(
            index_elements=[LogFile.run_id, LogFile.seq, LogFile.kind, LogFile.name],
            set_={"attempt": stmt.excluded.attempt, "bytes": stmt.excluded.bytes},
        )
    )
