"""The leases this node holds, as the Mediator last said
(docs/queue.md#heartbeats-what-a-node-learns): each heartbeat reply is the complete list, so a lease
missing from it means "stop working for that run" (cancel, release, a finished run). A lease also
ends when its ``not_after`` passes without renewal (the Mediator unreachable for several
heartbeats): the reaper may then give the node to someone else.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.wire import parse_ts


@dataclass(frozen=True)
class Lease:
    run_id: str
    nonce: str | None
    deadline: float  # time.monotonic() when not_after passes
    seen_at: float  # time.monotonic() of the answer that carried it


def remaining_seconds(not_after: Any, server_now: datetime | None) -> float:
    """Seconds until ``not_after`` (RFC 3339), measured on the Mediator's clock when its answer
    says what time it was (lease times are the database's clock,
    docs/design.md#shape-of-the-service), else on ours. A lease without a readable ``not_after`` is
    judged by the heartbeat replies alone."""
    if not isinstance(not_after, str):
        return math.inf
    try:
        end = parse_ts(not_after)
    except ValueError:
        return math.inf
    now = server_now or datetime.now(UTC)
    return (end - now).total_seconds()


def lease_of(doc: Mapping[str, Any], server_now: datetime | None, at: float) -> Lease | None:
    run_id = doc.get("run_id")
    if not isinstance(run_id, str):
        return None
    nonce = doc.get("nonce")
    return Lease(
        run_id=run_id,
        nonce=nonce if isinstance(nonce, str) else None,
        deadline=at + remaining_seconds(doc.get("not_after"), server_now),
        seen_at=at,
    )


class HeldLeases:
    """Shared by the heartbeat thread (which replaces the list) and the step being run (which
    asks whether its run's lease still stands)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_run: dict[str, Lease] = {}

    def replace(self, leases: Iterable[Lease], sent_at: float) -> list[str]:
        """The list of a heartbeat reply whose request left at ``sent_at``. A lease learnt from a
        claim answered after that request left is kept: the reply may have been computed before
        the claim, so its silence says nothing about it. Returns the runs whose lease ended."""
        fresh = {lease.run_id: lease for lease in leases}
        with self._lock:
            for run_id, lease in self._by_run.items():
                if run_id not in fresh and lease.seen_at > sent_at:
                    fresh[run_id] = lease
            gone = sorted(set(self._by_run) - set(fresh))
            self._by_run = fresh
        return gone

    def add(self, lease: Lease) -> None:
        """The lease a claim carried: the step may start before the next heartbeat."""
        with self._lock:
            self._by_run[lease.run_id] = lease

    def holds(self, run_id: str) -> bool:
        with self._lock:
            lease = self._by_run.get(run_id)
        return lease is not None and time.monotonic() < lease.deadline

    def any(self) -> bool:
        now = time.monotonic()
        with self._lock:
            return any(now < lease.deadline for lease in self._by_run.values())

    def nonce(self, run_id: str) -> str | None:
        with self._lock:
            lease = self._by_run.get(run_id)
        return lease.nonce if lease else None
