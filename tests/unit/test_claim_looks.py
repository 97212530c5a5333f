"""Claims look in the database at most half the pool's size at once per process (app/listener.py):
a burst of hundreds of claims looking together (a fleet restarted, every claim re-polling after
the same window) waits on that bound, holding neither a connection nor the interpreter, instead of
taking every pooled connection from the process's other requests. A look never waits longer than
the pool's own time-out would."""

from __future__ import annotations

import threading
import time

from app.config import load_config
from app.listener import ClaimListener
from app.services.results import held_seconds


def listener(pool_size: int, pool_timeout: float = 5.0) -> ClaimListener:
    return ClaimListener(
        load_config(
            env={},
            overrides={
                "database.url": "postgresql://nobody@127.0.0.1:9/none",
                "database.pool_size": pool_size,
                "database.pool_timeout": pool_timeout,
            },
        )
    )


def test_looks_beyond_half_the_pool_wait_for_one_to_end():
    claims = listener(pool_size=5)  # two looks at once
    inside = threading.Semaphore(0)
    leave = threading.Event()
    entered: list[float] = []

    def look() -> None:
        with claims.looking():
            entered.append(time.monotonic())
            inside.release()
            leave.wait(10)

    threads = [threading.Thread(target=look) for _ in range(3)]
    for t in threads:
        t.start()
    assert inside.acquire(timeout=5) and inside.acquire(timeout=5)
    assert not inside.acquire(timeout=0.3)  # the third waits
    assert len(entered) == 2
    leave.set()
    assert inside.acquire(timeout=5)  # and goes in once one has ended
    for t in threads:
        t.join(5)
    assert len(entered) == 3


def test_a_look_that_waited_as_long_as_the_pool_would_goes_ahead():
    claims = listener(pool_size=1, pool_timeout=0.2)  # one look at once
    holding = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with claims.looking():
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(5)
    started = time.monotonic()
    with claims.looking():
        waited = time.monotonic() - started
    release.set()
    holder.join(5)
    assert 0.15 <= waited < 2.0, waited


def test_a_claim_is_held_between_the_window_less_its_jitter_and_the_whole_window():
    assert held_seconds(30.0, 0.25, 0.0) == 30.0
    assert held_seconds(30.0, 0.25, 0.5) == 26.25
    assert 22.5 < held_seconds(30.0, 0.25, 0.999999) < 22.51
    assert held_seconds(30.0, 0.0, 0.7) == 30.0  # no jitter: exactly the window
    assert held_seconds(0.0, 0.25, 0.7) == 0.0  # ?wait=0 answers at once
