"""Validation and needs normalisation of a submitted contract (SPEC §3).

Pure: plain data in, a :class:`~app.contract.types.Contract` out, no session and no I/O.
Rules run in one fixed order and the first failure wins (SPEC §3); every failure is
``BadRequest`` with a reason that names the field and quotes the offending value with
``json.dumps``. No other exception may escape for any JSON-like input (SPEC §13: bad input is a
4xx, never a 500), so every value is type-checked before it is used and nesting is bounded
before anything walks the document.

Order of the rules:
 1. the document is an object; 2. nesting depth; 3. unknown top-level fields; 4. ``run_id``;
 5. ``work``; 6. ``requires``; 7. each step's own fields, step by step; 8. cross-step references
 (roles, needs, branch targets, loops, validators, artifacts), rule by rule;
 9. ``release`` placement;
 10. ``success_when``; 11. ``ledger``; 12. ``queue``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import jsonschema
from jsonschema.exceptions import SchemaError

from app.contract.types import Contract, Role, StepDef
from app.errors import BadRequest

MAX_DEPTH = 32
MAX_REQUIRES = 50  # SPEC §13
MAX_STEPS = 500  # SPEC §13
MAX_CONDITIONS = 500  # success_when is bounded like steps: one condition per step is plenty
MAX_NAME = 200  # ids and names (SPEC §13)
MAX_ATTR_BYTES = 1024  # attribute values (SPEC §13)
MAX_INT = 2**31 - 1  # every integer must fit a PostgreSQL integer and a timedelta
MIN_INT = -(2**31)

KINDS = ("run", "agent", "ask", "acquire")
_TOP_KEYS = frozenset(
    {"run_id", "work", "requires", "steps", "success_when", "ledger", "queue", "lease"}
)
_STEP_KEYS = frozenset(
    {
        "id",
        "uses",
        "needs",
        "in",
        "out",
        "schema",
        "env",
        "workspace",
        "collect",
        "release",
        "dispatch",
        "loop",
        "validate_with",
        "max_attempts",
        *KINDS,
    }
)
# Fields a kind cannot act on. Ask and acquire steps run on no node (SPEC §3: "uses" must be
# absent), so node-side fields would be silently ignored; an acquire step produces only its own
# state blob.
_NOT_FOR_KIND: dict[str, tuple[str, ...]] = {
    "run": (),
    "agent": (),
    "ask": ("uses", "env", "workspace", "collect"),
    "acquire": (
        "uses",
        "in",
        "out",
        "schema",
        "env",
        "workspace",
        "collect",
        "dispatch",
        "loop",
        "validate_with",
        "max_attempts",
    ),
}
_AGENT_KEYS = frozenset({"model", "max_turns", "max_tokens", "ask", "harness", "mcp", "pack"})
_ASK_KEYS = frozenset({"prompt", "answerers", "timeout", "show"})
_ACQUIRE_KEYS = frozenset({"want", "acquired", "unavailable"})
_SCHEMA_KEYWORDS = frozenset(
    {
        "type",
        "required",
        "properties",
        "enum",
        "items",
        "additionalProperties",
        "title",
        "description",
    }
)
_PRIMITIVE_TYPES = frozenset({"string", "number", "integer", "boolean", "null"})
_ROLE_FIELDS = ("as", "capability", "count")

_NAME_RE = re.compile(r"[A-Za-z0-9._:@-]{1,200}")
_CAPABILITY_RE = re.compile(r"[a-z][a-z0-9._-]{0,199}")
_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")
_DURATION_RE = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
_DURATION_UNITS = (86400, 3600, 60, 1)

_NAME_RULE = "1-200 characters of [A-Za-z0-9._:@-]"
_DURATION_RULE = 'a duration like "30m" or "4h"'


# ---------------------------------------------------------------------------------------- public


def validate_contract(doc: object, *, capabilities: Collection[str] = ()) -> Contract:
    """Validate a submitted contract and return its normalised form, or raise ``BadRequest``.

    ``capabilities`` is the configured ``contract.capabilities`` list; when non-empty, any other
    capability name is 400 ``unknown capability: "x"`` (SPEC §3: catches typos).
    """
    if not isinstance(doc, dict):
        _fail("contract must be a JSON object")
    check_json_depth(doc)
    for key in doc:
        if key not in _TOP_KEYS:
            # SPEC §3 keeps the format open for later fields, so we are strict now: a field we do
            # not know is a typo or a feature this server lacks; silently ignoring either is worse.
            _fail(f"unknown field {_q(key)}")
    # Work on a private copy so the Contract owns its data and the caller's dict cannot change it.
    document = copy.deepcopy({k: v for k, v in doc.items() if k != "lease"})
    known = frozenset(capabilities)

    run_id = _parse_run_id(document)
    work_id = _parse_work(document)
    roles = _parse_requires(document, known)
    drafts = _parse_steps(document, roles, known)
    by_id = {d.id: d for d in drafts}
    _check_references(drafts, by_id, roles)
    needs = _normalise_needs(drafts, by_id)
    _check_releases(drafts, by_id, needs)
    conditions = _parse_success_when(document, by_id, known)
    ledger_scope = _parse_ledger(document)
    queue_timeout = _parse_queue(document)
    check_no_nul(document)  # last: the rules above name NUL in the fields they know

    steps = tuple(
        StepDef(
            seq=d.seq,
            id=d.id,
            kind=d.kind,
            uses=d.uses,
            needs=needs[d.seq],
            spec=d.spec,
        )
        for d in drafts
    )
    return Contract(
        run_id=run_id,
        work_id=work_id,
        requires=roles,
        steps=steps,
        success_when=conditions,
        ledger_scope=ledger_scope,
        queue_timeout_seconds=queue_timeout,
        warnings=_collect_warnings(doc, roles, drafts),
        document=document,
        requires_key=requires_key(roles),
    )


def parse_duration(text: str) -> int:
    """Seconds in ``"30s"``, ``"30m"``, ``"4h"``, ``"2d"`` or a combination such as ``"1h30m"``.

    Units come largest first, each at most once; anything else raises ``ValueError``. The total is
    capped so it fits a PostgreSQL integer (a duration ends up in a deadline column).
    """
    if not isinstance(text, str) or not text or len(text) > 64:
        raise ValueError(f"not a duration: {_q(text)}")
    match = _DURATION_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a duration: {_q(text)}")
    total = sum(int(g) * unit for g, unit in zip(match.groups(), _DURATION_UNITS, strict=True) if g)
    if total > MAX_INT:
        raise ValueError(f"duration too long: {_q(text)}")
    return total


def requires_key(roles: Iterable[Role]) -> str:
    """The queue's shape key of a run's normalised ``requires`` (SPEC §7).

    sha256 hex of the canonical JSON (sorted keys, no spaces) of ``[[name, capability, count,
    sorted attrs], ...]`` in contract order; the order of attributes in the document cannot
    change it.
    """
    shape = [[role.name, role.capability, role.count, sorted(role.attrs.items())] for role in roles]
    canonical = json.dumps(shape, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class _NotJSON(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJSON(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotJSON(f"the number {text[:40]} is too large")
    return value


def parse_json(raw: bytes | str, what: str = "body") -> Any:
    """Strict JSON (RFC 8259): no ``NaN``/``Infinity``, no number too large for a double — none of
    them can be stored or compared — and no nesting past the bound; else ``BadRequest`` naming
    ``what`` (SPEC §2, §13: a 400, never a 500)."""
    try:
        doc = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise BadRequest(f"JSON nesting deeper than {MAX_DEPTH}") from None
    except _NotJSON as exc:
        raise BadRequest(f"{what}: {exc}") from None
    except ValueError:
        raise BadRequest(f"{what} is not valid JSON") from None
    check_json_depth(doc)
    return doc


def check_json_depth(obj: object, max_depth: int = MAX_DEPTH) -> None:
    """Raise ``BadRequest`` when objects/arrays nest deeper than ``max_depth`` (SPEC §13).

    Iterative on purpose: a recursive walk is exactly what a hostile document would overflow.
    The outermost container is depth 1.
    """
    stack: list[tuple[object, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Iterable[object] = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            raise BadRequest(f"JSON nesting deeper than {max_depth}")
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def check_no_nul(obj: object) -> None:
    """Raise ``BadRequest`` naming the field when a key or string holds a NUL character, which
    no PostgreSQL text or jsonb value can store (SPEC §13: a 4xx, never a 500). Iterative, like
    :func:`check_json_depth`, which bounds the depth first."""
    stack: list[tuple[object, str]] = [(obj, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                raise BadRequest(f"{path or 'body'}: a string may not contain a NUL character")
        elif isinstance(node, dict):
            for key, child in node.items():
                if "\x00" in key:
                    raise BadRequest(f"{path or 'body'}: a key may not contain a NUL character")
                stack.append((child, f"{path}.{key}" if path else key))
        elif isinstance(node, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node))


def parse_requirement(
    obj: object,
    path: str = "requirement",
    *,
    capabilities: Collection[str] = (),
    need_as: bool = True,
) -> Role:
    """A requirement (a ``requires`` entry, an acquire's ``want``, a ``fleet_has``) as a Role.

    Public so the acquire step and the verdict can read the flat wire form the same way.
    """
    return _parse_requirement(obj, path, frozenset(capabilities), need_as=need_as)


# ------------------------------------------------------------------------------------- helpers


def _fail(reason: str) -> NoReturn:
    raise BadRequest(reason)


def _q(value: object) -> str:
    """JSON-quote an offending value for a reason, shortened so error bodies stay bounded."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _is_name(value: object) -> bool:
    return isinstance(value, str) and _NAME_RE.fullmatch(value) is not None


def is_valid_id(value: str) -> bool:
    """A run_id or node_id of SPEC §3 (1-200 of ``[A-Za-z0-9._:@-]``). An id from a URL that is
    not one names nothing; a NUL byte would even be refused by PostgreSQL."""
    return _is_name(value)


def _check_int(value: object, path: str, minimum: int = MIN_INT) -> int:
    # A bool is never an integer here, although Python says it is (true would read as count 1).
    if not isinstance(value, int) or isinstance(value, bool):
        what = "an integer" if minimum == MIN_INT else f"an integer >= {minimum}"
        _fail(f"{path} must be {what}, got {_q(value)}")
    if value < minimum:
        _fail(f"{path} must be an integer >= {minimum}, got {_q(value)}")
    if value > MAX_INT:
        _fail(f"{path} must be at most {MAX_INT}, got {_q(value)}")
    return value


def _check_dict(value: object, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        _fail(f"{path} must be an object, got {_q(value)}")
    return value


def _check_keys(obj: dict[str, Any], allowed: Collection[str], where: str) -> None:
    for key in obj:
        if key not in allowed:
            _fail(f"{where}unknown field {_q(key)}")


def _check_str_list(value: object, path: str, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        _fail(f"{path} must be a list of {what}, got {_q(value)}")
    return value


def _check_name_list(value: object, path: str, what: str) -> list[str]:
    names = _check_str_list(value, path, what)
    for i, name in enumerate(names):
        if not _is_name(name):
            _fail(f"{path}[{i}] must be {_NAME_RULE}, got {_q(name)}")
    return names


def _is_artifact_name(name: object) -> bool:
    # Artifact names become file names in the Record: they must not escape its directory (SPEC §13),
    # and names starting with "_" are the Mediator's own (SPEC §3).
    return (
        isinstance(name, str)
        and 1 <= len(name) <= MAX_NAME
        and not name.startswith("_")
        and not any(c in name for c in "/\\\x00")
        and name.strip(".") != ""
    )


def _check_artifact_names(value: object, path: str) -> list[str]:
    names = _check_str_list(value, path, "artifact names")
    for i, name in enumerate(names):
        if not _is_artifact_name(name):
            _fail(
                f"{path}[{i}] must be an artifact name (1-200 characters, not starting with "
                f'"_", no "/", "\\" or NUL, not only dots), got {_q(name)}'
            )
    return names


def _check_duration(value: object, path: str) -> int:
    try:
        seconds = parse_duration(value)  # type: ignore[arg-type]
    except ValueError:
        seconds = 0
    if seconds <= 0:  # a zero timeout would fail the run or the ask at once
        _fail(f"{path} must be {_DURATION_RULE}, got {_q(value)}")
    return seconds


def _subpath(path: str, key: str) -> str:
    return f"{path}.{key}" if _NAME_RE.fullmatch(key) else f"{path}[{_q(key)}]"


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


# ------------------------------------------------------------------------------ top-level fields


def _parse_run_id(doc: dict[str, Any]) -> str:
    if "run_id" not in doc:
        _fail("run_id is required")
    run_id = doc["run_id"]
    if not _is_name(run_id):
        _fail(f"run_id must be {_NAME_RULE}, got {_q(run_id)}")
    return run_id


def _check_work_string(value: object, path: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME:
        _fail(f"{path} must be a string of 1-200 characters, got {_q(value)}")
    return value


def _parse_work(doc: dict[str, Any]) -> str:
    """SPEC §3: work key = ``id.system:id.change_id``, else ``system:change_id``, else empty."""
    if "work" not in doc:
        return ""
    work = _check_dict(doc["work"], "work")
    _check_keys(work, ("id", "system", "change_id"), "work: ")
    top = {
        k: _check_work_string(work[k], f"work.{k}") for k in ("system", "change_id") if k in work
    }
    if "id" in work:
        ident = _check_dict(work["id"], "work.id")
        _check_keys(ident, ("system", "change_id"), "work.id: ")
        inner = {k: _check_work_string(v, f"work.id.{k}") for k, v in ident.items()}
        if len(inner) == 2:
            return f"{inner['system']}:{inner['change_id']}"
    if len(top) == 2:
        return f"{top['system']}:{top['change_id']}"
    return ""


def _parse_requirement(
    obj: object, path: str, known: frozenset[str], *, need_as: bool = True
) -> Role:
    """One flat requirement object: ``as``, ``capability``, ``count`` and string attributes."""
    req = _check_dict(obj, path)
    name = ""
    if "as" in req:
        name = req["as"]
        if not _is_name(name):
            _fail(f"{path}.as must be {_NAME_RULE}, got {_q(name)}")
    elif need_as:
        _fail(f"{path}.as is required")
    if "capability" not in req:
        _fail(f"{path}.capability is required")
    capability = req["capability"]
    if not isinstance(capability, str) or _CAPABILITY_RE.fullmatch(capability) is None:
        _fail(
            f"{path}.capability must match [a-z][a-z0-9._-]* (at most 200 characters), "
            f"got {_q(capability)}"
        )
    if known and capability not in known:
        _fail(f"unknown capability: {_q(capability)}")
    count = _check_int(req.get("count", 1), f"{path}.count", 1)
    attrs: dict[str, str] = {}
    for key, value in req.items():
        if key in _ROLE_FIELDS:
            continue
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_NAME:
            _fail(f"{path}: attribute names must be 1-200 characters, got {_q(key)}")
        if not isinstance(value, str) or _utf8_len(value) > MAX_ATTR_BYTES:
            _fail(f"{_subpath(path, key)} must be a string of at most 1024 bytes, got {_q(value)}")
        attrs[key] = value
    return Role(name=name, capability=capability, count=count, attrs=attrs)


def _parse_requires(doc: dict[str, Any], known: frozenset[str]) -> tuple[Role, ...]:
    if "requires" not in doc:
        _fail("requires is required")
    entries = doc["requires"]
    if not isinstance(entries, list) or not entries:
        _fail(f"requires must be a non-empty list, got {_q(entries)}")
    if len(entries) > MAX_REQUIRES:
        _fail(f"requires must have at most {MAX_REQUIRES} entries, got {len(entries)}")
    roles: list[Role] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        role = _parse_requirement(entry, f"requires[{i}]", known)
        if role.name in seen:
            _fail(f"requires[{i}].as: duplicate role {_q(role.name)}")
        seen.add(role.name)
        roles.append(role)
    return tuple(roles)


def _parse_ledger(doc: dict[str, Any]) -> str:
    if "ledger" not in doc:
        return "run"
    ledger = _check_dict(doc["ledger"], "ledger")
    _check_keys(ledger, ("scope",), "ledger: ")
    scope = ledger.get("scope", "run")
    if scope not in ("run", "work"):
        _fail(f'ledger.scope must be "run" or "work", got {_q(scope)}')
    return scope


def _parse_queue(doc: dict[str, Any]) -> int | None:
    if "queue" not in doc:
        return None
    queue = _check_dict(doc["queue"], "queue")
    _check_keys(queue, ("timeout",), "queue: ")
    if "timeout" not in queue:
        return None
    return _check_duration(queue["timeout"], "queue.timeout")


# ------------------------------------------------------------------------------------ one step


@dataclass
class _Draft:
    """What validation learns about one step on the way; only the Contract leaves this module."""

    seq: int
    id: str
    kind: str
    spec: dict[str, Any]
    uses: str | None = None
    needs: list[str] | None = None  # None: absent, so the SPEC §3 default applies
    out: list[str] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)  # in.from and ask.show
    release: list[str] = field(default_factory=list)
    acquire_as: str | None = None
    acquire_targets: tuple[str, str] | None = None  # (acquired, unavailable)
    dispatch_to: list[str] = field(default_factory=list)
    loop_back_to: str | None = None
    validate_with: str | None = None


def _parse_steps(
    doc: dict[str, Any], roles: tuple[Role, ...], known: frozenset[str]
) -> list[_Draft]:
    if "steps" not in doc:
        _fail("steps is required")
    entries = doc["steps"]
    if not isinstance(entries, list) or not entries:
        _fail(f"steps must be a non-empty list, got {_q(entries)}")
    if len(entries) > MAX_STEPS:
        _fail(f"steps must have at most {MAX_STEPS} entries, got {len(entries)}")
    declared = {r.name for r in roles}
    acquired: dict[str, str] = {}  # role name -> id of the step that acquires it
    drafts: list[_Draft] = []
    seen: set[str] = set()
    for index, raw in enumerate(entries):
        draft = _parse_step(index, raw, seen, known)
        if draft.acquire_as is not None:
            if draft.acquire_as in declared:
                _fail(
                    f"step {_q(draft.id)} acquires role {_q(draft.acquire_as)} "
                    "that requires already declares"
                )
            if draft.acquire_as in acquired:
                _fail(
                    f"step {_q(draft.id)} acquires role {_q(draft.acquire_as)} "
                    f"that step {_q(acquired[draft.acquire_as])} already acquires"
                )
            acquired[draft.acquire_as] = draft.id
        seen.add(draft.id)
        drafts.append(draft)
    return drafts


def _parse_step(index: int, raw: object, seen: set[str], known: frozenset[str]) -> _Draft:
    path = f"steps[{index}]"
    step = _check_dict(raw, path)
    if "id" not in step:
        _fail(f"{path}.id is required")
    sid = step["id"]
    if not _is_name(sid):
        _fail(f"{path}.id must be {_NAME_RULE}, got {_q(sid)}")
    if sid in seen:
        _fail(f"{path}.id: duplicate step id {_q(sid)}")
    _check_keys(step, _STEP_KEYS, f"step {_q(sid)}: ")
    kind = _step_kind(step, sid)
    for key in _NOT_FOR_KIND[kind]:
        if key in step:
            _fail(f"step {_q(sid)}: {_a(kind)} step takes no {_q(key)}")
    draft = _Draft(seq=index + 1, id=sid, kind=kind, spec=step)
    _parse_kind_body(draft, path, known)
    _parse_uses(draft, path)
    if "needs" in step:
        draft.needs = _check_name_list(step["needs"], f"{path}.needs", "step ids")
    _parse_in(draft, path)
    if "out" in step:
        draft.out = _check_artifact_names(step["out"], f"{path}.out")
        if len(set(draft.out)) != len(draft.out):
            dup = next(n for n in draft.out if draft.out.count(n) > 1)
            _fail(f"step {_q(sid)}: out lists {_q(dup)} twice")
    _parse_schema(draft, path)
    _parse_env(draft, path)
    _parse_workspace(draft, path)
    _parse_collect(draft, path)
    if "release" in step:
        draft.release = _check_name_list(step["release"], f"{path}.release", "role names")
    _parse_dispatch(draft, path)
    _parse_loop(draft, path)
    _parse_validate_with(draft, path)
    if kind == "ask":
        _check_ask_out(draft)
    return draft


def _step_kind(step: dict[str, Any], sid: str) -> str:
    kinds = [k for k in KINDS if k in step]
    if len(kinds) == 1:
        return kinds[0]
    if not kinds:
        _fail(f"step {_q(sid)} has no kind: give exactly one of run, agent, ask or acquire")
    listed = ", ".join(_q(k) for k in kinds)
    _fail(
        f"step {_q(sid)} has several kinds ({listed}): "
        "give exactly one of run, agent, ask or acquire"
    )


def _parse_kind_body(draft: _Draft, path: str, known: frozenset[str]) -> None:
    body = draft.spec[draft.kind]
    where = f"{path}.{draft.kind}"
    if draft.kind == "run":
        if not isinstance(body, list) or not body or not all(isinstance(a, str) for a in body):
            _fail(f"{where} must be a non-empty list of strings, got {_q(body)}")
        for i, arg in enumerate(body):
            if "\x00" in arg:  # execve cannot pass it; the node would fail the step anyway
                _fail(f"{where}[{i}] must not contain NUL, got {_q(arg)}")
    elif draft.kind == "agent":
        _parse_agent(_check_dict(body, where), where, draft.id)
    elif draft.kind == "ask":
        draft.reads.extend(_parse_ask(_check_dict(body, where), where, draft.id))
    else:
        _parse_acquire(draft, _check_dict(body, where), where, known)


def _parse_agent(agent: dict[str, Any], where: str, sid: str) -> None:
    _check_keys(agent, _AGENT_KEYS, f"step {_q(sid)}: agent has ")
    for key in ("model", "harness"):
        if key in agent and not isinstance(agent[key], str):
            _fail(f"{where}.{key} must be a string, got {_q(agent[key])}")
    for key in ("max_turns", "max_tokens"):
        if key in agent:
            _check_int(agent[key], f"{where}.{key}", 1)
    if "mcp" in agent:
        _check_str_list(agent["mcp"], f"{where}.mcp", "strings")
    # "ask" and "pack" are the harness's business (SPEC §3 gives them no shape): any JSON value.


def _parse_ask(ask: dict[str, Any], where: str, sid: str) -> list[str]:
    """Check an ask body; return the artifacts it shows to its answerers."""
    _check_keys(ask, _ASK_KEYS, f"step {_q(sid)}: ask has ")
    if "prompt" not in ask:
        _fail(f"{where}.prompt is required")
    if not isinstance(ask["prompt"], str) or not ask["prompt"]:
        _fail(f"{where}.prompt must be a non-empty string, got {_q(ask['prompt'])}")
    if "answerers" in ask:
        answerers = _check_str_list(ask["answerers"], f"{where}.answerers", "principals")
        for i, who in enumerate(answerers):
            if not 1 <= len(who) <= MAX_NAME:
                _fail(f"{where}.answerers[{i}] must be 1-200 characters, got {_q(who)}")
    if "timeout" in ask:
        timeout = _check_dict(ask["timeout"], f"{where}.timeout")
        _check_keys(timeout, ("after", "then"), f"step {_q(sid)}: ask.timeout has ")
        if "after" not in timeout:
            _fail(f"{where}.timeout.after is required")
        _check_duration(timeout["after"], f"{where}.timeout.after")
        if timeout.get("then", "fail") != "fail":
            _fail(f'{where}.timeout.then must be "fail", got {_q(timeout["then"])}')
    if "show" in ask:
        return _check_artifact_names(ask["show"], f"{where}.show")
    return []


def _parse_acquire(
    draft: _Draft, acquire: dict[str, Any], where: str, known: frozenset[str]
) -> None:
    _check_keys(acquire, _ACQUIRE_KEYS, f"step {_q(draft.id)}: acquire has ")
    for key in ("want", "acquired", "unavailable"):
        if key not in acquire:
            _fail(f"{where}.{key} is required")
    want = _parse_requirement(acquire["want"], f"{where}.want", known)
    if want.count != 1:  # SPEC §3: an acquire grabs exactly one more node
        _fail(f"{where}.want.count must be 1, got {_q(want.count)}")
    targets = []
    for key in ("acquired", "unavailable"):
        if not _is_name(acquire[key]):
            _fail(f"{where}.{key} must be a step id, got {_q(acquire[key])}")
        targets.append(acquire[key])
    if targets[0] == targets[1]:  # one target is always SKIPPED (SPEC §8): they cannot be one step
        _fail(
            f"step {_q(draft.id)}: acquire.acquired and acquire.unavailable "
            f"are both {_q(targets[0])}"
        )
    draft.acquire_as = want.name
    draft.acquire_targets = (targets[0], targets[1])


def _parse_uses(draft: _Draft, path: str) -> None:
    if draft.kind not in ("run", "agent"):
        return  # absence already enforced by _NOT_FOR_KIND
    if "uses" not in draft.spec:
        _fail(f"step {_q(draft.id)} has no uses: {_a(draft.kind)} step runs on a role's node")
    uses = draft.spec["uses"]
    if not _is_name(uses):
        _fail(f"{path}.uses must be a role name, got {_q(uses)}")
    draft.uses = uses


def _parse_in(draft: _Draft, path: str) -> None:
    if "in" not in draft.spec:
        return
    inp = _check_dict(draft.spec["in"], f"{path}.in")
    _check_keys(inp, ("prompt", "from"), f"step {_q(draft.id)}: in has ")
    if "prompt" in inp and not isinstance(inp["prompt"], str):
        _fail(f"{path}.in.prompt must be a string, got {_q(inp['prompt'])}")
    if "from" in inp:
        draft.reads.extend(_check_artifact_names(inp["from"], f"{path}.in.from"))


def _parse_schema(draft: _Draft, path: str) -> None:
    if "schema" not in draft.spec:
        return
    schemas = _check_dict(draft.spec["schema"], f"{path}.schema")
    for artifact, schema in schemas.items():
        if artifact not in draft.out:
            _fail(f"step {_q(draft.id)}: schema for {_q(artifact)} which is not in its out")
        where = f"step {_q(draft.id)}: schema for {_q(artifact)}"
        if not isinstance(schema, dict):
            _fail(f"{where} must be an object, got {_q(schema)}")
        _check_schema_keywords(schema, where)
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            _fail(f"{where} is not a valid JSON schema: {_q(exc.message)}")


def _check_schema_keywords(schema: object, where: str) -> None:
    """SPEC §3: only a small keyword set anywhere in a schema (nothing that fetches or runs)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue  # boolean subschemas are fine; a wrong type is check_schema's to report
        for key in node:
            if key not in _SCHEMA_KEYWORDS:
                _fail(f"{where} uses keyword {_q(key)}, which is not allowed")
        props = node.get("properties")
        if isinstance(props, dict):
            stack.extend(props.values())  # property names are data, not keywords
        for key in ("items", "additionalProperties"):
            if key in node:
                stack.append(node[key])


def _check_ask_out(draft: _Draft) -> None:
    """SPEC §3: an ask has exactly one out, and its schema is a flat object a form can render."""
    if len(draft.out) != 1:
        _fail(f"step {_q(draft.id)}: an ask step needs exactly one out, got {_q(draft.out)}")
    schema = draft.spec.get("schema", {}).get(draft.out[0])
    if schema is None:
        return
    where = f"step {_q(draft.id)}: the ask schema for {_q(draft.out[0])}"
    if schema.get("type") != "object" or "items" in schema:
        _fail(f'{where} must be a flat object schema with type "object", got {_q(schema)}')
    for name, prop in (schema.get("properties") or {}).items():
        if not _is_flat_property(prop):
            _fail(f"{where}: property {_q(name)} must have a primitive type or an enum")


def _is_flat_property(prop: object) -> bool:
    if not isinstance(prop, dict) or any(
        k in prop for k in ("properties", "items", "additionalProperties")
    ):
        return False
    if "enum" in prop:
        return True
    kind = prop.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    return bool(kinds) and all(isinstance(k, str) and k in _PRIMITIVE_TYPES for k in kinds)


def _parse_env(draft: _Draft, path: str) -> None:
    if "env" not in draft.spec:
        return
    names = _check_str_list(draft.spec["env"], f"{path}.env", "variable names")
    for i, name in enumerate(names):
        if _ENV_RE.fullmatch(name) is None:
            _fail(
                f"{path}.env[{i}] must be a variable name ([A-Za-z_][A-Za-z0-9_]*), got {_q(name)}"
            )


def _parse_workspace(draft: _Draft, path: str) -> None:
    if "workspace" not in draft.spec:
        return
    ws = _check_dict(draft.spec["workspace"], f"{path}.workspace")
    _check_keys(ws, ("repo", "rev"), f"step {_q(draft.id)}: workspace has ")
    if "repo" not in ws:
        _fail(f"{path}.workspace.repo is required")
    for key in ("repo", "rev"):
        if key in ws and (not isinstance(ws[key], str) or not ws[key]):
            _fail(f"{path}.workspace.{key} must be a non-empty string, got {_q(ws[key])}")


def _parse_collect(draft: _Draft, path: str) -> None:
    if "collect" not in draft.spec:
        return
    collect = _check_dict(draft.spec["collect"], f"{path}.collect")
    for artifact, rel in collect.items():
        if artifact not in draft.out:
            _fail(f"step {_q(draft.id)}: collect for {_q(artifact)} which is not in its out")
        if not _is_relative_path(rel):
            _fail(
                f"step {_q(draft.id)}: collect path for {_q(artifact)} must be relative "
                f'with no ".." component, got {_q(rel)}'
            )


def _is_relative_path(rel: object) -> bool:
    # The node collects inside its workspace; an absolute or ".." path would read outside it.
    if not isinstance(rel, str) or not rel or "\x00" in rel or rel[0] in "/\\":
        return False
    return ".." not in re.split(r"[/\\]", rel)


def _parse_dispatch(draft: _Draft, path: str) -> None:
    if "dispatch" not in draft.spec:
        return
    where = f"{path}.dispatch"
    dispatch = _check_dict(draft.spec["dispatch"], where)
    _check_keys(dispatch, ("from", "to"), f"step {_q(draft.id)}: dispatch has ")
    for key in ("from", "to"):
        if key not in dispatch:
            _fail(f"{where}.{key} is required")
    if not _dispatch_source_ok(dispatch["from"], draft.out):
        _fail(
            f'step {_q(draft.id)}: dispatch.from must be "<out>.<field>[.<field>]" naming one of '
            f"its outs, got {_q(dispatch['from'])}"
        )
    targets = _check_name_list(dispatch["to"], f"{where}.to", "step ids")
    if len(targets) < 2:
        _fail(f"{where}.to must list at least 2 step ids, got {_q(targets)}")
    for target in targets:
        if targets.count(target) > 1:
            _fail(f"{where}.to lists {_q(target)} twice")
    draft.dispatch_to = targets


def _dispatch_source_ok(source: object, outs: list[str]) -> bool:
    # Out names may contain dots ("result.json"), so match a whole out name as the prefix.
    if not isinstance(source, str):
        return False
    for out in outs:
        if source.startswith(out + "."):
            fields = source[len(out) + 1 :].split(".")
            if all(fields):
                return True
    return False


def _parse_loop(draft: _Draft, path: str) -> None:
    if "loop" not in draft.spec:
        return
    where = f"{path}.loop"
    loop = _check_dict(draft.spec["loop"], where)
    _check_keys(loop, ("back_to", "max", "until"), f"step {_q(draft.id)}: loop has ")
    for key in ("back_to", "max", "until"):
        if key not in loop:
            _fail(f"{where}.{key} is required")
    if not _is_name(loop["back_to"]):
        _fail(f"{where}.back_to must be a step id, got {_q(loop['back_to'])}")
    _check_int(loop["max"], f"{where}.max", 2)
    until = _check_dict(loop["until"], f"{where}.until")
    _check_keys(until, ("exit_code", "produced"), f"step {_q(draft.id)}: loop.until has ")
    if not until:
        _fail(f"{where}.until must give exit_code or produced")
    if "exit_code" in until:
        if draft.kind != "run":  # SPEC §3: only a run step's exit code may be judged
            _fail(f"step {_q(draft.id)}: loop.until.exit_code applies only to run steps")
        _check_int(until["exit_code"], f"{where}.until.exit_code")
    if "produced" in until:
        for name in _check_artifact_names(until["produced"], f"{where}.until.produced"):
            if name not in draft.out:
                _fail(
                    f"step {_q(draft.id)}: loop.until.produced names {_q(name)}, "
                    "which is not in its out"
                )
    draft.loop_back_to = loop["back_to"]


def _parse_validate_with(draft: _Draft, path: str) -> None:
    if "validate_with" in draft.spec:
        if not _is_name(draft.spec["validate_with"]):
            _fail(f"{path}.validate_with must be a step id, got {_q(draft.spec['validate_with'])}")
        draft.validate_with = draft.spec["validate_with"]
    if "max_attempts" in draft.spec:
        if draft.validate_with is None:
            _fail(f"step {_q(draft.id)}: max_attempts applies only with validate_with")
        _check_int(draft.spec["max_attempts"], f"{path}.max_attempts", 1)


# ------------------------------------------------------------------------------ between steps


def _check_references(
    drafts: list[_Draft], by_id: dict[str, _Draft], roles: tuple[Role, ...]
) -> None:
    """Cross-step rules, one rule at a time over all steps, so the first failure is well defined."""
    acquirers = {d.acquire_as: d for d in drafts if d.acquire_as is not None}
    declared = {r.name for r in roles} | set(acquirers)
    for d in drafts:
        if d.uses is not None and d.uses not in declared:
            _fail(f"step {_q(d.id)} uses undeclared role {_q(d.uses)}")
        grab = acquirers.get(d.uses)
        # No node is bound to an acquired role before its acquire step has run (SPEC §8).
        if grab is not None and d.seq <= grab.seq:
            _fail(f"step {_q(d.id)} uses role {_q(d.uses)} before step {_q(grab.id)} acquires it")
    for d in drafts:
        for role in d.release:
            if role not in declared:
                _fail(f"step {_q(d.id)} releases undeclared role {_q(role)}")
    for d in drafts:
        for need in d.needs or ():
            if need not in by_id:
                _fail(f"step {_q(d.id)} needs unknown step {_q(need)}")
            if by_id[need].seq >= d.seq:
                _fail(f"dependencies must point backward: step {_q(d.id)} needs {_q(need)}")
    for d in drafts:
        for key, target in zip(("acquired", "unavailable"), d.acquire_targets or (), strict=False):
            _check_later(d, target, by_id, f"acquire.{key}")
    for d in drafts:
        for target in d.dispatch_to:
            _check_later(d, target, by_id, "dispatch.to")
    for d in drafts:
        back = by_id.get(d.loop_back_to) if d.loop_back_to is not None else None
        if d.loop_back_to is not None and (back is None or back.seq >= d.seq):
            _fail(
                f"step {_q(d.id)}: loop.back_to must name an earlier step, got {_q(d.loop_back_to)}"
            )
    for d in drafts:
        if d.validate_with is not None:
            _check_later(d, d.validate_with, by_id, "validate_with")
    produced = {name for d in drafts for name in d.out}
    for d in drafts:
        for name in d.reads:
            if name not in produced:
                _fail(f"step {_q(d.id)} reads {_q(name)}, which no step produces")


def _check_later(d: _Draft, target: str, by_id: dict[str, _Draft], what: str) -> None:
    found = by_id.get(target)
    if found is None or found.seq <= d.seq:
        _fail(f"step {_q(d.id)}: {what} must name a later step, got {_q(target)}")


def _normalise_needs(drafts: list[_Draft], by_id: dict[str, _Draft]) -> dict[int, tuple[int, ...]]:
    """SPEC §3 needs: explicit ids, else the steps that dispatch to or acquire for this one,
    else the previous step; the first step waits for nothing. Returns seq -> ascending seqs."""
    branched_from: dict[str, set[int]] = {}
    for d in drafts:
        for target in (*d.dispatch_to, *(d.acquire_targets or ())):
            branched_from.setdefault(target, set()).add(d.seq)
    needs: dict[int, tuple[int, ...]] = {}
    for d in drafts:
        if d.needs is not None:
            seqs = {by_id[n].seq for n in d.needs}
        elif d.id in branched_from:
            seqs = branched_from[d.id]
        else:
            seqs = {d.seq - 1} if d.seq > 1 else set()
        needs[d.seq] = tuple(sorted(seqs))
    return needs


def _check_releases(
    drafts: list[_Draft], by_id: dict[str, _Draft], needs: dict[int, tuple[int, ...]]
) -> None:
    """SPEC §3 release: after it, nothing may still want the node, and no rollback may cross it."""
    ancestors: dict[int, int] = {}  # seq -> bitset of ancestor seqs; needs point backward
    for d in drafts:
        bits = 0
        for n in needs[d.seq]:
            bits |= ancestors[n] | (1 << n)
        ancestors[d.seq] = bits
    for d in drafts:
        for role in d.release:
            for other in drafts:
                if other is not d and other.uses == role and not ancestors[d.seq] >> other.seq & 1:
                    _fail(
                        f"step {_q(d.id)} releases role {_q(role)} but step {_q(other.id)} uses it "
                        f"and is not an ancestor of {_q(d.id)}"
                    )
    ranges: list[tuple[int, int, str]] = []
    for d in drafts:
        if d.loop_back_to is not None:
            ranges.append((by_id[d.loop_back_to].seq, d.seq, f"the loop of step {_q(d.id)}"))
        if d.validate_with is not None:
            ranges.append(
                (
                    d.seq,
                    by_id[d.validate_with].seq,
                    f"step {_q(d.id)} and its validator",
                )
            )
    for d in drafts:
        if not d.release:
            continue
        for first, last, what in ranges:
            if first <= d.seq <= last:
                # A rollback would reset a step onto a node whose lease was already given up.
                _fail(f"step {_q(d.id)} has release but lies within {what}")


# ---------------------------------------------------------------------------------- conditions


def _parse_success_when(
    doc: dict[str, Any], by_id: dict[str, _Draft], known: frozenset[str]
) -> tuple[dict[str, Any], ...]:
    if "success_when" not in doc:
        return ()
    conditions = doc["success_when"]
    if not isinstance(conditions, list):
        _fail(f"success_when must be a list, got {_q(conditions)}")
    if len(conditions) > MAX_CONDITIONS:
        _fail(f"success_when must have at most {MAX_CONDITIONS} entries, got {len(conditions)}")
    for i, raw in enumerate(conditions):
        cond = _check_dict(raw, f"success_when[{i}]")
        if ("step" in cond) == ("fleet_has" in cond):
            _fail(
                f'success_when[{i}] must have exactly one of "step" or "fleet_has", got {_q(cond)}'
            )
        if "step" in cond:
            _check_step_condition(cond, f"success_when[{i}]", by_id)
        else:
            _check_fleet_condition(cond, f"success_when[{i}]", known)
    return tuple(conditions)


def _check_step_condition(cond: dict[str, Any], path: str, by_id: dict[str, _Draft]) -> None:
    _check_keys(cond, ("step", "produced", "exit_code", "within_attempts"), f"{path}: ")
    step = by_id.get(cond["step"]) if isinstance(cond["step"], str) else None
    if step is None:
        _fail(f"{path}.step names unknown step {_q(cond['step'])}")
    if "produced" in cond:
        for name in _check_artifact_names(cond["produced"], f"{path}.produced"):
            if name not in step.out:
                # A name outside out can never be produced: the condition could only ever fail.
                _fail(
                    f"{path}.produced names {_q(name)}, "
                    f"which step {_q(step.id)} does not list in out"
                )
    if "exit_code" in cond:
        if step.kind != "run":
            _fail(
                f"{path}.exit_code applies only to run steps; "
                f"step {_q(step.id)} is {_a(step.kind)} step"
            )
        _check_int(cond["exit_code"], f"{path}.exit_code")
    if "within_attempts" in cond and not isinstance(cond["within_attempts"], bool):
        _fail(f"{path}.within_attempts must be true or false, got {_q(cond['within_attempts'])}")


def _check_fleet_condition(cond: dict[str, Any], path: str, known: frozenset[str]) -> None:
    _check_keys(cond, ("fleet_has", "min_count"), f"{path}: ")
    # A fleet requirement names no role, so "as" is optional here.
    _parse_requirement(cond["fleet_has"], f"{path}.fleet_has", known, need_as=False)
    if "min_count" in cond:
        _check_int(cond["min_count"], f"{path}.min_count", 1)


# ------------------------------------------------------------------------------------ warnings


def _collect_warnings(
    doc: dict[str, Any], roles: tuple[Role, ...], drafts: list[_Draft]
) -> tuple[str, ...]:
    """Non-blocking hints (SPEC §3 ``warnings``): few, each about something that costs the user."""
    warnings: list[str] = []
    if "lease" in doc:
        warnings.append("the contract's lease block is ignored: lease times are the server's")
    used = {d.uses for d in drafts}
    for role in roles:
        if role.name not in used:
            warnings.append(
                f"role {_q(role.name)} is declared in requires but no step uses it; "
                "its node is held for the whole run"
            )
    for d in drafts:
        if d.acquire_as is not None and d.acquire_as not in used:
            warnings.append(f"step {_q(d.id)} acquires role {_q(d.acquire_as)} but no step uses it")
    return tuple(warnings)
