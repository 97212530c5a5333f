"""What every blueprint shares: the services context, the caller, bounded JSON bodies."""

from __future__ import annotations

from typing import Any, NoReturn

from flask import current_app, g, request
from flask_smorest import Blueprint
from marshmallow import Schema, ValidationError
from webargs.flaskparser import FlaskParser

from app.api.schemas import AgentBody, Reason, unstorable
from app.context import Caller, Context
from app.contract import check_no_nul, parse_json
from app.errors import BadRequest, PayloadTooLarge


def ctx() -> Context:
    return current_app.extensions["mediator"]


def first_error(messages: Any, path: str = "") -> str:
    """marshmallow's nested messages -> one reason naming the field: ``capabilities[0].capability:
    String does not match expected pattern.``"""
    if isinstance(messages, dict):
        if len(messages) == 1 and ("json" in messages or "query" in messages):
            return first_error(next(iter(messages.values())), path)
        key = sorted(messages, key=str)[0]
        if key == "_schema":
            return first_error(messages[key], path)
        sub = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))
        return first_error(messages[key], sub)
    if isinstance(messages, list) and messages:
        text = first_error(messages[0], path)
        return text
    if isinstance(messages, Reason):
        return str(messages)
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

    def parse(
        self,
        argmap: Any,
        req: Any = None,
        *,
        location: str | None = None,
        validate: Any = None,
        **kwargs: Any,
    ) -> Any:
        """A body schema's ``fast_load`` first, when it has one (the hot routes' bodies of the
        usual shape); any body it does not take goes through webargs and the schema as always."""
        fast = getattr(argmap, "fast_load", None)
        if fast is not None and validate is None and location in (None, "json"):
            loaded = fast(self.load_json(req, argmap))
            if loaded is not None:
                return loaded
        return super().parse(argmap, req, location=location, validate=validate, **kwargs)

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
    no NUL in any string; a body that is not JSON is a 400 (docs/api.md#conventions). ``contract``:
    the contract validation checks NUL itself, in its fixed order
    (docs/contract.md#validation-errors); ``nul_allowed``: the caller replaces NUL itself (adverts
    and results, docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl)."""
    if "mediator_json" in g:
        return g.mediator_json
    body = parse_json(bounded_body(ctx().config["max_body_bytes"]))
    if not (contract or nul_allowed):
        check_no_nul(body)
    g.mediator_json = body
    return body


def bounded_body(limit: int) -> bytes:
    """The request body, at most ``limit`` bytes: over it is a 413 and nothing is stored
    (docs/api.md#conventions). A body without Content-Length (chunked, through gunicorn) is read one
    byte past the limit, because werkzeug would otherwise cut it there without a word."""
    request.max_content_length = limit + 1
    raw = request.get_data(cache=True)
    if len(raw) > limit:
        raise PayloadTooLarge()
    return raw


def query_args(schema: Schema) -> dict[str, Any]:
    """The query parsed by ``schema`` outside a route's ``@blp.arguments`` (a page reading the
    API's filters): a 400 naming the first bad parameter, as the routes answer."""
    try:
        loaded: dict[str, Any] = schema.load(request.args)
    except ValidationError as exc:
        raise BadRequest(first_error(exc.messages)) from None
    return loaded


def header_text(name: str, max_length: int = 200) -> str | None:
    """The header ``name`` (None when absent or empty), at most ``max_length`` characters the
    database can store; else a 400 naming the header (docs/security.md#input-and-load)."""
    value = request.headers.get(name) or None
    if value is not None and (len(value) > max_length or unstorable(value)):
        raise BadRequest(f"{name} must be at most {max_length} characters, without NUL")
    return value


def caller() -> Caller:
    return g.caller


def make_blueprint(name: str, description: str) -> MediatorBlueprint:
    """A ``/v1`` blueprint; its requests are authorised by the app's hook (app/api/auth.py)."""
    return MediatorBlueprint(name, __name__, url_prefix="/v1", description=description)
