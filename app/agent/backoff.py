"""How long the node agent waits before it tries a failed call again: capped exponential backoff
with full jitter. After a restart of the Mediator a whole fleet fails at once; a fixed or merely
doubled delay would bring every node back in the same instant, again and again, while a delay
drawn uniformly from ``[0, min(cap, base * 2**attempt)]`` spreads them over the window."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


def full_jitter(attempt: int, *, base: float, cap: float, rng: random.Random) -> float:
    """The wait before try ``attempt + 1`` (``attempt`` counts the failures so far, from 0)."""
    # 2**attempt grows without bound: stop doubling once the cap is reached.
    ceiling = cap if attempt >= 64 else min(cap, base * 2**attempt)
    return rng.uniform(0, ceiling)


# (base, cap) in seconds of each call the agent tries again.
ADVERT = (1.0, 5.0)  # and never above the heartbeat interval
CLAIM = (1.0, 5.0)
REPORT = (0.5, 10.0)
TRANSFER = (0.5, 4.0)  # an input fetched, an output uploaded
LOG_APPEND = (0.5, 5.0)


@dataclass
class Backoff:
    """The failures of one kind of call in a row, and the next wait after one more."""

    base: float
    cap: float
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0

    def next_delay(self) -> float:
        delay = full_jitter(self.failures, base=self.base, cap=self.cap, rng=self.rng)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0
