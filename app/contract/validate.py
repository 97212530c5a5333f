"""Validation and needs normalisation of a submitted contract (docs/contract.md#validation-errors):
the ordered pipeline.

Pure: plain data in, a :class:`~app.contract.types.Contract` out, no session and no I/O.
Rules run in one fixed order and the first failure wins (docs/contract.md#validation-errors); every
failure is ``BadRequest`` with a reason that names the field and quotes the offending value with
``json.dumps``. No other exception may escape for any JSON-like input (bad input is a 4xx,
never a 500: docs/security.md#input-and-load), so every value is type-checked before it is used and
nesting is bounded before anything walks the document.

Order of the rules:
 1. the document is an object; 2. nesting depth; 3. unknown top-level fields (a warning each,
 never a failure: docs/contract.md#warnings); 4. ``run_id``;
 5. ``work``; 6. ``requires``; 7. each step's own fields, step by step; 8. cross-step references
 (roles, needs, branch targets, loops, validators, artifacts), rule by rule;
 9. ``release`` placement;
 10. ``success_when``; 11. ``ledger``; 12. ``queue``.

The rules themselves live by group: ``fields`` (primitives), ``toplevel`` (4-6, 11, 12),
``steps`` (7), ``graph`` (8, 9 and the warnings), ``conditions`` (10).

Unknown fields at the top level, in a step and in a condition are ignored with a warning that
names their path (the original system's client may send fields this server does not know:
docs/contract.md#warnings); inside every other object (``agent``, ``in``, ``work``, ``queue``, ...)
they stay a 400.
"""

from __future__ import annotations

from collections.abc import Collection

from app.contract.conditions import parse_success_when
from app.contract.fields import (
    check_json_depth,
    check_no_nul,
    fail,
    ignored_fields,
    requires_key,
)
from app.contract.graph import check_references, check_releases, collect_warnings, normalise_needs
from app.contract.steps import parse_steps
from app.contract.toplevel import (
    TOP_KEYS,
    parse_ledger,
    parse_queue,
    parse_requires,
    parse_run_id,
    parse_work,
)
from app.contract.types import Contract, StepDef

MAX_IGNORED_NOTES = 50  # lines about ignored fields in the warnings; the rest are counted


def validate_contract(doc: object, *, capabilities: Collection[str] = ()) -> Contract:
    """Validate a submitted contract and return its normalised form, or raise ``BadRequest``.

    ``capabilities`` is the configured ``contract.capabilities`` list; when non-empty, any other
    capability name is 400 ``unknown capability: "x"`` (it catches typos:
    docs/contract.md#requirements-and-how-runs-are-placed).
    """
    if not isinstance(doc, dict):
        fail("contract must be a JSON object")
    check_json_depth(doc)
    ignored = ignored_fields(doc, TOP_KEYS, "")
    # Work on a private copy so the Contract owns its data and the caller's dict cannot change it.
    document = {k: _copy(v) for k, v in doc.items() if k != "lease"}
    known = frozenset(capabilities)

    run_id = parse_run_id(document)
    work_id = parse_work(document)
    roles = parse_requires(document, known)
    drafts = parse_steps(document, roles, known)
    ignored.extend(note for d in drafts for note in d.ignored)
    by_id = {d.id: d for d in drafts}
    check_references(drafts, by_id, roles)
    needs = normalise_needs(drafts, by_id)
    check_releases(drafts, by_id, needs)
    conditions = parse_success_when(document, by_id, known, ignored)
    ledger_scope = parse_ledger(document)
    queue_timeout, priority, queue_team = parse_queue(document)
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
        priority=priority,
        queue_team=queue_team,
        warnings=collect_warnings(doc, roles, drafts, _bounded(ignored)),
        document=document,
        requires_key=requires_key(roles),
    )


def _copy(value: object) -> object:
    """A copy of JSON-like data: its objects and arrays new, the rest (immutable) shared. A
    fifth of what ``copy.deepcopy`` costs, which keeps a memo of every object it meets."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _bounded(notes: list[str]) -> list[str]:
    """At most ``MAX_IGNORED_NOTES`` lines about ignored fields, then one that counts the rest:
    the warnings are stored with the run and returned with every view of it."""
    if len(notes) <= MAX_IGNORED_NOTES:
        return notes
    rest = len(notes) - MAX_IGNORED_NOTES
    return [*notes[:MAX_IGNORED_NOTES], f"and {rest} more unknown fields, ignored"]
