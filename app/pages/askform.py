"""An ask's answer form, made from the ask's JSON schema (docs/pages.md#asks-asks), and the answer
read back from what the browser sent. Pure: plain data in, plain data out.

enum: one submit button per value (the button's ``value`` is the value; a second enum of the same
object becomes a choice list); boolean: a checkbox, unchecked sends false; number and integer: a
number input; string: a text input; an object's properties: one field each, labelled by ``title``,
else the property's name, with ``description`` as help. Empty optional fields are left out.
Anything else: a JSON text area, validated by the same schema as every answer. So is an object
with a property named like a field the form sends for itself (its CSRF token): each input carries
its property's name, and the two would share one, storing the token in the answer. Contracts
are refused such names (``FORM_FIELD_NAMES``); asks submitted before that still answer safely.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.contract.fields import parse_json
from app.contract.steps import FORM_FIELD_NAMES
from app.errors import BadRequest

TOP = "answer"  # the one field's name when the answer is not an object of properties
SCALARS = ("boolean", "integer", "number", "string")
_INTEGER = re.compile(r"\A[+-]?[0-9]{1,18}\Z")
_PROPERTY_PATH = re.compile(r"\Aschema violation: \$\.([^.\[:]+)")
_REQUIRED = re.compile(r"\Aschema violation: \$: '([^']+)' is a required property")


@dataclass(frozen=True)
class Field:
    """One input of the form: ``kind`` is enum (buttons), select, boolean, integer, number,
    string or json."""

    name: str
    label: str
    kind: str
    help: str | None = None
    required: bool = False
    options: tuple[tuple[str, Any], ...] = ()  # (the text sent, the JSON value)


@dataclass(frozen=True)
class AskForm:
    fields: tuple[Field, ...]
    whole: bool  # the answer is the one field's value, not an object of the fields

    @property
    def buttons(self) -> Field | None:
        """The field whose values are the form's submit buttons, if any."""
        return next((f for f in self.fields if f.kind == "enum"), None)


@dataclass
class Reading:
    """What the browser sent, read back: the answer, or the errors by field name (``""``: the
    form as a whole), and the texts as typed, to show again."""

    value: Any = None
    errors: dict[str, str] = field(default_factory=dict)
    typed: dict[str, str] = field(default_factory=dict)


def option_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _kind(schema: Any) -> str:
    if not isinstance(schema, Mapping):
        return "json"
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(not isinstance(v, (dict, list)) for v in enum):
        return "enum"
    kind = schema.get("type")
    return kind if kind in SCALARS else "json"


def _field(name: str, schema: Any, *, required: bool, default_label: str) -> Field:
    sub = schema if isinstance(schema, Mapping) else {}
    kind = _kind(sub)
    title, description = sub.get("title"), sub.get("description")
    return Field(
        name=name,
        label=title if isinstance(title, str) and title else default_label,
        kind=kind,
        help=description if isinstance(description, str) and description else None,
        required=required,
        options=tuple((option_text(v), v) for v in sub["enum"]) if kind == "enum" else (),
    )


def form_of(schema: Any) -> AskForm:
    """The form for an ask's schema (None: any JSON value)."""
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    if (
        isinstance(schema, Mapping)
        and schema.get("type") == "object"
        and isinstance(props, Mapping)
        and props
        and not FORM_FIELD_NAMES.intersection(props)
    ):
        required = schema.get("required")
        needed = set(required) if isinstance(required, list) else set()
        fields = []
        buttons = False
        for name, sub in props.items():
            f = _field(name, sub, required=name in needed, default_label=name)
            if f.kind == "enum":
                if buttons:  # one set of submit buttons per form: the others are choice lists
                    f = Field(f.name, f.label, "select", f.help, f.required, f.options)
                buttons = True
            fields.append(f)
        return AskForm(tuple(fields), whole=False)
    return AskForm((_field(TOP, schema, required=True, default_label="Answer"),), whole=True)


def _read(f: Field, text: str | None) -> tuple[bool, Any, str | None]:
    """(whether the field gives a value, the value, an error)."""
    if f.kind == "boolean":
        return True, text == "true", None  # an unchecked box sends nothing: false
    text = text or ""
    if f.kind == "string":
        return (bool(text) or f.required), text, None
    if not text.strip():
        return False, None, None  # left out; a required one is named by the schema
    if f.kind in ("enum", "select"):
        for sent, value in f.options:
            if sent == text:
                return True, value, None
        return False, None, "choose one of the offered values"
    if f.kind == "integer":
        if _INTEGER.match(text.strip()):
            return True, int(text.strip()), None
        return False, None, "not a whole number"
    if f.kind == "number":
        try:
            value = parse_json(text.strip())
        except BadRequest:
            value = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, value, None
        return False, None, "not a number"
    try:
        # The API's own strict, depth-bounded parse: no NaN, no nesting past the bound.
        return True, parse_json(text, f.name), None
    except BadRequest as exc:
        return False, None, f"not JSON: {exc.reason}"


def read_answer(form: AskForm, sent: Mapping[str, str]) -> Reading:
    """The answer a form's fields make: an object of the given fields, or the one field's value."""
    reading = Reading()
    answer: dict[str, Any] = {}
    for f in form.fields:
        text = sent.get(f.name)
        if text is not None:
            reading.typed[f.name] = text
        given, value, error = _read(f, text)
        if error:
            reading.errors[f.name] = error
        elif given:
            answer[f.name] = value
    if form.whole:
        only = form.fields[0]
        if only.name not in answer and only.name not in reading.errors:
            reading.errors[only.name] = "an answer is needed"
        reading.value = answer.get(only.name)
    else:
        reading.value = answer
    return reading


def field_of_violation(form: AskForm, reason: str) -> str:
    """The field a schema violation's reason is about (``""``: the form as a whole)."""
    names = {f.name for f in form.fields}
    if form.whole:
        return TOP
    for pattern in (_PROPERTY_PATH, _REQUIRED):
        m = pattern.match(reason)
        if m and m.group(1) in names:
            return m.group(1)
    return ""
