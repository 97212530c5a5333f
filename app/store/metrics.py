"""The figures of ``/metrics`` that live in the database
(docs/metrics.md#read-from-the-database-at-each-scrape,
docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits), read at scrape time in one
statement: whichever process answers a scrape reads them once, so several workers never count them
twice, and a request never pays for them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, exists, func, literal_column, select, true
from sqlalchemy.orm import Session

from app.models import Lease, Node, NodeHealth, ReaperState, Reservation, Run, Step, WakeDebt
from app.states import ASKED
from app.store.queue import IS_QUEUED


@dataclass(frozen=True)
class Figures:
    runs_by_state: dict[str, int]
    queued: int
    oldest_queued_seconds: float | None  # None: nothing queued
    leases: int
    open_asks: int
    oldest_ask_seconds: float | None
    wake_debt_seconds: float | None  # None: no debt
    reservations: int  # reserved nodes
    reserving_runs: int  # runs that hold a reservation
    # reserved nodes that hold no lease (the price of
    # docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits)
    reserved_idle: int
    nodes_live: int
    reaper_last_pass_seconds: float | None  # None: no pass yet
    nodes_quarantined: int = 0  # docs/operators.md, "Quarantine"


def _age(column: Any) -> ColumnElement[Any]:
    """Seconds from the oldest ``column`` to the database's now."""
    return func.extract("epoch", func.now() - func.min(column))


def read_figures(s: Session) -> Figures:
    """One statement of scalar subqueries, each an index probe or a count of a small table
    except the run counts by state (the runs table, finished runs included, until retention
    prunes them)."""
    by_state = (
        select(Run.state.label("state"), func.count().label("n")).group_by(Run.state).subquery()
    )
    runs_by_state = select(
        func.coalesce(
            func.jsonb_object_agg(by_state.c.state, by_state.c.n),
            literal_column("'{}'::jsonb"),
        )
    ).scalar_subquery()
    # One-row aggregates, joined: each table is read once.
    queued = (
        select(func.count().label("n"), _age(Run.created_at).label("age"))
        .where(IS_QUEUED)
        .subquery()
    )
    asked = (
        select(func.count().label("n"), _age(Step.asked_at).label("age"))
        .where(Step.state == ASKED)
        .subquery()
    )
    idle = ~exists().where(Lease.node_id == Reservation.node_id)
    row = s.execute(
        select(
            runs_by_state,
            queued.c.n,
            queued.c.age,
            select(func.count()).select_from(Lease).scalar_subquery(),
            asked.c.n,
            asked.c.age,
            select(_age(WakeDebt.set_at)).scalar_subquery(),
            select(func.count()).select_from(Reservation).scalar_subquery(),
            select(func.count(func.distinct(Reservation.run_id))).scalar_subquery(),
            select(func.count()).select_from(Reservation).where(idle).scalar_subquery(),
            select(func.count()).where(Node.expires_at > func.now()).scalar_subquery(),
            select(_age(ReaperState.last_pass_at)).scalar_subquery(),
            select(func.count())
            .select_from(NodeHealth)
            .where(NodeHealth.quarantined_at.is_not(None))
            .scalar_subquery(),
        ).select_from(queued.join(asked, true()))
    ).one()

    def seconds(v: Any) -> float | None:
        return None if v is None else float(v)

    return Figures(
        runs_by_state={str(k): int(v) for k, v in (row[0] or {}).items()},
        queued=int(row[1]),
        oldest_queued_seconds=seconds(row[2]),
        leases=int(row[3]),
        open_asks=int(row[4]),
        oldest_ask_seconds=seconds(row[5]),
        wake_debt_seconds=seconds(row[6]),
        reservations=int(row[7]),
        reserving_runs=int(row[8]),
        reserved_idle=int(row[9]),
        nodes_live=int(row[10]),
        reaper_last_pass_seconds=seconds(row[11]),
        nodes_quarantined=int(row[12]),
    )
