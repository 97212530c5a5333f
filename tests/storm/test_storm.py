"""The storm (docs/reliability.md#storm): gunicorn with 4 workers and two reapers on one database,
submitters, a canceller and node agents at once; the invariant checker sampled throughout and
run in full once the storm is quiet; every answer a status its route documents; and
``pg_stat_database.deadlocks`` of the storm's database the same after it as before, read once
every session of it has ended (one lock order, docs/queue.md).

Seeded: the seed is printed, and ``STORM_SEED=<n>`` gives every driver the same random stream
again (what it draws also depends on the answers it gets, and the interleaving of processes is
the machine's). Bounded for CI: a fixed number of operations per driver (about 25 s on two
cores), and a deadline of 22 s per driver as a guard on a slow machine. Long runs outside CI: ``python -m tests.storm --soak 600`` (see
tests/storm/__init__.py), or ``STORM_SOAK_SECONDS=600`` for this test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.storm import Plan, run_storm, storm_seed

pytestmark = pytest.mark.slow


def test_a_storm_keeps_every_invariant_and_answers_only_documented_statuses(
    fresh_db_url: str, tmp_path: Path
) -> None:
    seed = storm_seed()
    print(f"storm seed {seed}")
    soak = float(os.environ.get("STORM_SOAK_SECONDS") or 0)
    plan = Plan(seconds=soak) if soak else Plan(deadline=22)
    report = run_storm(fresh_db_url, tmp_path, seed, plan)
    print(report.describe())
    assert report.failures() == [], f"seed {seed}\n" + report.describe()
    # The storm did what it is for: runs placed, queued and promoted, finished both ways, acquire
    # steps done, runs failed by a node's restart and cancelled, and no deadlock meanwhile (one
    # lock order, docs/queue.md).
    assert report.rows.get("promotions", 0) > 0, report.describe()
    assert report.rows.get("runs SUCCEEDED", 0) > 0, report.describe()
    assert report.rows.get("runs FAILED", 0) > 0, report.describe()
    assert report.rows.get("acquire steps done", 0) > 0, report.describe()
    assert report.rows.get("runs failed by a restart", 0) > 0, report.describe()
    assert report.rows.get("cancels", 0) > 0, report.describe()
    assert report.deadlocks_after == report.deadlocks_before, report.describe()
    assert report.samples > 0


def test_a_storm_with_priorities_and_reservations_keeps_every_invariant(
    fresh_db_url: str, tmp_path: Path
) -> None:
    """The same storm, shorter, with runs of several priorities and reservations after one
    second of waiting: a reserved node is never leased to a run of equal or lower priority, no
    reservation outlives its holder's wait, the quiet check honours reservations, and nothing
    deadlocks while reservations are written beside acquires, restarts and cancels."""
    seed = storm_seed()
    print(f"storm seed {seed}")
    plan = Plan(deadline=15, submitter_ops=60, node_ops=160, priorities=True, reserve_after=1)
    report = run_storm(fresh_db_url, tmp_path, seed, plan)
    print(report.describe())
    assert report.failures() == [], f"seed {seed}\n" + report.describe()
    assert report.rows.get("promotions", 0) > 0, report.describe()
    assert report.rows.get("reservings", 0) > 0, report.describe()
    assert report.rows.get("priorities", 0) > 1, report.describe()
    assert report.rows.get("acquire steps done", 0) > 0, report.describe()
    assert report.deadlocks_after == report.deadlocks_before, report.describe()
