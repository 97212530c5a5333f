"""Time passing, by the database's clock: the reaper, the reservations and retention read only
``now()`` of the database against its timestamps, so the tests move those timestamps back with SQL
(never sleeping, never mocking a clock), or wait until the database says enough time has gone by
where there is no timestamp to move."""

from __future__ import annotations

from typing import Any

from tests.support.concurrency import await_condition

LEASE_EXPIRED = "lease expired: renewal stopped"  # the cause the reaper gives an expired lease


def expire_leases(sql: Any, run_id: str, ago: str = "1 s") -> None:
    sql.execute(
        "update leases set not_after = now() - %s::interval where run_id = %s", (ago, run_id)
    )


def age(sql: Any, run_id: str, days: float) -> None:
    """Make the run ``days`` older: it was created, and ended, that long before it did."""
    sql.execute(
        "update runs set created_at = created_at - make_interval(secs => %s), "
        "ended_at = ended_at - make_interval(secs => %s) where run_id = %s",
        (days * 86400, days * 86400, run_id),
    )


def has_waited(sql: Any, run_id: str, seconds: float) -> None:
    """Return once the run was created ``seconds`` ago by the database clock (the clock of the
    reservation age): time passing has no event to await."""
    await_condition(
        lambda: sql.execute(
            "select now() - created_at >= make_interval(secs => %s) from runs where run_id = %s",
            (seconds, run_id),
        ).fetchone()[0],
        f"{run_id} to wait {seconds} s",
        timeout=seconds + 10,
    )
