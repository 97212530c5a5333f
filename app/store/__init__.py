"""The only module with SQL whose exact form matters (the layers of docs/design.md#code-layout).

Every state change is one explicit guarded statement whose docstring names the guard or lock that
makes it safe; "0 rows" and key conflicts become domain outcomes (``NotQueued``, ``NodeTaken``).
Store functions never commit: the service that owns the transaction does.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import CursorResult, Result
from sqlalchemy.exc import IntegrityError


class StoreOutcome(Exception):
    """A normal outcome of a guarded statement that ends the transaction (it is rolled back)."""


class DuplicateRun(StoreOutcome):
    """The ``runs`` primary key: another request created this run_id first."""


class PrunedRunId(StoreOutcome):
    """The tombstone of a pruned run: its id may not be used again
    (docs/retention.md#what-a-pruned-run-looks-like)."""


class NodeTaken(StoreOutcome):
    """The ``leases`` primary key: another run holds the node
    (docs/design.md#transactions-conflicts-and-retries, docs/design.md#promotion)."""


class NotQueued(StoreOutcome):
    """The conditional promotion found the run no longer QUEUED."""


def constraint_name(exc: IntegrityError) -> str | None:
    """The violated constraint, from PostgreSQL's error fields (psycopg's ``diag``)."""
    diag = getattr(exc.orig, "diag", None)
    return getattr(diag, "constraint_name", None)


def rowcount(result: Result[Any]) -> int:
    """The rows an UPDATE or DELETE touched (its result is a cursor result)."""
    return cast(CursorResult[Any], result).rowcount or 0
