"""The health run that lifts a quarantine (docs/operators.md, "Health runs"): its contract, read
from ``health.check_contract`` and checked at start-up like a submit, and what a health run of a
node is made of. Nothing here depends on Flask or the database."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.contract import Contract, validate_contract
from app.contract.fields import requires_key
from app.errors import ConfigError
from app.match import adverts_from_rows, satisfies

HEALTH_PREFIX = "health-"
HEALTH_PRINCIPAL = "mediator"
HEALTH_PRIORITY = 100
KEY = "health.check_contract"


def load_health_check(path: str | None, capabilities: Any = ()) -> Contract | None:
    """The health run's contract, or None when unset. A file that cannot be read, a contract
    that a submit would refuse, or a first role whose ``count`` is not 1 stops the start with one
    line naming the key."""
    if not path:
        return None
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{KEY}: cannot read a JSON contract from {path}: {exc}") from None
    if isinstance(doc, dict):
        doc = {**doc, "run_id": doc.get("run_id") or "health-check"}
    try:
        contract = validate_contract(doc, capabilities=capabilities)
    except Exception as exc:  # the submit's own reasons
        raise ConfigError(f"{KEY}: {path}: {exc}") from None
    if contract.requires[0].count != 1:
        raise ConfigError(f"{KEY}: {path}: its first role's count must be 1 (the node it checks)")
    return contract


def health_run_id(node_id: str, n: int) -> str:
    """``health-<16 hex of sha256(node_id)>-<n>``: the node's n-th health run."""
    digest = hashlib.sha256(node_id.encode()).hexdigest()[:16]
    return f"{HEALTH_PREFIX}{digest}-{n}"


def health_run(check: Contract, node_id: str, n: int) -> Contract:
    """The check's contract as the node's n-th health run: its id, priority 100, team ``health``
    and a requirements key that includes the pinned node (a shape of its own)."""
    run_id = health_run_id(node_id, n)
    key = requires_key(check.requires) + ":" + hashlib.sha256(node_id.encode()).hexdigest()
    return replace(
        check,
        run_id=run_id,
        document={**check.document, "run_id": run_id},
        requires_key=key,
        priority=HEALTH_PRIORITY,
        team="health",
    )


def fits_check(check: Contract | None, capabilities: Any) -> bool:
    """Whether a node advertising ``capabilities`` (its stored JSON) fits the check's first role:
    only then can a health run lift its quarantine, and only then is an agent's error a
    strike."""
    if check is None:
        return False
    (advert,) = adverts_from_rows([("", capabilities, None)])
    return satisfies(advert, check.requires[0])
