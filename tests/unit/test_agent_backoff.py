"""The node agent's retry schedule: capped exponential backoff with full jitter, so a fleet that
lost its Mediator at once does not come back in lockstep. Drawn from a seeded random: no timing."""

from __future__ import annotations

import random

import pytest

from app.agent import backoff
from app.agent.backoff import Backoff, full_jitter


@pytest.mark.parametrize(("base", "cap"), [backoff.CLAIM, backoff.REPORT, backoff.TRANSFER])
def test_every_wait_lies_in_zero_to_the_capped_doubling(base, cap):
    rng = random.Random(26)
    for attempt in range(70):
        ceiling = min(cap, base * 2**attempt)
        waits = [full_jitter(attempt, base=base, cap=cap, rng=rng) for _ in range(200)]
        assert all(0 <= w <= ceiling for w in waits), attempt
        # Full jitter: the whole window is used, not just its top (a doubled delay would be).
        assert min(waits) < ceiling * 0.1 and max(waits) > ceiling * 0.9, attempt


def test_a_fleet_retrying_together_spreads_over_the_window():
    """1,000 agents seeded apart, each at its fourth failure: their waits fill [0, 4 s]."""
    waits = [
        Backoff(0.5, 10.0, rng=random.Random(seed), failures=3).next_delay() for seed in range(1000)
    ]
    assert all(0 <= w <= 4.0 for w in waits)
    per_second = [sum(1 for w in waits if s <= w < s + 1) for s in range(4)]
    assert all(200 <= n <= 300 for n in per_second), per_second


def test_the_schedule_grows_until_the_cap_and_starts_again_after_a_success():
    retry = Backoff(0.5, 4.0, rng=random.Random(7))
    ceilings = []
    for _ in range(6):
        ceilings.append(min(4.0, 0.5 * 2**retry.failures))
        assert retry.next_delay() <= ceilings[-1]
    assert ceilings == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    retry.reset()
    assert retry.failures == 0 and retry.next_delay() <= 0.5


def test_the_same_seed_gives_the_same_schedule():
    one, two = Backoff(1.0, 5.0, rng=random.Random(3)), Backoff(1.0, 5.0, rng=random.Random(3))
    assert [one.next_delay() for _ in range(10)] == [two.next_delay() for _ in range(10)]
