"""Node agents at work: claim, result, logs and blobs (docs/api.md#node-agents)."""

from __future__ import annotations

from typing import Any

from flask import Response

from app.api.common import (
    bounded_body,
    caller,
    ctx,
    header_text,
    make_blueprint,
)
from app.api.openapi import (
    BLOB_NAME,
    INSTANCE,
    NODE_ID,
    RUN_ID,
    SEQ,
    content_reply,
    empty_reply,
    header,
    json_reply,
    operation,
)
from app.api.schemas import (
    ClaimQuerySchema,
    ClaimSchema,
    LogReadQuerySchema,
    LogWriteQuerySchema,
    ResultReplySchema,
    ResultSchema,
)
from app.contract import is_valid_id
from app.contract.violations import MAX_CHECKS
from app.errors import BadRequest
from app.names import NAME_RULE
from app.records import LogState
from app.services.records import append_log, get_blob, put_blob, put_progress, read_log
from app.services.results import claim, report_result

blp = make_blueprint("results", "Node agents claim steps and report what they did")

_NODE = ("node", "operator")
_BYTES_BODY = {
    "description": "the bytes, as they are",
    "required": False,
    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
}
_LOG_BYTES = header("the log file's whole length in bytes (the next from=)", {"type": "integer"})
_LOG_ATTEMPT = header("the attempt the bytes belong to", {"type": "integer"}, required=False)
_LOG_CAPPED = header("1 once a cap cut the file", {"type": "string", "enum": ["1"]}, False)


def _seq(text: str) -> int:
    """A {seq} that is not a positive integer is a 400 (docs/api.md#conventions)."""
    if not (text.isascii() and text.isdigit()) or len(text) > 9 or int(text) <= 0:
        raise BadRequest(f"seq must be a positive integer, got {text!r}")
    return int(text)


def _state_headers(resp: Response, state: LogState) -> None:
    """What a viewer or an agent needs to go on
    (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log): the file's whole length (the
    next ``from``), the attempt its bytes belong to, and ``Capped: 1`` once the cap cut it."""
    resp.headers["X-Enode-Log-Bytes"] = str(state.total)
    resp.headers["X-Enode-Log-Attempt"] = str(state.attempt)
    if state.capped:
        resp.headers["X-Enode-Log-Capped"] = "1"


def _blob_body() -> bytes:
    return bounded_body(ctx().config["max_blob_bytes"])


@blp.route("/nodes/<node_id>/claim", methods=["POST"], parameters=[NODE_ID, INSTANCE])
@blp.arguments(ClaimQuerySchema, location="query")
@blp.doc(
    **operation(
        {
            200: json_reply(ClaimSchema, "the next step for this node (or the one it holds)"),
            204: empty_reply(
                "nothing to do within the long-poll window; also at once when a newer claim of "
                "the node came after this one waited a second (one waiting claim per node id and "
                "process), and after a second for a node without a live advert"
            ),
        },
        {400: "node_id, wait or X-Enode-Instance is not valid"},
        roles=_NODE,
    )
)
def post_claim(query: dict[str, Any], node_id: str) -> Any:
    # node ids share the run_id grammar (docs/contract.md#top-level, docs/api.md#conventions)
    if not is_valid_id(node_id):
        raise BadRequest(f"node_id must be {NAME_RULE}, got {node_id!r}")
    instance = header_text("X-Enode-Instance")
    wait = ctx().config["claim.long_poll_seconds"]
    if query["wait"] is not None:
        wait = min(wait, max(0.0, query["wait"]))
    body = claim(ctx(), node_id, instance, wait)
    if body is None:
        return Response(status=204)
    return body


@blp.route("/runs/<run_id>/steps/<seq>/result", methods=["POST"], parameters=[RUN_ID, SEQ])
@blp.arguments(ResultSchema)
@blp.doc(
    **operation(
        {200: json_reply(ResultReplySchema, "taken: the step is judged and the run goes on")},
        {
            400: "seq is not a positive integer, or node, exit_code or produced has the wrong "
            "type (other fields are never refused)",
            409: "the step is not claimed by that node (or the lease nonce is not current)",
            413: "body over max_body_bytes",
        },
        roles=_NODE,
    )
)
def post_result(body: dict[str, Any], run_id: str, seq: str) -> dict[str, Any]:
    return report_result(ctx(), run_id, _seq(seq), body)


@blp.route("/runs/<run_id>/steps/<seq>/log", methods=["PUT"], parameters=[RUN_ID, SEQ])
@blp.arguments(LogWriteQuerySchema, location="query")
@blp.doc(
    requestBody=_BYTES_BODY,
    **operation(
        {
            200: empty_reply(
                "appended to the log; with progress=1, a progress chunk kept apart from the log "
                "until the seal (a chunk of an older attempt than the stored one changes "
                "nothing), answered with X-Enode-Log-Attempt (the attempt kept). A cap "
                "(max_blob_bytes, records.max_run_bytes, records.max_step_files) cuts the file "
                "and sets X-Enode-Log-Capped",
                {
                    "X-Enode-Log-Bytes": _LOG_BYTES,
                    "X-Enode-Log-Attempt": _LOG_ATTEMPT,
                    "X-Enode-Log-Capped": _LOG_CAPPED,
                },
            )
        },
        {
            400: "seq is not a positive integer, name is not valid, or invalid attempt",
            404: "no such run or step",
            409: "step is not claimed: the step is not a run or agent step CLAIMED by its node "
            "(with progress=1: in that attempt; a chunk of an earlier attempt than the step's "
            "is 200 and stores nothing)",
            410: "the run has already finished",
            413: "body over max_blob_bytes",
        },
        roles=_NODE,
    ),
)
def put_log(query: dict[str, Any], run_id: str, seq: str) -> Response:
    n = _seq(seq)
    name, attempt = query["name"], query["attempt"]
    body = _blob_body()
    resp = Response(status=200)
    if attempt is None:
        state = append_log(ctx(), run_id, n, name, body, caller())
        resp.headers["X-Enode-Log-Bytes"] = str(state.total)
        if state.capped:  # cut at max_blob_bytes or at the run's records.max_run_bytes
            resp.headers["X-Enode-Log-Capped"] = "1"
    else:
        _state_headers(resp, put_progress(ctx(), run_id, n, name, attempt, body, caller()))
    return resp


@blp.route("/runs/<run_id>/steps/<seq>/log", methods=["GET"], parameters=[RUN_ID, SEQ])
@blp.arguments(LogReadQuerySchema, location="query")
@blp.doc(
    **operation(
        {
            200: content_reply(
                "text/plain",
                "the log's bytes from the offset; a step without a log (or that the run does "
                "not have) is empty",
                {
                    "X-Enode-Log-Bytes": _LOG_BYTES,
                    "X-Enode-Log-Attempt": header(
                        "the attempt the bytes belong to", {"type": "integer"}
                    ),
                    "X-Enode-Log-Capped": _LOG_CAPPED,
                    "X-Enode-Log-Source": header(
                        "progress before the seal, sealed after",
                        {"type": "string", "enum": ["progress", "sealed"]},
                    ),
                },
            )
        },
        {400: "seq is not a positive integer, or name or from is not valid", 404: "no such run"},
    )
)
def get_log(query: dict[str, Any], run_id: str, seq: str) -> Response:
    n = _seq(seq)
    view = read_log(ctx(), run_id, n, query["name"], query["offset"])
    resp = Response(view.data, status=200, mimetype="text/plain")
    _state_headers(resp, view.state)
    resp.headers["X-Enode-Log-Source"] = view.source
    resp.headers["Cache-Control"] = "no-store"  # a live log: a cached answer would look stuck
    return resp


@blp.route(
    "/runs/<run_id>/steps/<seq>/blob/<name>", methods=["PUT"], parameters=[RUN_ID, SEQ, BLOB_NAME]
)
@blp.doc(
    requestBody=_BYTES_BODY,
    **operation(
        {204: empty_reply("stored, as the step's current attempt")},
        {
            400: "seq is not a positive integer, or the name holds a control or Unicode format "
            "character",
            404: "no such run or step, or a name no artifact can have",
            409: "step is not claimed: the step is not a run or agent step CLAIMED by its node "
            "(answers and acquire outcomes are written by the Mediator only)",
            410: "the run has already finished",
            413: "body over max_blob_bytes, or the run's files would pass records.max_run_bytes "
            "or the step's records.max_step_files, or validating the body against the step's "
            f"schema would take more than {MAX_CHECKS:,} checks (nothing stored)",
            422: "schema violation: the step's schema for that name refuses the bytes",
        },
        roles=_NODE,
    ),
)
def put_blob_route(run_id: str, seq: str, name: str) -> Response:
    n = _seq(seq)
    put_blob(ctx(), run_id, n, name, _blob_body(), caller())
    return Response(status=204)


@blp.route("/runs/<run_id>/blob/<name>", methods=["GET"], parameters=[RUN_ID, BLOB_NAME])
@blp.doc(
    **operation(
        {
            200: content_reply(
                "application/octet-stream",
                "the newest attempt of that name (among the steps that declare it in out, "
                "else among all the run's blobs)",
            )
        },
        {404: "no such run, or no such blob"},
    )
)
def get_blob_route(run_id: str, name: str) -> Response:
    return Response(get_blob(ctx(), run_id, name), status=200, mimetype="application/octet-stream")
