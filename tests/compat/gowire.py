"""Reading answers the way the original fleet's Go code reads them, and writing requests the way it
writes them.

``encoding/json`` is forgiving in some ways and strict in others, and the original clients'
behaviour hangs on both: a missing field silently becomes its zero value, ``null`` into a value
leaves the zero value, an unknown field is ignored, a key matches its field case-insensitively
when no exact key exists; but a value of the wrong JSON type (a number where a string is expected,
``1.5`` or ``true`` where an int is expected, a string that is not RFC 3339 where a ``time.Time``
is expected) fails the whole decode, and the client then drops the answer. :func:`decode` does the
same for a Go type described with the small classes below, so a test can assert both "this decodes
at all" and "this is what the client sees".

:func:`go_marshal` writes a body the way ``json.Marshal`` does: compact, ``<``, ``>`` and ``&``
escaped, fields in the order given (callers build dicts in the Go struct's field order and sort
map keys themselves, as Go does).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# RFC 3339 as Go's time.Time.UnmarshalJSON accepts it (fractional seconds optional).
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")


class GoDecodeError(AssertionError):
    """The Go client would fail to decode this answer (and would drop it)."""


class GoType:
    def decode(self, value: Any, path: str) -> Any:
        raise NotImplementedError

    def zero(self) -> Any:
        raise NotImplementedError


class Str(GoType):
    def decode(self, value: Any, path: str) -> Any:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise GoDecodeError(f"{path}: cannot unmarshal {_kind(value)} into Go string")
        return value

    def zero(self) -> Any:
        return ""


class Int(GoType):
    def decode(self, value: Any, path: str) -> Any:
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, int):
            raise GoDecodeError(f"{path}: cannot unmarshal {_kind(value)} into Go int")
        return value

    def zero(self) -> Any:
        return 0


class Bool(GoType):
    def decode(self, value: Any, path: str) -> Any:
        if value is None:
            return False
        if not isinstance(value, bool):
            raise GoDecodeError(f"{path}: cannot unmarshal {_kind(value)} into Go bool")
        return value

    def zero(self) -> Any:
        return False


class Time(GoType):
    """``time.Time`` (zero value: None here) or ``*time.Time`` (nil: None)."""

    def decode(self, value: Any, path: str) -> Any:
        if value is None:
            return None
        if not isinstance(value, str) or not _RFC3339.fullmatch(value):
            raise GoDecodeError(f"{path}: {value!r} is not an RFC 3339 time")
        return datetime.fromisoformat(value.replace("Z", "+00:00"))

    def zero(self) -> Any:
        return None


class Raw(GoType):
    """``json.RawMessage``: the value's JSON text as sent (``"null"`` for null), ``""`` when the
    key is absent — Go code tests ``len(raw) > 0`` to tell "sent" from "not sent"."""

    def decode(self, value: Any, path: str) -> Any:
        return json.dumps(value)

    def zero(self) -> Any:
        return ""


@dataclass
class Slice(GoType):
    elem: GoType

    def decode(self, value: Any, path: str) -> Any:
        if value is None:
            return None  # a nil slice
        if not isinstance(value, list):
            raise GoDecodeError(f"{path}: cannot unmarshal {_kind(value)} into Go slice")
        return [self.elem.decode(v, f"{path}[{i}]") for i, v in enumerate(value)]

    def zero(self) -> Any:
        return None


@dataclass
class Map(GoType):
    elem: GoType

    def decode(self, value: Any, path: str) -> Any:
        if value is None:
            return None  # a nil map
        if not isinstance(value, dict):
            raise GoDecodeError(f"{path}: cannot unmarshal {_kind(value)} into Go map")
        return {k: self.elem.decode(v, f"{path}.{k}") for k, v in value.items()}

    def zero(self) -> Any:
        return None


@dataclass
class Ptr(GoType):
    """``*T``: None when absent or null."""

    elem: GoType

    def decode(self, value: Any, path: str) -> Any:
        if value is None:
            return None
        return self.elem.decode(value, path)

    def zero(self) -> Any:
        return None


@dataclass
class Struct(GoType):
    """A Go struct: JSON field name -> type. Decodes to a dict holding every field (zero values
    for the missing ones), like the Go value the client works with."""

    fields: dict[str, GoType] = field(default_factory=dict)

    def decode(self, value: Any, path: str) -> Any:
        if value is None:
            return self.zero()
        if not isinstance(value, dict):
            raise GoDecodeError(f"{path or '$'}: cannot unmarshal {_kind(value)} into Go struct")
        out = {}
        for name, typ in self.fields.items():
            key = _match_key(value, name)
            sub = f"{path}.{name}" if path else name
            out[name] = typ.zero() if key is None else typ.decode(value[key], sub)
        return out

    def zero(self) -> Any:
        return {name: typ.zero() for name, typ in self.fields.items()}


def _match_key(obj: dict[str, Any], name: str) -> str | None:
    """encoding/json: the exact key if present, else one that matches case-insensitively."""
    if name in obj:
        return name
    for key in obj:
        if key.casefold() == name.casefold():
            return key
    return None


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def decode(typ: GoType, body: bytes | str) -> Any:
    """``json.NewDecoder(resp.Body).Decode(&v)`` for a value of ``typ``."""
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise GoDecodeError(f"not JSON: {exc}") from None
    return typ.decode(value, "")


def decode_value(typ: GoType, value: Any) -> Any:
    """:func:`decode` of a value already parsed from JSON (a field of a parsed body)."""
    return typ.decode(value, "")


def go_marshal(value: Any) -> bytes:
    """``json.Marshal``: compact, with ``<``, ``>``, ``&`` escaped as Go escapes them."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    # These characters only ever occur inside strings in JSON text, so a plain replace is exact.
    for ch, esc in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e")):
        text = text.replace(ch, esc)
    return text.encode("utf-8")


def go_time(dt: datetime) -> str:
    """A ``time.Time`` as ``json.Marshal`` writes it (RFC 3339 with nanoseconds, UTC ``Z``)."""
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{dt.microsecond:06d}000Z"


# ------------------------------------------------------------------- the original's Go types

# internal/enode/advertise.go: Lease and AdvertResponse
LEASE = Struct(
    {
        "run_id": Str(),
        "node": Str(),
        "capability": Str(),
        "not_after": Time(),
        "nonce": Str(),
    }
)
ADVERT_RESPONSE = Struct({"leases": Slice(LEASE), "renew_seconds": Int(), "drain": Str()})

# internal/enode/claim.go: Step (the claim body), the fields the agent acts on
CLAIMED_STEP = Struct(
    {
        "step_id": Str(),
        "run_id": Str(),
        "seq": Int(),
        "name": Str(),
        "uses": Str(),
        "kind": Str(),
        "agent": Raw(),
        "run": Slice(Str()),
        "env": Slice(Str()),
        "collect": Map(Str()),
        "check_changed": Slice(Str()),
        "workspace": Raw(),
        "in": Struct({"prompt": Str(), "from": Slice(Str())}),
        "out": Slice(Str()),
        "schema": Map(Raw()),
        "roles": Slice(Str()),
        "role_attrs": Map(Map(Str())),
        "goal": Str(),
        "expands": Bool(),
        "envelope_key": Str(),
        "attempt": Int(),
        "requester": Str(),
        "feedback": Slice(Str()),
        "ledger": Raw(),
        "lease": LEASE,
        "effect": Str(),
        "budget": Ptr(Struct({"finalize": Str(), "upload": Str()})),
        "discover": Bool(),
    }
)

# internal/enode/workspace.go: WorkspaceSpec, parsed from the claim's raw workspace
WORKSPACE_SPEC = Struct({"repo": Str()})

# The ledger listing a claim carries for see.ledger "list": the original's entry shape
# (its server's store.LedgerEntry, which the agent writes verbatim to $IN/_ledger.json).
LEDGER_ENTRY = Struct(
    {
        "run_id": Str(),
        "seq": Int(),
        "attempt": Int(),
        "name": Str(),
        "by": Str(),
        "at": Time(),
        "bytes": Int(),
        "schema_ok": Ptr(Bool()),
    }
)
LEDGER_ENTRY_KEYS = frozenset(LEDGER_ENTRY.fields)
LEDGER_ENTRY_REQUIRED = frozenset({"seq", "attempt", "name", "by", "at", "bytes"})

# internal/runctl/client.go: Run, Step, Assigned
RUN_STEP = Struct(
    {
        "seq": Int(),
        "id": Str(),
        "state": Str(),
        "uses": Str(),
        "node": Str(),
        "needs": Slice(Str()),
        "attempt": Int(),
        "chosen": Bool(),
        "started_at": Ptr(Time()),
    }
)
ASSIGNED = Struct(
    {"as": Str(), "nodes": Slice(Struct({"node": Str(), "label": Str()}))},
)
RUN = Struct(
    {
        "run_id": Str(),
        "state": Str(),
        "assigned": Slice(ASSIGNED),
        "verdict": Raw(),
        "requires": Raw(),
        "steps": Slice(RUN_STEP),
        "warnings": Slice(Str()),
    }
)
# cmd/runctl/main.go (printRun) reads the verdict this way
VERDICT = Struct(
    {
        "state": Str(),
        "checks": Slice(
            Struct({"step": Str(), "what": Str(), "ok": Bool(), "note": Str()}),
        ),
    }
)

# internal/runctl/client.go: AskItem and ShownArtifact, inside {"asks": [...]}
SHOWN = Struct({"name": Str(), "content": Raw(), "truncated": Bool()})
ASK_ITEM = Struct(
    {
        "run_id": Str(),
        "seq": Int(),
        "step": Str(),
        "prompt": Str(),
        "schema": Raw(),
        "answerers": Slice(Str()),
        "deadline": Ptr(Time()),
        "can_answer": Bool(),
        "shown": Slice(SHOWN),
        "proposes": Raw(),
    }
)
ASKS = Struct({"asks": Slice(ASK_ITEM)})

# internal/runctl/client.go: Capability, inside {"capabilities": [...]}
CAPABILITIES = Struct(
    {
        "capabilities": Slice(
            Struct({"capability": Str(), "nodes": Int(), "attrs": Map(Slice(Str()))})
        )
    }
)

# internal/runctl/client.go (Client.do): the error body of every non-2xx answer
FAIL = Struct({"error": Struct({"code": Int(), "reason": Str()})})

# GET /v1/runs as its consumers of the raw body read it (the original's RunRow)
RUN_ROW = Struct(
    {
        "run_id": Str(),
        "state": Str(),
        "verdict": Raw(),
        "work_id": Str(),
        "created_at": Time(),
        "ended_at": Ptr(Time()),
    }
)
RUNS = Struct({"observed_at": Time(), "runs": Slice(RUN_ROW)})

# GET /v1/runs/{id}/ledger: {"entries": [LedgerEntry]}
LEDGER = Struct({"entries": Slice(LEDGER_ENTRY)})
