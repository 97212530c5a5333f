"""What every blueprint shares: the services context, the caller, bounded JSON bodies, roles."""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from flask import current_app, g, request
from flask_smorest import Blueprint
from marshmallow import ValidationError
from webargs.flaskparser import FlaskParser

from app.api.schemas import AgentBody
from app.context import Caller, Context
from app.contract import check_no_nul, parse_json
from app.errors import BadRequest, Forbidden, PayloadTooLarge, Unauthorized

_SURROGATE = re.compile("[\ud800-\udfff]")

ALL_ROLES = frozenset({"submitter", "node", "answerer", "reader", "operator"})

F = TypeVar("F", bound=Callable[..., Any])


def ctx() -> Context:
    return current_app.extensions["mediator"]


def first_error(messages: Any, path: str = "") -> str:
    """marshmallow's nested messages -> one reason naming the field: ``capabilities[0].capability:
    String does not match expected pattern.``"""
    if isinstance(messages, dict):
        if "json" in messages and len(messages) == 1:
            return first_error(messages["json"], path)
        key = sorted(messages, key=str)[0]
        if key == "_schema":
            return first_error(messages[key], path)
        sub = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))
        return first_error(messages[key], sub)
    if isinstance(messages, list) and messages:
        text = first_error(messages[0], path)
        return text
    text = str(messages)
    if text.endswith("is missing"):
        return text
    return f"{path}: {text}" if path else text


class MediatorParser(FlaskParser):
    """webargs parser: bad input is a 400 naming the field (never smorest's 422), not-JSON a 400."""

    DEFAULT_VALIDATION_STATUS = 400

    def handle_error(self, error: ValidationError, req: Any, schema: Any, **kwargs: Any) -> None:  # type: ignore[override]
        raise BadRequest(first_error(error.messages))

    def _handle_invalid_json_error(
        self, error: Any, req: Any, *args: Any, **kwargs: Any
    ) -> NoReturn:
        raise BadRequest("body is not valid JSON")

    def load_json(self, req: Any, schema: Any) -> Any:
        # A node agent's body is never refused for its text: its schema turns NUL into U+FFFD.
        body = json_body(nul_allowed=isinstance(schema, AgentBody))
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        return body


class MediatorBlueprint(Blueprint):
    ARGUMENTS_PARSER = MediatorParser()


def json_body(*, contract: bool = False, nul_allowed: bool = False) -> Any:
    """The request body as JSON, bounded by ``max_body_bytes`` (413 over it) and by depth, with
    no NUL in any string; a body that is not JSON is a 400 (SPEC §2). ``contract``: the contract
    validation checks NUL itself, in its fixed order (SPEC §3); ``nul_allowed``: the caller
    replaces NUL itself (adverts and results, SPEC §19.3)."""
    if "mediator_json" in g:
        return g.mediator_json
    body = parse_json(bounded_body(ctx().config["max_body_bytes"]))
    if not (contract or nul_allowed):
        check_no_nul(body)
    g.mediator_json = body
    return body


def bounded_body(limit: int) -> bytes:
    """The request body, at most ``limit`` bytes: over it is a 413 and nothing is stored (SPEC
    §2). A body without Content-Length (chunked, through gunicorn) is read one byte past the
    limit, because werkzeug would otherwise cut it there without a word."""
    request.max_content_length = limit + 1
    raw = request.get_data(cache=True)
    if len(raw) > limit:
        raise PayloadTooLarge()
    return raw


def _token_digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


def authenticate() -> Caller:
    """``Authorization: Bearer <token>``; the legacy single token carries every role (SPEC §13).
    Secrets are compared in constant time, as digests so length leaks nothing."""
    header = request.headers.get("Authorization", "")
    scheme, _, secret = header.partition(" ")
    legacy = ctx().config["token"]
    if scheme.lower() != "bearer" or not secret.strip() or not legacy:
        raise Unauthorized()
    if not hmac.compare_digest(_token_digest(secret.strip()), _token_digest(legacy)):
        raise Unauthorized()
    principal = header_text("X-Enode-Principal")
    return Caller(token_name="token", roles=ALL_ROLES, principal=principal)


def _unstorable(text: str) -> bool:
    """Whether PostgreSQL would refuse ``text``: no text value holds a NUL, and a lone surrogate
    has no UTF-8 encoding."""
    return "\x00" in text or _SURROGATE.search(text) is not None


def query_text(name: str) -> str | None:
    """The query parameter ``name`` (None when absent), as text the database can compare: one it
    would refuse is a 400 naming the parameter, never a 500 (SPEC §13)."""
    value = request.args.get(name)
    if value is not None and _unstorable(value):
        raise BadRequest(f"{name} must not contain a NUL character, got {value!r}")
    return value


def header_text(name: str, max_length: int = 200) -> str | None:
    """The header ``name`` (None when absent or empty), at most ``max_length`` characters the
    database can store; else a 400 naming the header (SPEC §13)."""
    value = request.headers.get(name) or None
    if value is not None and (len(value) > max_length or _unstorable(value)):
        raise BadRequest(f"{name} must be at most {max_length} characters, without NUL")
    return value


def caller() -> Caller:
    return g.caller


def requires_role(*roles: str) -> Callable[[F], F]:
    """Authorisation before anything else: a token without one of ``roles`` is 403 (SPEC §13)."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not (caller().roles & set(roles)):
                raise Forbidden(f"token lacks the role: {' or '.join(roles)}")
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return deco


def requires_node(node_id: str) -> None:
    """A node token bound to node ids acts only for those nodes (SPEC §13)."""
    nodes = caller().nodes
    if nodes is not None and node_id not in nodes:
        raise Forbidden(f"token may not act for node {node_id}")


def make_blueprint(name: str, description: str) -> MediatorBlueprint:
    blp = MediatorBlueprint(name, __name__, url_prefix="/v1", description=description)

    @blp.before_request
    def _authenticate() -> None:
        g.caller = authenticate()

    return blp
