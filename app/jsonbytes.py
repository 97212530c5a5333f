"""JSON the Mediator writes itself: a Record's files, the database's ``jsonb`` parameters and its
answers' bodies.

orjson where it can (the standard library's pure-Python encoder, which ``indent`` selects, took
about a tenth of a placed submit's CPU for the Record's manifest alone); the standard library
where orjson refuses a document it takes (a lone surrogate, an integer beyond 64 bits, a key that
is not a string). For ASCII text the bytes are the standard library's; other text is written as
UTF-8 rather than as ``\\u`` escapes."""

from __future__ import annotations

import json
from typing import Any

import orjson
from flask.json.provider import DefaultJSONProvider

# datetime through ``default=str`` as the standard library's ``default=str`` writes it.
_PRETTY = (
    orjson.OPT_INDENT_2
    | orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_APPEND_NEWLINE
)


def pretty(doc: Any) -> bytes:
    """Indented by two, keys sorted, a newline at the end: the files of a Record."""
    try:
        return orjson.dumps(doc, default=str, option=_PRETTY)
    except orjson.JSONEncodeError:
        return json.dumps(doc, indent=2, sort_keys=True, default=str).encode() + b"\n"


def compact(doc: Any) -> bytes:
    """For PostgreSQL to parse (``jsonb`` parameters): no layout, no order kept beyond the
    document's own."""
    try:
        return orjson.dumps(doc)
    except orjson.JSONEncodeError:
        return json.dumps(doc).encode()


class AnswerJSON(DefaultJSONProvider):
    """Flask's JSON provider with orjson for the compact bodies of answers (the standard
    library's encoder took a twentieth of a placed submit's CPU): the same JSON, dates through
    Flask's own ``default`` as before, text as UTF-8 rather than ``\\u`` escapes. Anything else
    (indented, sorted, or a document orjson refuses) goes to Flask's own."""

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        if kwargs == _COMPACT and not self.sort_keys:
            try:
                return orjson.dumps(obj, default=self.default, option=_ANSWER).decode()
            except orjson.JSONEncodeError:
                pass
        return super().dumps(obj, **kwargs)


_COMPACT = {"separators": (",", ":")}
_ANSWER = orjson.OPT_PASSTHROUGH_DATETIME
