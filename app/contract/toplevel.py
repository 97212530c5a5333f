"""The contract's top-level fields besides ``steps`` and ``success_when``
(docs/contract.md#top-level): ``run_id``, ``work``, ``requires``, ``ledger`` and ``queue``, each
parsed on its own."""

from __future__ import annotations

import math
from typing import Any

from app.contract.fields import (
    MAX_NAME,
    NAME_RULE,
    check_dict,
    check_duration,
    check_field,
    check_int,
    check_keys,
    fail,
    is_name,
    parse_requirement,
    quote,
    require,
)
from app.contract.types import Role

MAX_REQUIRES = 50  # docs/contract.md#limits

TOP_KEYS = frozenset(
    {"run_id", "work", "requires", "steps", "success_when", "ledger", "queue", "lease"}
)
WORK_KEYS = ("id", "system", "change_id", "patchset", "parent_rev", "patch_rev")


def parse_run_id(doc: dict[str, Any]) -> str:
    run_id: str = require(doc, "run_id", "run_id")
    if not is_name(run_id):
        fail(f"run_id must be {NAME_RULE}, got {quote(run_id)}")
    return run_id


def parse_work(doc: dict[str, Any]) -> str:
    """The work key (docs/contract.md#top-level) = ``id.system:id.change_id``, else
    ``system:change_id``, else empty."""
    if "work" not in doc:
        return ""
    work = check_dict(doc["work"], "work")
    check_keys(work, WORK_KEYS, "work: ")
    top = {
        k: check_field(work, k, f"work.{k}", str, at_most=MAX_NAME)
        for k in ("system", "change_id")
        if k in work
    }
    # Where this run stands within its work (docs/contract.md#top-level): kept in the document, not
    # in the key.
    if "patchset" in work:
        check_int(work["patchset"], "work.patchset")
    for key in ("parent_rev", "patch_rev"):
        if key in work:
            check_field(work, key, f"work.{key}", str, non_empty=False, at_most=MAX_NAME)
    if "id" in work:
        ident = check_dict(work["id"], "work.id")
        check_keys(ident, ("system", "change_id"), "work.id: ")
        inner = {k: check_field(ident, k, f"work.id.{k}", str, at_most=MAX_NAME) for k in ident}
        if len(inner) == 2:
            return f"{inner['system']}:{inner['change_id']}"
    if len(top) == 2:
        return f"{top['system']}:{top['change_id']}"
    return ""


def parse_requires(doc: dict[str, Any], known: frozenset[str]) -> tuple[Role, ...]:
    entries = check_field(doc, "requires", "requires", list, at_most=MAX_REQUIRES)
    roles: list[Role] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        role = parse_requirement(entry, f"requires[{i}]", capabilities=known)
        if role.name in seen:
            fail(f"requires[{i}].as: duplicate role {quote(role.name)}")
        seen.add(role.name)
        roles.append(role)
    return tuple(roles)


def parse_ledger(doc: dict[str, Any]) -> str:
    if "ledger" not in doc:
        return "run"
    ledger = check_dict(doc["ledger"], "ledger")
    check_keys(ledger, ("scope",), "ledger: ")
    scope: str = ledger.get("scope", "run")
    if scope not in ("run", "work"):
        fail(f'ledger.scope must be "run" or "work", got {quote(scope)}')
    return scope


MIN_PRIORITY, MAX_PRIORITY = -100, 100  # docs/priorities.md#priority


def parse_queue(doc: dict[str, Any]) -> tuple[int | None, int, str | None]:
    """``queue.timeout`` in whole seconds (None: wait for ever), ``queue.priority``
    (docs/priorities.md#priority, default 0) and ``queue.team`` as named (None: not named). Whether
    the team exists and the token may name it is the submit's to say (docs/teams.md), not the
    contract's."""
    if "queue" not in doc:
        return None, 0, None
    queue = check_dict(doc["queue"], "queue")
    check_keys(queue, ("timeout", "priority", "team"), "queue: ")
    timeout = None
    if "timeout" in queue:
        # The timeout is kept in whole seconds (an integer column); rounding up means a run never
        # fails sooner than its contract allows ("250ms" waits one second).
        timeout = math.ceil(check_duration(queue["timeout"], "queue.timeout"))
    team = None
    if "team" in queue:
        team = check_field(queue, "team", "queue.team", str, at_most=MAX_NAME)
    return timeout, parse_priority(queue), team


def parse_priority(queue: dict[str, Any]) -> int:
    if "priority" not in queue:
        return 0
    value = queue["priority"]
    if not isinstance(value, int) or isinstance(value, bool):
        fail(f"queue.priority must be an integer, got {quote(value)}")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        fail(f"queue.priority must be from {MIN_PRIORITY} to {MAX_PRIORITY}, got {quote(value)}")
    return value
