"""Bounded validation of an artifact or an answer against its step's schema
(docs/security.md#input-and-load). Pure.

A document of 10 MiB can hold millions of values that each break the schema. jsonschema finds its
errors lazily, one at a time: this module takes the first few and stops, and never sorts, ranks
(``best_match``) or lists them all. The messages jsonschema writes for the keywords a contract may
use (docs/contract.md#in-out-and-schema) quote the offending value whole — a list of a million
items, or every unexpected key of an object — so those keywords are replaced here by ones that quote
a few items and say how many more there are. The reason names at most ``MAX_ERRORS`` errors and is
cut at ``MAX_REASON_BYTES``.

A document that satisfies its schema is checked in full, so the work is bounded as well: at most
``MAX_CHECKS`` checks a document — each value the schema looks at (the document itself, a property
named in ``properties``, an item under ``items``, a property under an ``additionalProperties``
schema), each property a ``properties`` keyword looks up in an object, and each comparison with a
value of an ``enum``. Past the bound validation stops, and the document is refused as too large
(413). Everything else a keyword does is bounded by the document's own size, each value being
looked at once (none of the keywords a contract may use applies two schemas to one value).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextvars import ContextVar
from itertools import islice
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError
from jsonschema.validators import extend

from app.errors import PayloadTooLarge

MAX_ERRORS = 3
# Under a second of validation on a busy two-core machine (4-9 µs a value looked at, less for a
# look-up or a comparison); far above what a result or an answer needs.
MAX_CHECKS = 100_000
MAX_REASON_BYTES = 1024
_SHOWN_ITEMS = 4  # items of a list or an object quoted in a message
_SHOWN_CHARS = 60  # characters of a string quoted in a message
_SHOWN_DEPTH = 2  # levels of nested lists and objects quoted in a message
_ELLIPSIS = "..."


def short_repr(value: Any, depth: int = _SHOWN_DEPTH) -> str:
    """``repr`` of a JSON value as jsonschema quotes it, but of a few items and characters only:
    it looks at no more of the value than it shows, whatever the value's size."""
    if isinstance(value, dict):
        if not value:
            return "{}"
        if depth <= 0:
            return "{" + _ELLIPSIS + "}"
        shown = [
            f"{short_repr(k, depth - 1)}: {short_repr(v, depth - 1)}"
            for k, v in islice(value.items(), _SHOWN_ITEMS)
        ]
        return "{" + ", ".join(shown + ([_ELLIPSIS] if len(value) > _SHOWN_ITEMS else [])) + "}"
    if isinstance(value, list):
        if not value:
            return "[]"
        if depth <= 0:
            return "[" + _ELLIPSIS + "]"
        shown = [short_repr(v, depth - 1) for v in islice(value, _SHOWN_ITEMS)]
        return "[" + ", ".join(shown + ([_ELLIPSIS] if len(value) > _SHOWN_ITEMS else [])) + "]"
    if isinstance(value, str) and len(value) > _SHOWN_CHARS:
        return repr(value[:_SHOWN_CHARS]) + _ELLIPSIS
    return repr(value)


class _Checks:
    """What is left of a validation's ``MAX_CHECKS``."""

    def __init__(self, left: int) -> None:
        self.left = left


# The checks left to the validation running in this context (None: not counted). jsonschema makes
# a validator object for every value it descends into, so the count cannot live on the validator.
_CHECKS: ContextVar[_Checks | None] = ContextVar("schema_checks", default=None)


class TooMuchToValidate(Exception):
    """The validation used its ``MAX_CHECKS`` and stopped."""


def _charge(n: int = 1) -> None:
    checks = _CHECKS.get()
    if checks is None:
        return
    checks.left -= n
    if checks.left < 0:
        raise TooMuchToValidate()


def _json_equal(one: Any, two: Any) -> bool:
    """Equality of JSON values as JSON Schema has it: ``true`` is not ``1``, ``1`` is ``1.0``."""
    _charge()
    if isinstance(one, bool) or isinstance(two, bool):
        return isinstance(one, bool) and isinstance(two, bool) and one is two
    if isinstance(one, list) and isinstance(two, list):
        return len(one) == len(two) and all(_json_equal(a, b) for a, b in zip(one, two))
    if isinstance(one, dict) and isinstance(two, dict):
        return one.keys() == two.keys() and all(_json_equal(one[k], two[k]) for k in one)
    if isinstance(one, (list, dict)) or isinstance(two, (list, dict)):
        return False
    return bool(one == two)


def _type(validator: Any, types: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    kinds = [types] if isinstance(types, str) else list(types)
    if not any(validator.is_type(instance, kind) for kind in kinds):
        reprs = ", ".join(repr(kind) for kind in kinds)
        yield ValidationError(f"{short_repr(instance)} is not of type {reprs}")


def _enum(validator: Any, enums: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not any(_json_equal(each, instance) for each in enums):
        yield ValidationError(f"{short_repr(instance)} is not one of {short_repr(enums)}")


def _items(validator: Any, items: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "array"):
        return
    prefix = len(schema.get("prefixItems", []))
    extra = len(instance) - prefix
    if extra <= 0:
        return
    if items is False:
        noun = "items" if prefix != 1 else "item"
        yield ValidationError(
            f"Expected at most {prefix} {noun} but found {extra} extra: "
            f"{short_repr(instance[prefix : prefix + _SHOWN_ITEMS + 1])}"
        )
        return
    for index in range(prefix, len(instance)):  # lazily: the caller stops after a few
        _charge()
        yield from validator.descend(instance[index], items, path=index)


def _properties(
    validator: Any, properties: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    _charge(len(properties))  # each looked up, whatever the object holds
    for name, subschema in properties.items():
        if name in instance:
            _charge()
            yield from validator.descend(instance[name], subschema, path=name, schema_path=name)


def _additional_properties(
    validator: Any, extra_schema: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    known = schema.get("properties", {})
    patterns = [re.compile(p) for p in schema.get("patternProperties", {})]
    extras = (k for k in instance if k not in known and not any(p.search(k) for p in patterns))
    if validator.is_type(extra_schema, "object"):
        for extra in extras:
            _charge()
            yield from validator.descend(instance[extra], extra_schema, path=extra)
        return
    if extra_schema is not False:
        return
    shown = list(islice(extras, MAX_ERRORS))
    if not shown:
        return
    more = sum(1 for _ in extras)  # counted, never listed
    names = ", ".join(short_repr(k) for k in shown)
    if more:
        names += f" and {more} more"
    verb = "was" if len(shown) == 1 else "were"
    yield ValidationError(f"Additional properties are not allowed ({names} {verb} unexpected)")


# The dialect of every step schema (docs/contract.md#in-out-and-schema), with the keywords whose own
# messages would quote a whole value replaced by the bounded ones above.
BoundedValidator = extend(
    jsonschema.Draft202012Validator,
    {
        "type": _type,
        "enum": _enum,
        "items": _items,
        "properties": _properties,
        "additionalProperties": _additional_properties,
    },
)


def _path(error: ValidationError) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)


def cut(text: str, limit: int = MAX_REASON_BYTES) -> str:
    """``text`` in at most ``limit`` bytes of UTF-8: cut, and ending in ``...`` when it was longer."""
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= limit:
        return text
    head = encoded[: limit - len(_ELLIPSIS)].decode("utf-8", "ignore")
    return head + _ELLIPSIS


def schema_violation(schema: dict[str, Any], doc: Any, what: str) -> str | None:
    """``schema violation: <path>: <message>`` for each of the first ``MAX_ERRORS`` errors jsonschema
    finds (``; and more`` when there is another), at most ``MAX_REASON_BYTES``; None when ``doc``
    satisfies ``schema``. Looks for one error past those it names, and never for more.
    ``PayloadTooLarge`` naming ``what`` (the artifact, the answer) when checking ``doc`` would
    take more than ``MAX_CHECKS`` checks."""
    token = _CHECKS.set(_Checks(MAX_CHECKS))
    try:
        _charge()  # the document itself
        errors = list(islice(BoundedValidator(schema).iter_errors(doc), MAX_ERRORS + 1))
    except TooMuchToValidate:
        raise PayloadTooLarge(
            f"{what} is too large to validate against its schema: more than {MAX_CHECKS} checks "
            "(values looked at, properties looked up, enum comparisons); nothing was stored"
        ) from None
    finally:
        _CHECKS.reset(token)
    if not errors:
        return None
    parts = [f"{_path(e)}: {e.message}" for e in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        parts.append("and more")
    return cut("schema violation: " + "; ".join(parts))
