"""Asks (docs/contract.md#ask): steps that wait for a person's answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.context import Caller, Context
from app.contract import parse_json
from app.contract.violations import schema_violation
from app.errors import BadRequest, Conflict, Forbidden, Unprocessable
from app.models import Run, Step
from app.services.after_commit import settle_and_reply
from app.services.execution import Picture
from app.services.notify import AfterCommit
from app.services.records import record_of, store_blob
from app.services.results import complete_step
from app.services.tx import retrying
from app.states import ASKED, RUNNING
from app.store.blobs import newest_blob
from app.store.runs import get_run, lock_run
from app.store.steps import get_step, lock_steps, open_asks
from app.wire import ts

SHOWN_LIMIT = 32 * 1024
NOT_AWAITING = "step is not awaiting an answer"


NOT_AN_ANSWERER = "principal is not an allowed answerer"


def answer_refused(answerers: list[str] | None, caller: Caller) -> str | None:
    """Why an answer of ``caller`` to an ask with these ``answerers`` is refused (403), or None.
    An ask restricted to answerers (docs/tokens.md#principal) takes only a principal the token
    vouches for — its own, or one declared through a token that vouches for its callers."""
    if not answerers:
        return None
    if caller.principal is None or caller.principal not in answerers:
        return NOT_AN_ANSWERER
    if not caller.vouched:
        return (
            f"{NOT_AN_ANSWERER}: {caller.principal} is self-declared (X-Enode-Principal) and "
            f"token {caller.token_name} does not vouch for it"
        )
    return None


def list_asks(ctx: Context, caller: Caller, *, may_answer: bool) -> dict[str, Any]:
    """The open asks (docs/api.md#get-v1asks--the-open-asks); ``can_answer`` is true only where an
    answer of this caller would be accepted: ``may_answer`` (the token's roles allow answering) and
    the ask's answerers."""
    out = []
    with ctx.db.read() as s:
        for st, run in open_asks(s):
            ask = st.spec["ask"]
            out_name = (st.spec.get("out") or [None])[0]
            item: dict[str, Any] = {
                "run_id": st.run_id,
                "seq": st.seq,
                "step": st.step_id,
                "prompt": ask.get("prompt"),
                "schema": (st.spec.get("schema") or {}).get(out_name) if out_name else None,
                "asked_at": ts(st.asked_at),
                "can_answer": may_answer and answer_refused(ask.get("answerers"), caller) is None,
            }
            if ask.get("answerers"):
                item["answerers"] = ask["answerers"]
            if st.ask_deadline is not None:
                item["deadline"] = ts(st.ask_deadline)
            if ask.get("show"):
                item["shown"] = [_shown(ctx, s, run, name) for name in ask["show"]]
            out.append(item)
    return {"asks": out}


def _shown(ctx: Context, s: Any, run: Run, name: str) -> dict[str, Any]:
    """An artifact inlined for the answerer: a JSON value as itself, anything else (or anything
    over 32 KiB, then cut and marked ``truncated``) as a string
    (docs/api.md#get-v1asks--the-open-asks)."""
    blob = newest_blob(s, run.run_id, name)
    # One byte past the limit tells a cut artifact from one of exactly 32 KiB; nothing past it is
    # read, however large the artifact (docs/security.md#input-and-load).
    limit = SHOWN_LIMIT + 1
    data = (
        ctx.records.read_blob(record_of(run), blob.seq, blob.attempt, name, limit) if blob else None
    )
    if data is None:
        return {"name": name, "missing": True}
    if len(data) > SHOWN_LIMIT:
        text = data[:SHOWN_LIMIT].decode("utf-8", "replace")
        return {"name": name, "content": text, "truncated": True}
    try:
        # A JSON artifact is inlined as the JSON value itself; text stays a string
        # (docs/api.md#get-v1asks--the-open-asks).
        return {"name": name, "content": parse_json(data)}
    except BadRequest:
        return {"name": name, "content": data.decode("utf-8", "replace")}


def _awaiting(run: Run | None, st: Step | None, caller: Caller) -> Step:
    """The step, when it awaits an answer that ``caller`` may give: 409, then 403
    (docs/api.md#post-v1runsrun_idstepsseqanswer--answer-an-ask)."""
    if run is None or run.state != RUNNING or st is None or st.kind != "ask" or st.state != ASKED:
        raise Conflict(NOT_AWAITING)
    refused = answer_refused(st.spec["ask"].get("answerers"), caller)
    if refused:
        raise Forbidden(refused)
    return st


def open_ask_schema(ctx: Context, run_id: str, seq: int, caller: Caller) -> dict[str, Any] | None:
    """The schema of an ask open for ``caller``'s answer (the page's form reads its answer with
    it): 409 when the step awaits no answer, 403 when the caller may not give it."""
    with ctx.db.read() as s:
        run = get_run(s, run_id)
        st = get_step(s, run_id, seq) if run is not None else None
        return _answer_schema(_awaiting(run, st, caller))


def _answer_schema(st: Step) -> dict[str, Any] | None:
    return (st.spec.get("schema") or {}).get(st.spec["out"][0])


@retrying
def _answer(
    ctx: Context, run_id: str, seq: int, raw: bytes, caller: Caller, after: AfterCommit
) -> dict[str, Any]:
    with ctx.db.begin() as s:
        run = lock_run(s, run_id)
        if run is None or run.state != RUNNING:
            raise Conflict(NOT_AWAITING)
        pic = Picture(run, lock_steps(s, run_id))
        st = _awaiting(run, pic.steps.get(seq), caller)
        name = st.spec["out"][0]
        store_blob(
            s,
            ctx,
            run,
            seq,
            st.attempt,
            name,
            raw,
            by=caller.by,
            schema_ok=True if _answer_schema(st) is not None else None,
            by_declared_token=caller.declared_token,
        )
        return complete_step(
            s,
            ctx,
            pic,
            st,
            after,
            expect=ASKED,
            exit_code=None,
            error=None,
            reported=[name],
            node=None,
            answered_by=caller.by,
            answered_by_declared_token=caller.declared_token,
        )


def answer(
    ctx: Context, run_id: str, seq: int, body: Callable[[], bytes], caller: Caller
) -> dict[str, Any]:
    """Take ``caller``'s answer to the ask at ``seq``. Its ``body`` (bounded by max_blob_bytes,
    else 413) is read and parsed only once the step is known to await an answer this caller may
    give (409, 403): parsing a large JSON body costs many times its size in memory, which nobody
    may make the server spend on a step they cannot answer (docs/security.md). The answer is then
    validated, bounded (docs/api.md), before any transaction opens: however long that takes, no
    row is locked meanwhile. The step is read without a lock here, so the checks come again under
    it in the transaction; the schema is part of the step's spec, which never changes."""
    schema = open_ask_schema(ctx, run_id, seq, caller)
    raw = body()
    doc = parse_json(raw)
    if schema is not None:
        problem = schema_violation(schema, doc, "the answer")
        if problem:
            raise Unprocessable(problem)  # nothing stored; the ask stays open
    after = AfterCommit()
    reply = _answer(ctx, run_id, seq, raw, caller, after)
    return settle_and_reply(ctx, after, reply)
