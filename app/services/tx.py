"""Transactions owned by service functions: bounded retries of deadlocks and serialisation
failures (SQLSTATE 40P01 and 40001, up to 3 times: docs/queue.md#lock-order)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from sqlalchemy.exc import DBAPIError

from app.logs import log
from app.services.notify import AfterCommit

DEADLOCK = "40P01"
RETRYABLE = frozenset({DEADLOCK, "40001"})
RETRIES = 3

P = ParamSpec("P")
T = TypeVar("T")


def sqlstate(exc: BaseException) -> str | None:
    return getattr(getattr(exc, "orig", None), "sqlstate", None)


def _detail(exc: BaseException) -> str | None:
    """The DETAIL of a database error (a deadlock's names the processes and what each waits
    for; the statements are in the server's log only)."""
    diag = getattr(getattr(exc, "orig", None), "diag", None)
    return getattr(diag, "message_detail", None)


def retrying(fn: Callable[P, T]) -> Callable[P, T]:
    """Run the whole transaction again on a deadlock or serialisation failure. The function must
    open its own transaction(s) so that a retry starts clean."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        # What a rolled-back attempt left for after commit must not survive into the retry.
        pending = [a for a in (*args, *kwargs.values()) if isinstance(a, AfterCommit)]
        snapshots = [a.snapshot() for a in pending]
        for attempt in range(RETRIES + 1):
            try:
                return fn(*args, **kwargs)
            except DBAPIError as exc:
                for a, snap in zip(pending, snapshots, strict=True):
                    a.restore(snap)
                if sqlstate(exc) not in RETRYABLE or attempt == RETRIES:
                    raise
                if sqlstate(exc) == DEADLOCK:
                    # One lock order (docs/queue.md, "Lock order"), so a deadlock is a bug to
                    # find: what PostgreSQL says of the cycle goes in the log.
                    log.warning(
                        "transaction retried after a deadlock",
                        function=fn.__name__,
                        detail=_detail(exc),
                        statement=" ".join(str(getattr(exc, "statement", "")).split())[:300],
                    )
                else:
                    log.info("transaction retried", function=fn.__name__, sqlstate=sqlstate(exc))
        raise AssertionError("unreachable")

    return wrapper
