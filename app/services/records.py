"""Logs, blobs, the ledger and sealed Records (docs/design.md#records)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from app.context import Caller, Context
from app.contract import parse_json
from app.contract.fields import has_control_character, has_format_character
from app.contract.violations import schema_violation
from app.errors import (
    BadRequest,
    Forbidden,
    Gone,
    NotFound,
    NotSealed,
    PayloadTooLarge,
    StepNotClaimed,
    Unprocessable,
)
from app.logs import log
from app.models import LogFile, Run, RunEvent, Step
from app.records import LogState, RecordSealed, RecordStoreUnavailable, check_name, location_of
from app.services.tx import retrying
from app.states import CLAIMED, NODE_KINDS, RUN_FINISHED
from app.store.blobs import blobs_of_runs, earlier_runs_of_work, newest_blob, record_blob
from app.store.files import (
    add_run_bytes,
    add_step_file,
    blob_bytes,
    get_log_file,
    lock_run_for_files,
    record_log_file,
)
from app.store.log_lock import lock_log
from app.store.runs import get_run, mark_sealed, seal_reads
from app.store.steps import get_step, share_claimed_step
from app.wire import mark_declared, ts


def record_of(run: Run) -> str:
    """Where the run's Record lives (docs/configuration.md#where-records-are-kept): the location
    kept on its row, or, for a run created before locations were kept, where the old rule put it."""
    return location_of(run.run_id, run.record_location)


def _run_and_step(s: Session, run_id: str, seq: int) -> tuple[Run, Step]:
    run = get_run(s, run_id)
    if run is None:
        raise NotFound(f"no such run: {run_id}")
    step = get_step(s, run_id, seq)
    if step is None:
        raise NotFound(f"no such step: {run_id}#{seq:02d}")
    return run, step


def authorise_node(caller: Caller, step: Step) -> None:
    """Node tokens bound to node ids may touch only steps bound to their nodes
    (docs/tokens.md#node-binding)."""
    if caller.nodes is not None and step.node_id not in caller.nodes:
        raise Forbidden(f"token may not act for node {step.node_id}")


PROGRESS = "progress"
SEALED = "sealed"


@dataclass(frozen=True)
class LogView:
    """One GET of a step log: the bytes from the offset, the state of the file they come from,
    and which file that is (``progress`` before the seal, ``sealed`` after;
    docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log)."""

    data: bytes
    state: LogState
    source: str


def _write_log(
    ctx: Context,
    run_id: str,
    seq: int,
    name: str,
    caller: Caller,
    kind: str,
    write: Callable[[Run, LogFile | None, int], LogState],
    attempt: int | None = None,
) -> LogState:
    """``write`` into the step's log (``kind`` ``log``) or its progress (``progress``) in a short
    transaction that holds the run's row and the log's advisory lock: appends to one (run, seq,
    name) from every process and host take their turn there, never by a lock of this process
    alone (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log). ``write`` is given the
    file as it was last written (None: the step has no such file yet) and the bytes the run may
    still store; the file's new length is counted in the same transaction
    (docs/security.md#runs-records-and-uploads). A file the step may not have (past
    ``records.max_step_files``) is not made: the reply is an empty log of ``attempt``, capped. Only
    the step that makes the log writes it (docs/security.md#runs-records-and-uploads): a step a node
    runs, CLAIMED in ``attempt`` (its current one for a plain log), 409 otherwise; a progress chunk
    of an attempt older than the step's changes nothing and keeps its 200."""
    with ctx.db.begin() as s:
        # the end of the run waits for this write (docs/design.md#records)
        run = lock_run_for_files(s, run_id)
        if run is None:
            raise NotFound(f"no such run: {run_id}")
        step = get_step(s, run_id, seq)
        if step is None:
            raise NotFound(f"no such step: {run_id}#{seq:02d}")
        authorise_node(caller, step)
        if run.state in RUN_FINISHED:
            raise Gone()
        if attempt is not None and attempt < step.attempt:
            # A late chunk of an uploader whose attempt was rolled back: the answer names the
            # step's attempt, so that uploader knows it is stale and stops.
            kept = ctx.records.read_progress(record_of(run), seq, name, 0, limit=0)
            if kept is None or kept[1].attempt < step.attempt:
                return LogState(0, step.attempt, False)
            return kept[1]
        _share_claimed_step(s, run_id, seq, step.attempt if attempt is None else attempt)
        lock_log(s, run_id, seq, name)
        known = get_log_file(s, run_id, seq, kind, name)
        if known is None and not add_step_file(
            s, run_id, seq, ctx.config["records.max_step_files"]
        ):
            return LogState(0, attempt or 0, True)
        room = max(0, ctx.config["records.max_run_bytes"] - run.stored_bytes)
        try:
            state = write(run, known, room)
        except RecordSealed:
            raise Gone() from None  # the run ended and was sealed since we looked
        before = known.bytes if known is not None else 0
        record_log_file(s, run_id, seq, kind, name, attempt=state.attempt, size=state.total)
        add_run_bytes(s, run_id, state.total - before)
        return state


def _share_claimed_step(s: Session, run_id: str, seq: int, attempt: int) -> None:
    """Only the step that makes an artifact writes it (docs/security.md#runs-records-and-uploads) —
    a step a node runs, CLAIMED in ``attempt``; held until the write commits, so its result waits
    for the write."""
    if not share_claimed_step(s, run_id, seq, attempt):
        raise StepNotClaimed()


def append_log(
    ctx: Context, run_id: str, seq: int, name: str, data: bytes, caller: Caller
) -> LogState:
    """Append to the step's log, cut with a note at ``max_blob_bytes`` or where the run's files
    reach ``records.max_run_bytes`` (docs/design.md#records,
    docs/security.md#runs-records-and-uploads); the log's state after the append."""
    cap = ctx.config["max_blob_bytes"]
    return _write_log(
        ctx,
        run_id,
        seq,
        name,
        caller,
        "log",
        lambda run, _known, room: ctx.records.append_log(
            record_of(run), seq, name, data, cap, room
        ),
    )


def put_progress(
    ctx: Context, run_id: str, seq: int, name: str, attempt: int, data: bytes, caller: Caller
) -> LogState:
    """A progress chunk of ``attempt``
    (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log): kept apart from the log for
    live viewing and dropped at the seal; a chunk of an attempt older than the stored progress
    changes nothing. The progress is capped at ``max_blob_bytes`` or where the run's files reach
    ``records.max_run_bytes``: a chunk of a newer attempt may use the room of the progress it
    replaces. The state of the progress that is kept (which attempt it is, its length, its cap)."""
    limit = ctx.config["max_blob_bytes"]

    def write(run: Run, known: LogFile | None, room: int) -> LogState:
        if known is not None and attempt > known.attempt:
            room += known.bytes  # the older attempt's file goes
        return ctx.records.put_progress(record_of(run), seq, name, attempt, data, limit, room)

    return _write_log(ctx, run_id, seq, name, caller, "progress", write, attempt)


def read_log(ctx: Context, run_id: str, seq: int, name: str, offset: int) -> LogView:
    """Before the seal, the highest attempt's progress if there is one, else the appended log;
    after it, the sealed log. A step the run does not have reads as an empty log
    (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log): a viewer that polls the steps
    it was shown is never told 404 for one."""
    with ctx.db.read() as s:
        run = get_run(s, run_id)
    if run is None:
        raise NotFound(f"no such run: {run_id}")
    where = record_of(run)
    if ctx.records.is_sealed(where):
        data, state = ctx.records.log_slice(where, seq, name, offset)
        return LogView(data, state, SEALED)
    progress = ctx.records.read_progress(where, seq, name, offset)
    if progress is not None:
        return LogView(progress[0], progress[1], PROGRESS)
    data, state = ctx.records.log_slice(where, seq, name, offset)
    return LogView(data, state, PROGRESS)


def store_blob(
    s: Session,
    ctx: Context,
    run: Run,
    seq: int,
    attempt: int,
    name: str,
    data: bytes,
    *,
    by: str | None,
    schema_ok: bool | None,
    by_declared_token: str | None = None,
) -> None:
    """The file in the Record (atomic) and its ledger row, in the caller's transaction;
    ``by_declared_token`` marks a ``by`` that is a self-declared principal
    (docs/tokens.md#principal)."""
    digest = ctx.records.put_blob(record_of(run), seq, attempt, name, data)
    record_blob(
        s,
        run_id=run.run_id,
        seq=seq,
        attempt=attempt,
        name=name,
        work_id=run.work_id,
        by=by,
        size=len(data),
        sha256=digest,
        schema_ok=schema_ok,
        by_declared_token=by_declared_token,
    )


def is_upload_name(name: str) -> bool:
    """A name a step may upload under
    (docs/api.md#put-v1runsrun_idstepsseqblobname--upload-an-artifact): one file name of at most 200
    bytes, ``_cannot`` and other names no contract may declare included, but no separator, control
    character (C0, DEL, C1: a newline would split the name's line in the sealed Record's
    SHA256SUMS), Unicode format character (a bidi override would disguise it,
    docs/security.md#runs-records-and-uploads) or name of only dots."""
    try:
        check_name(name)
    except ValueError:
        return False
    return (
        name.strip(".") != "" and not has_control_character(name) and not has_format_character(name)
    )


def check_upload_name(name: str) -> None:
    """A control or format character is a 400 naming ``name``, like a bad log ``?name=``
    (docs/security.md#runs-records-and-uploads); any other name no upload may have names nothing:
    404 (docs/api.md#conventions)."""
    if has_control_character(name):
        raise BadRequest(f"name must not contain a control character, got {name!r}")
    if has_format_character(name):
        raise BadRequest(f"name must not contain a Unicode format character, got {name!r}")
    if not is_upload_name(name):
        raise NotFound("not a valid artifact name")


@retrying
def put_blob(ctx: Context, run_id: str, seq: int, name: str, data: bytes, caller: Caller) -> None:
    """Only for the step that makes it: a step a node runs, CLAIMED (409 otherwise, after 403,
    404 and 410; docs/security.md#runs-records-and-uploads), stored as its current attempt. Validate
    against the step's schema first (422, nothing stored), then write the file atomically and its
    ledger row (docs/api.md#put-v1runsrun_idstepsseqblobname--upload-an-artifact). Any valid name
    may be uploaded, declared in the step's ``out`` or not; only declared names count as produced
    (docs/api.md#put-v1runsrun_idstepsseqblobname--upload-an-artifact)."""
    with ctx.db.read() as s:
        run, step = _run_and_step(s, run_id, seq)
    authorise_node(caller, step)
    check_upload_name(name)
    if run.state in RUN_FINISHED:
        raise Gone()
    if step.state != CLAIMED or step.kind not in NODE_KINDS:
        # before the schema is looked at (docs/security.md#runs-records-and-uploads)
        raise StepNotClaimed()
    schema = (step.spec.get("schema") or {}).get(name)
    schema_ok = None
    if schema is not None:
        try:
            doc = parse_json(data, name)
        except BadRequest as exc:
            raise Unprocessable(f"schema violation: $: {exc.reason}") from None
        problem = schema_violation(schema, doc, name)
        if problem:
            raise Unprocessable(problem)
        schema_ok = True
    with ctx.db.begin() as s:
        # the end of the run waits for this write (docs/design.md#records)
        locked = lock_run_for_files(s, run_id)
        if locked is None or locked.state in RUN_FINISHED:
            raise Gone()
        _share_claimed_step(s, run_id, seq, step.attempt)
        _count_blob(s, ctx, locked, seq, step.attempt, name, len(data))
        try:
            store_blob(
                s, ctx, run, seq, step.attempt, name, data, by=step.node_id, schema_ok=schema_ok
            )
        except RecordSealed:
            raise Gone() from None  # the run ended and was sealed since we looked


def _count_blob(
    s: Session, ctx: Context, run: Run, seq: int, attempt: int, name: str, size: int
) -> None:
    """Count an upload against the caps (docs/security.md#runs-records-and-uploads) in the
    transaction that stores it, under the run's row: a new (attempt, name) is one more file of the
    step; the run's bytes grow by what the upload adds to the blob it replaces. Over either cap:
    413, and nothing is stored."""
    before = blob_bytes(s, run.run_id, seq, attempt, name)
    limit = ctx.config["records.max_step_files"]
    if before is None and not add_step_file(s, run.run_id, seq, limit):
        raise PayloadTooLarge(
            f"step {seq} of run {run.run_id} would have more than records.max_step_files ({limit})"
        )
    cap = ctx.config["records.max_run_bytes"]
    if not add_run_bytes(s, run.run_id, size - (before or 0), cap):
        raise PayloadTooLarge(
            f"run {run.run_id} would store more than records.max_run_bytes ({cap} bytes)"
        )


def get_blob(ctx: Context, run_id: str, name: str) -> bytes:
    """The blob the name resolves to in the run
    (docs/api.md#get-v1runsrun_idblobname--download-an-artifact: among the blobs of the steps that
    declare it, else among all blobs of the run)."""
    with ctx.db.read() as s:
        run = get_run(s, run_id)
        if run is None:
            raise NotFound(f"no such run: {run_id}")
        blob = newest_blob(s, run_id, name) if is_upload_name(name) else None
    if blob is None:
        raise NotFound(f"no such blob: {name}")
    data = ctx.records.read_blob(record_of(run), blob.seq, blob.attempt, name)
    if data is None:
        raise NotFound(f"no such blob: {name}")
    return data


def ledger(ctx: Context, run_id: str) -> dict[str, Any]:
    """``GET /v1/runs/{id}/ledger``
    (docs/api.md#get-v1runsrun_idledger--the-artifacts-a-run-can-see)."""
    with ctx.db.read() as s:
        run = get_run(s, run_id)
        if run is None:
            raise NotFound(f"no such run: {run_id}")
        return {"entries": ledger_entries(s, run)}


def ledger_entries(s: Session, run: Run, *, marked: bool = True) -> list[dict[str, Any]]:
    """Artifacts this run can see; ``ledger.scope: work`` puts earlier runs of the same work
    first (docs/api.md#get-v1runsrun_idledger--the-artifacts-a-run-can-see). Also the claim's
    ``ledger`` for a step with ``see.ledger: "list"``, with ``marked=False``: that one keeps the
    original's entry shape (docs/api.md#post-v1nodesnode_idclaim--the-next-step-for-a-node), without
    the marks of a self-declared ``by`` (docs/tokens.md#principal)."""
    runs = [run.run_id]
    if run.ledger_scope == "work" and run.work_id:
        runs = earlier_runs_of_work(s, run.work_id, run.run_id) + [run.run_id]
    blobs = blobs_of_runs(s, runs)
    order = {r: i for i, r in enumerate(runs)}
    entries = []
    for b in sorted(blobs, key=lambda b: (order[b.run_id], b.at, b.seq, b.name)):
        entry: dict[str, Any] = {
            "seq": b.seq,
            "attempt": b.attempt,
            "name": b.name,
            "by": b.by,
            "at": ts(b.at),
            "bytes": b.bytes,
        }
        if b.schema_ok is not None:
            entry["schema_ok"] = b.schema_ok
        if b.run_id != run.run_id:
            entry["run_id"] = b.run_id
        if marked:
            mark_declared(entry, "by", b.by_declared_token)
        entries.append(entry)
    return entries


def manifest(
    *,
    run_id: str,
    work_id: str,
    principal: str | None,
    token_name: str | None,
    contract: dict[str, Any],
    created_at: Any,
    state: str,
    principal_self_declared: bool = False,
    team: str = "default",
) -> dict[str, Any]:
    """``manifest.json``: written when the Record opens and again, whole, from the run's row when
    it is sealed, so the opening write need not reach the disk before the submit is answered.
    A self-declared requester is marked ``requester_self_declared`` (docs/tokens.md#principal)."""
    doc: dict[str, Any] = {"run_id": run_id, "work_id": work_id, "requester": principal}
    if principal_self_declared:
        doc["requester_self_declared"] = True
    return doc | {
        "token": token_name,
        "team": team,  # docs/teams.md
        "contract": contract,
        "created_at": ts(created_at),
        "state": state,
    }


def seal_run(ctx: Context, run_id: str) -> bool:
    """Write verdict, step files, events and SHA256SUMS, make the Record read-only, then mark the
    run sealed. Idempotent; a failure is logged and left to the reaper (docs/design.md#records)."""
    try:
        with ctx.db.begin() as s:
            # One seal of a run at a time on every host; the one that finds it held leaves it
            # to the holder (or to the reaper's next pass, should the holder fail).
            read = seal_reads(s, run_id)
            if read is None:
                return False
            run = read.run
            if run is None or run.state not in RUN_FINISHED or run.sealed_at is not None:
                return False
            if not ctx.records.exists(record_of(run)):
                return False  # a rejected submit has no Record and is never sealed
            steps = read.steps
            events = [event_document(e) for e in read.events]
            docs = [(st.seq, st.step_id, step_document(st, label)) for st, label in steps]
            ctx.records.seal(
                record_of(run),
                verdict=run.verdict or {"state": run.state, "checks": []},
                steps=docs,
                events=events,
                manifest_update=manifest(
                    run_id=run.run_id,
                    work_id=run.work_id,
                    principal=run.principal,
                    token_name=run.token_name,
                    contract=run.contract,
                    created_at=run.created_at,
                    state=run.state,
                    principal_self_declared=run.principal_self_declared,
                    team=run.team,
                )
                | {"ended_at": ts(run.ended_at)},
            )
            mark_sealed(s, run_id)
        return True
    except RecordStoreUnavailable as exc:
        log.warning("sealing failed; the reaper retries", run_id=run_id, reason=exc.reason)
        return False
    except Exception:
        log.exception("sealing failed; the reaper retries", run_id=run_id)
        return False


def step_document(st: Any, label: str | None) -> dict[str, Any]:
    """What a step did, as its document in the sealed Record; ``label``: its node's label."""
    doc: dict[str, Any] = {
        "seq": st.seq,
        "id": st.step_id,
        "kind": st.kind,
        "state": st.state,
        "attempt": st.attempt,
        "node": st.node_id,
        "label": label if st.node_id else None,
        "started_at": ts(st.started_at),
        "ended_at": ts(st.ended_at),
        "exit_code": st.exit_code,
        "produced": st.produced,
        "error": st.error,
        "result": st.result,
    }
    if st.answered_by:
        doc["answered_by"] = st.answered_by
        mark_declared(doc, "answered_by", st.answered_by_declared_token)
    return doc


def event_document(e: RunEvent) -> dict[str, Any]:
    """An audit event as the events route and the sealed Record show it."""
    doc = {"at": ts(e.at), "from": e.from_state, "to": e.to_state, "cause": e.cause, "by": e.by}
    return mark_declared(doc, "by", e.by_declared_token)


def record_stream(ctx: Context, run_id: str) -> Iterator[bytes]:
    with ctx.db.read() as s:
        run = get_run(s, run_id)
    if run is None:
        raise NotFound(f"no such run: {run_id}")
    if run.sealed_at is None or not ctx.records.is_sealed(record_of(run)):
        raise NotSealed()
    return ctx.records.tar_stream(record_of(run))
