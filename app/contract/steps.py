"""Each step's own fields, checked step by step (docs/contract.md#steps, rule 7 of
``app.contract.validate``).

A step is checked against itself only: its id, its kind and the kind's body, then its common
fields in a fixed order. What one step says about another (roles, needs, branch targets) is
recorded on its :class:`Draft` and checked by ``app.contract.graph`` once every step is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

from app.contract.fields import (
    article,
    check_artifact_names,
    check_dict,
    check_duration,
    check_exit_code,
    check_field,
    check_int,
    check_keys,
    check_name_list,
    check_str_list,
    fail,
    ignored_fields,
    is_relative_path,
    parse_requirement,
    quote,
    require,
    subpath,
)
from app.contract.types import Role
from app.names import MAX_NAME, NAME_RULE, is_name

MAX_STEPS = 500  # docs/contract.md#limits

KINDS = ("run", "agent", "ask", "acquire")
_STEP_KEYS = frozenset(
    {
        "id",
        "uses",
        "needs",
        "in",
        "feedback",
        "see",
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
# Fields a kind cannot act on. Ask and acquire steps run on no node ("uses" must be absent,
# docs/contract.md#steps), so node-side fields would be silently ignored; an acquire step produces
# only its own state blob.
_NOT_FOR_KIND: dict[str, tuple[str, ...]] = {
    "run": (),
    "agent": (),
    "ask": ("uses", "feedback", "see", "env", "workspace", "collect"),
    "acquire": (
        "uses",
        "in",
        "feedback",
        "see",
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
# "list" sends the ledger with the claim
# (docs/api.md#post-v1nodesnode_idclaim--the-next-step-for-a-node).
_SEE_LEDGER = ("", "none", "list")
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
# The names of the fields the asks page's form sends for itself (Flask-WTF's CSRF token): an ask
# property of that name would share its input, and the answer would store the token
# (docs/contract.md#ask).
FORM_FIELD_NAMES = frozenset({"csrf_token"})
_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")


@dataclass
class Draft:
    """What validation learns about one step on the way; only the Contract leaves validation."""

    seq: int
    id: str
    kind: str
    spec: dict[str, Any]  # the step as submitted, without the fields it ignores
    uses: str | None = None
    needs: list[str] | None = None  # None: absent, so the default of docs/contract.md#needs applies
    out: list[str] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)  # in.from and ask.show
    release: list[str] = field(default_factory=list)
    acquire_as: str | None = None
    acquire_targets: tuple[str, str] | None = None  # (acquired, unavailable)
    dispatch_to: list[str] = field(default_factory=list)
    loop_back_to: str | None = None
    validate_with: str | None = None
    ignored: list[str] = field(default_factory=list)  # warnings about the fields it ignores


def parse_steps(doc: dict[str, Any], roles: tuple[Role, ...], known: frozenset[str]) -> list[Draft]:
    """Every step in order; a role may be acquired once and never be one ``requires`` declares."""
    entries = check_field(doc, "steps", "steps", list, at_most=MAX_STEPS)
    declared = {r.name for r in roles}
    acquired: dict[str, str] = {}  # role name -> id of the step that acquires it
    drafts: list[Draft] = []
    seen: set[str] = set()
    for index, raw in enumerate(entries):
        draft = _parse_step(index, raw, seen, known)
        if draft.acquire_as is not None:
            if draft.acquire_as in declared:
                fail(
                    f"step {quote(draft.id)} acquires role {quote(draft.acquire_as)} "
                    "that requires already declares"
                )
            if draft.acquire_as in acquired:
                fail(
                    f"step {quote(draft.id)} acquires role {quote(draft.acquire_as)} "
                    f"that step {quote(acquired[draft.acquire_as])} already acquires"
                )
            acquired[draft.acquire_as] = draft.id
        seen.add(draft.id)
        drafts.append(draft)
    return drafts


def _parse_step(index: int, raw: object, seen: set[str], known: frozenset[str]) -> Draft:
    path = f"steps[{index}]"
    step = check_dict(raw, path)
    sid: str = require(step, "id", f"{path}.id")
    if not is_name(sid):
        fail(f"{path}.id must be {NAME_RULE}, got {quote(sid)}")
    if sid in seen:
        fail(f"{path}.id: duplicate step id {quote(sid)}")
    # A field a step does not know is ignored with a warning (docs/contract.md#warnings), and left
    # out of the stored step so nothing acts on it; the document keeps it as submitted.
    ignored = ignored_fields(step, _STEP_KEYS, path)
    if ignored:
        step = {k: v for k, v in step.items() if k in _STEP_KEYS}
    kind = _step_kind(step, sid)
    for key in _NOT_FOR_KIND[kind]:
        if key in step:
            fail(f"step {quote(sid)}: {article(kind)} step takes no {quote(key)}")
    draft = Draft(seq=index + 1, id=sid, kind=kind, spec=step, ignored=ignored)
    _parse_kind_body(draft, path, known)
    _parse_uses(draft, path)
    if "needs" in step:
        draft.needs = check_name_list(step["needs"], f"{path}.needs", "step ids")
    _parse_in(draft, path)
    if "feedback" in step:
        check_str_list(step["feedback"], f"{path}.feedback", "strings")
    _parse_see(draft, path)
    if "out" in step:
        draft.out = check_artifact_names(step["out"], f"{path}.out")
        if len(set(draft.out)) != len(draft.out):
            dup = next(n for n in draft.out if draft.out.count(n) > 1)
            fail(f"step {quote(sid)}: out lists {quote(dup)} twice")
    _parse_schema(draft, path)
    _parse_env(draft, path)
    _parse_workspace(draft, path)
    _parse_collect(draft, path)
    if "release" in step:
        draft.release = check_name_list(step["release"], f"{path}.release", "role names")
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
        fail(f"step {quote(sid)} has no kind: give exactly one of run, agent, ask or acquire")
    listed = ", ".join(quote(k) for k in kinds)
    fail(
        f"step {quote(sid)} has several kinds ({listed}): "
        "give exactly one of run, agent, ask or acquire"
    )


# ------------------------------------------------------------------------------ kind bodies


def _parse_kind_body(draft: Draft, path: str, known: frozenset[str]) -> None:
    body = draft.spec[draft.kind]
    where = f"{path}.{draft.kind}"
    if draft.kind == "run":
        if not isinstance(body, list) or not body or not all(isinstance(a, str) for a in body):
            fail(f"{where} must be a non-empty list of strings, got {quote(body)}")
        for i, arg in enumerate(body):
            if "\x00" in arg:  # execve cannot pass it; the node would fail the step anyway
                fail(f"{where}[{i}] must not contain NUL, got {quote(arg)}")
    elif draft.kind == "agent":
        _parse_agent(check_dict(body, where), where, draft.id)
    elif draft.kind == "ask":
        draft.reads.extend(_parse_ask(check_dict(body, where), where, draft.id))
    else:
        _parse_acquire(draft, check_dict(body, where), where, known)


def _parse_agent(agent: dict[str, Any], where: str, sid: str) -> None:
    check_keys(agent, _AGENT_KEYS, f"step {quote(sid)}: agent has ")
    for key in ("model", "harness"):
        if key in agent:
            check_field(agent, key, f"{where}.{key}", str, non_empty=False)
    for key in ("max_turns", "max_tokens"):
        if key in agent:
            check_int(agent[key], f"{where}.{key}", 1)
    if "mcp" in agent:
        check_str_list(agent["mcp"], f"{where}.mcp", "strings")
    # "ask" and "pack" are the harness's business (docs/contract.md#agent gives them no shape): any
    # JSON value.


def _parse_ask(ask: dict[str, Any], where: str, sid: str) -> list[str]:
    """Check an ask body; return the artifacts it shows to its answerers."""
    check_keys(ask, _ASK_KEYS, f"step {quote(sid)}: ask has ")
    check_field(ask, "prompt", f"{where}.prompt", str)
    if "answerers" in ask:
        answerers = check_str_list(ask["answerers"], f"{where}.answerers", "principals")
        for i, who in enumerate(answerers):
            if not 1 <= len(who) <= MAX_NAME:
                fail(f"{where}.answerers[{i}] must be 1-200 characters, got {quote(who)}")
    if "timeout" in ask:
        timeout = check_dict(ask["timeout"], f"{where}.timeout")
        check_keys(timeout, ("after", "then"), f"step {quote(sid)}: ask.timeout has ")
        after = require(timeout, "after", f"{where}.timeout.after")
        check_duration(after, f"{where}.timeout.after")
        if timeout.get("then", "fail") != "fail":
            fail(f'{where}.timeout.then must be "fail", got {quote(timeout["then"])}')
    if "show" in ask:
        return check_artifact_names(ask["show"], f"{where}.show")
    return []


def _parse_acquire(
    draft: Draft, acquire: dict[str, Any], where: str, known: frozenset[str]
) -> None:
    check_keys(acquire, _ACQUIRE_KEYS, f"step {quote(draft.id)}: acquire has ")
    for key in ("want", "acquired", "unavailable"):
        require(acquire, key, f"{where}.{key}")
    want = parse_requirement(acquire["want"], f"{where}.want", capabilities=known)
    if want.count != 1:  # an acquire grabs exactly one more node: docs/contract.md#acquire
        fail(f"{where}.want.count must be 1, got {quote(want.count)}")
    targets = []
    for key in ("acquired", "unavailable"):
        if not is_name(acquire[key]):
            fail(f"{where}.{key} must be a step id, got {quote(acquire[key])}")
        targets.append(acquire[key])
    # one target is always SKIPPED (docs/contract.md#acquire): they cannot be one step
    if targets[0] == targets[1]:
        fail(
            f"step {quote(draft.id)}: acquire.acquired and acquire.unavailable "
            f"are both {quote(targets[0])}"
        )
    draft.acquire_as = want.name
    draft.acquire_targets = (targets[0], targets[1])


# ----------------------------------------------------------------------------- common fields


def _parse_uses(draft: Draft, path: str) -> None:
    if draft.kind not in ("run", "agent"):
        return  # absence already enforced by _NOT_FOR_KIND
    if "uses" not in draft.spec:
        fail(
            f"step {quote(draft.id)} has no uses: {article(draft.kind)} step runs on a role's node"
        )
    uses = draft.spec["uses"]
    if not is_name(uses):
        fail(f"{path}.uses must be a role name, got {quote(uses)}")
    draft.uses = uses


def _parse_in(draft: Draft, path: str) -> None:
    if "in" not in draft.spec:
        return
    inp = check_dict(draft.spec["in"], f"{path}.in")
    check_keys(inp, ("prompt", "from"), f"step {quote(draft.id)}: in has ")
    if "prompt" in inp:
        check_field(inp, "prompt", f"{path}.in.prompt", str, non_empty=False)
    if "from" in inp:
        draft.reads.extend(check_artifact_names(inp["from"], f"{path}.in.from"))


def _parse_see(draft: Draft, path: str) -> None:
    """``see`` (docs/contract.md#steps): whether the claim carries the ledger; ``from`` is kept open
    and empty."""
    if "see" not in draft.spec:
        return
    see = check_dict(draft.spec["see"], f"{path}.see")
    check_keys(see, ("ledger", "from"), f"step {quote(draft.id)}: see has ")
    if "ledger" in see and see["ledger"] not in _SEE_LEDGER:
        fail(f'{path}.see.ledger must be "", "none" or "list", got {quote(see["ledger"])}')
    if "from" in see and see["from"] != []:
        # Ignoring it would let the author believe what the step sees was narrowed.
        fail(
            f"{path}.see.from must be an empty list (narrowing what a step sees is not "
            f"supported; name fewer artifacts in in.from), got {quote(see['from'])}"
        )


def _parse_schema(draft: Draft, path: str) -> None:
    if "schema" not in draft.spec:
        return
    schemas = check_dict(draft.spec["schema"], f"{path}.schema")
    for artifact, schema in schemas.items():
        if artifact not in draft.out:
            fail(f"step {quote(draft.id)}: schema for {quote(artifact)} which is not in its out")
        where = f"step {quote(draft.id)}: schema for {quote(artifact)}"
        if not isinstance(schema, dict):
            fail(f"{where} must be an object, got {quote(schema)}")
        _check_schema_keywords(schema, where)
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            fail(f"{where} is not a valid JSON schema: {quote(exc.message)}")


def _check_schema_keywords(schema: object, where: str) -> None:
    """Only a small keyword set anywhere in a schema, nothing that fetches or runs
    (docs/contract.md#in-out-and-schema)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue  # boolean subschemas are fine; a wrong type is check_schema's to report
        for key in node:
            if key not in _SCHEMA_KEYWORDS:
                fail(f"{where} uses keyword {quote(key)}, which is not allowed")
        props = node.get("properties")
        if isinstance(props, dict):
            stack.extend(props.values())  # property names are data, not keywords
        for key in ("items", "additionalProperties"):
            if key in node:
                stack.append(node[key])


def _check_ask_out(draft: Draft) -> None:
    """An ask has exactly one out, and its schema is a flat object a form can render
    (docs/contract.md#ask)."""
    if len(draft.out) != 1:
        fail(f"step {quote(draft.id)}: an ask step needs exactly one out, got {quote(draft.out)}")
    schema = draft.spec.get("schema", {}).get(draft.out[0])
    if schema is None:
        return
    where = f"step {quote(draft.id)}: the ask schema for {quote(draft.out[0])}"
    if schema.get("type") != "object" or "items" in schema:
        fail(f'{where} must be a flat object schema with type "object", got {quote(schema)}')
    properties = subpath(subpath(f"steps[{draft.seq - 1}].schema", draft.out[0]), "properties")
    for name, prop in (schema.get("properties") or {}).items():
        if name in FORM_FIELD_NAMES:
            fail(
                f"{subpath(properties, name)}: {quote(name)} is the name of a field the asks "
                "page's form sends itself; give the property another name"
            )
        if not _is_flat_property(prop):
            fail(f"{where}: property {quote(name)} must have a primitive type or an enum")


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


def _parse_env(draft: Draft, path: str) -> None:
    if "env" not in draft.spec:
        return
    names = check_str_list(draft.spec["env"], f"{path}.env", "variable names")
    for i, name in enumerate(names):
        if _ENV_RE.fullmatch(name) is None:
            fail(
                f"{path}.env[{i}] must be a variable name ([A-Za-z_][A-Za-z0-9_]*), "
                f"got {quote(name)}"
            )


def _parse_workspace(draft: Draft, path: str) -> None:
    if "workspace" not in draft.spec:
        return
    ws = check_dict(draft.spec["workspace"], f"{path}.workspace")
    check_keys(ws, ("repo", "rev"), f"step {quote(draft.id)}: workspace has ")
    check_field(ws, "repo", f"{path}.workspace.repo", str)
    if "rev" in ws:
        check_field(ws, "rev", f"{path}.workspace.rev", str)


def _parse_collect(draft: Draft, path: str) -> None:
    if "collect" not in draft.spec:
        return
    collect = check_dict(draft.spec["collect"], f"{path}.collect")
    for artifact, rel in collect.items():
        if artifact not in draft.out:
            fail(f"step {quote(draft.id)}: collect for {quote(artifact)} which is not in its out")
        if not is_relative_path(rel):
            fail(
                f"step {quote(draft.id)}: collect path for {quote(artifact)} must be relative "
                f'with no ".." component, got {quote(rel)}'
            )


# ------------------------------------------------------- branches, loops and validators (own)


def _parse_dispatch(draft: Draft, path: str) -> None:
    """The shape of ``dispatch``; that ``to`` names later steps is ``app.contract.graph``'s."""
    if "dispatch" not in draft.spec:
        return
    where = f"{path}.dispatch"
    dispatch = check_dict(draft.spec["dispatch"], where)
    check_keys(dispatch, ("from", "to"), f"step {quote(draft.id)}: dispatch has ")
    for key in ("from", "to"):
        require(dispatch, key, f"{where}.{key}")
    if not _dispatch_source_ok(dispatch["from"], draft.out):
        fail(
            f'step {quote(draft.id)}: dispatch.from must be "<out>.<field>[.<field>]" naming one '
            f"of its outs, got {quote(dispatch['from'])}"
        )
    targets = check_name_list(dispatch["to"], f"{where}.to", "step ids")
    if len(targets) < 2:
        fail(f"{where}.to must list at least 2 step ids, got {quote(targets)}")
    for target in targets:
        if targets.count(target) > 1:
            fail(f"{where}.to lists {quote(target)} twice")
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


def _parse_loop(draft: Draft, path: str) -> None:
    if "loop" not in draft.spec:
        return
    where = f"{path}.loop"
    loop = check_dict(draft.spec["loop"], where)
    check_keys(loop, ("back_to", "max", "until"), f"step {quote(draft.id)}: loop has ")
    for key in ("back_to", "max", "until"):
        require(loop, key, f"{where}.{key}")
    if not is_name(loop["back_to"]):
        fail(f"{where}.back_to must be a step id, got {quote(loop['back_to'])}")
    check_int(loop["max"], f"{where}.max", 2)
    until = check_dict(loop["until"], f"{where}.until")
    check_keys(until, ("exit_code", "produced"), f"step {quote(draft.id)}: loop.until has ")
    if not until:
        fail(f"{where}.until must give exit_code or produced")
    if "exit_code" in until:
        if draft.kind != "run":  # only a run step's exit code may be judged (docs/contract.md#loop)
            fail(f"step {quote(draft.id)}: loop.until.exit_code applies only to run steps")
        check_exit_code(until["exit_code"], f"{where}.until.exit_code")
    if "produced" in until:
        for name in check_artifact_names(until["produced"], f"{where}.until.produced"):
            if name not in draft.out:
                fail(
                    f"step {quote(draft.id)}: loop.until.produced names {quote(name)}, "
                    "which is not in its out"
                )
    draft.loop_back_to = loop["back_to"]


def _parse_validate_with(draft: Draft, path: str) -> None:
    if "validate_with" in draft.spec:
        if not is_name(draft.spec["validate_with"]):
            fail(
                f"{path}.validate_with must be a step id, got {quote(draft.spec['validate_with'])}"
            )
        draft.validate_with = draft.spec["validate_with"]
    if "max_attempts" in draft.spec:
        if draft.validate_with is None:
            fail(f"step {quote(draft.id)}: max_attempts applies only with validate_with")
        check_int(draft.spec["max_attempts"], f"{path}.max_attempts", 1)
