"""Node agents at work: claim, result, logs and blobs (SPEC §8, §11)."""

from __future__ import annotations

from typing import Any

from flask import Response, request

from app.api.common import (
    bounded_body,
    caller,
    ctx,
    doc_json,
    header_text,
    make_blueprint,
)
from app.api.schemas import ClaimSchema, ErrorBodySchema, ResultReplySchema, ResultSchema
from app.contract import is_valid_id
from app.errors import BadRequest
from app.records import LogState
from app.services.records import append_log, get_blob, put_blob, put_progress, read_log
from app.services.results import claim, report_result

blp = make_blueprint("results", "Node agents claim steps and report what they did")


def _seq(text: str) -> int:
    """SPEC §13: a {seq} that is not a positive integer is a 400."""
    if not (text.isascii() and text.isdigit()) or len(text) > 9 or int(text) <= 0:
        raise BadRequest(f"seq must be a positive integer, got {text!r}")
    return int(text)


def _log_name() -> str:
    """``?name=`` of a log: one plain file-name segment, so it cannot leave the Record (SPEC §13)."""
    name = request.args.get("name") or "step"
    if not is_valid_id(name) or name in {".", ".."}:
        raise BadRequest(f"name must be 1-200 characters of [A-Za-z0-9._:@-], got {name!r}")
    return name


def _progress_attempt() -> int | None:
    """``?progress=1&attempt=N`` of a log PUT: the attempt a progress chunk belongs to (SPEC
    §19.4), or None for the step's final log."""
    if request.args.get("progress") != "1":
        return None
    text = request.args.get("attempt", "")
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise BadRequest("invalid attempt")
    return int(text)


def _log_offset() -> int:
    text = request.args.get("from", "0")
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise BadRequest(f"from must be a byte offset, got {text!r}")
    return int(text)


def _state_headers(resp: Response, state: LogState) -> None:
    """What a viewer or an agent needs to go on (SPEC §19.4): the file's whole length (the next
    ``from``), the attempt its bytes belong to, and ``Capped: 1`` once the cap cut it."""
    resp.headers["X-Enode-Log-Bytes"] = str(state.total)
    resp.headers["X-Enode-Log-Attempt"] = str(state.attempt)
    if state.capped:
        resp.headers["X-Enode-Log-Capped"] = "1"


def _blob_body() -> bytes:
    return bounded_body(ctx().config["max_blob_bytes"])


@blp.route("/nodes/<node_id>/claim", methods=["POST"])
@blp.doc(
    responses={
        "200": doc_json(ClaimSchema),
        "204": {"description": "nothing to do"},
        "503": doc_json(ErrorBodySchema),
    }
)
def post_claim(node_id: str) -> Any:
    if not is_valid_id(node_id):  # node ids share the run_id grammar (SPEC §3, §13)
        raise BadRequest(f"node_id must be 1-200 characters of [A-Za-z0-9._:@-], got {node_id!r}")
    instance = header_text("X-Enode-Instance")
    wait = ctx().config["claim.long_poll_seconds"]
    asked = request.args.get("wait")
    if asked is not None:
        try:
            wait = min(wait, max(0.0, float(asked)))
        except ValueError:
            raise BadRequest(f"wait must be a number of seconds, got {asked!r}") from None
    body = claim(ctx(), node_id, instance, wait)
    if body is None:
        return Response(status=204)
    return body


@blp.route("/runs/<run_id>/steps/<seq>/result", methods=["POST"])
@blp.arguments(ResultSchema)
@blp.doc(
    responses={
        "200": doc_json(ResultReplySchema),
        "409": doc_json(ErrorBodySchema, "not claimed by that node"),
    }
)
def post_result(body: dict[str, Any], run_id: str, seq: str) -> dict[str, Any]:
    return report_result(ctx(), run_id, _seq(seq), body)


@blp.route("/runs/<run_id>/steps/<seq>/log", methods=["PUT"])
@blp.doc(
    responses={
        "200": {
            "description": "appended; X-Enode-Log-Bytes is the file's total length. With "
            "?progress=1&attempt=N a progress chunk, kept apart from the log until the seal, "
            "also answers X-Enode-Log-Attempt (the attempt kept) and X-Enode-Log-Capped: 1"
        },
        "400": doc_json(ErrorBodySchema, "bad name or invalid attempt"),
        "410": doc_json(ErrorBodySchema),
    }
)
def put_log(run_id: str, seq: str) -> Response:
    n = _seq(seq)
    name = _log_name()
    attempt = _progress_attempt()
    body = _blob_body()
    resp = Response(status=200)
    if attempt is None:
        resp.headers["X-Enode-Log-Bytes"] = str(append_log(ctx(), run_id, n, name, body, caller()))
    else:
        _state_headers(resp, put_progress(ctx(), run_id, n, name, attempt, body, caller()))
    return resp


@blp.route("/runs/<run_id>/steps/<seq>/log", methods=["GET"])
@blp.doc(
    responses={
        "200": {
            "description": "the log from ?from= (text), with X-Enode-Log-Bytes, "
            "X-Enode-Log-Source (progress before the seal, sealed after), X-Enode-Log-Attempt "
            "and X-Enode-Log-Capped; a step without a log is empty"
        },
        "404": doc_json(ErrorBodySchema, "no such run"),
    }
)
def get_log(run_id: str, seq: str) -> Response:
    n = _seq(seq)
    view = read_log(ctx(), run_id, n, _log_name(), _log_offset())
    resp = Response(view.data, status=200, mimetype="text/plain")
    _state_headers(resp, view.state)
    resp.headers["X-Enode-Log-Source"] = view.source
    resp.headers["Cache-Control"] = "no-store"  # a live log: a cached answer would look stuck
    return resp


@blp.route("/runs/<run_id>/steps/<seq>/blob/<name>", methods=["PUT"])
@blp.doc(
    responses={
        "204": {"description": "stored"},
        "413": doc_json(ErrorBodySchema),
        "422": doc_json(ErrorBodySchema),
    }
)
def put_blob_route(run_id: str, seq: str, name: str) -> Response:
    n = _seq(seq)
    put_blob(ctx(), run_id, n, name, _blob_body(), caller())
    return Response(status=204)


@blp.route("/runs/<run_id>/blob/<name>", methods=["GET"])
@blp.doc(
    responses={
        "200": {"description": "the newest attempt of that name"},
        "404": doc_json(ErrorBodySchema),
    }
)
def get_blob_route(run_id: str, name: str) -> Response:
    return Response(get_blob(ctx(), run_id, name), status=200, mimetype="application/octet-stream")
