"""The read statements an action sends through an app's engine, replayed under ``EXPLAIN
(ANALYZE, BUFFERS)`` to count the rows each touched (returned plus removed by a filter, times its
loops), and queued runs copied by the thousand to read them against."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import event

SLACK = 16  # rows: what a deeper index or a different tie may add, far below any growth


def _touched(plan: dict[str, Any]) -> int:
    loops = plan.get("Actual Loops", 1) or 1
    here = (
        plan.get("Actual Rows", 0)
        + plan.get("Rows Removed by Filter", 0)
        + plan.get("Rows Removed by Index Recheck", 0)
        + plan.get("Rows Removed by Join Filter", 0)
    ) * loops
    return int(here) + sum(_touched(p) for p in plan.get("Plans", []))


def _is_read(statement: str) -> bool:
    s = statement.lstrip().upper()
    side_effects = ("NEXTVAL", "SETVAL", "PG_NOTIFY", "SET_CONFIG", "INSERT", "UPDATE", "DELETE")
    return s.startswith(("SELECT", "WITH")) and not any(w in s for w in side_effects)


def reads_sent(app: Any, action: Any) -> list[tuple[str, Any]]:
    """The read statements (with their parameters) the app's engine sends while ``action``
    runs."""
    engine = app.extensions["mediator"].db.engine
    sent: list[tuple[str, Any]] = []

    def on_execute(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if _is_read(statement):
            sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", on_execute)
    try:
        action()
    finally:
        event.remove(engine, "before_cursor_execute", on_execute)
    return sent


def touched(app: Any, sent: list[tuple[str, Any]]) -> list[tuple[str, int]]:
    """(statement, rows touched) of each read, replayed under ``EXPLAIN ANALYZE``."""
    engine = app.extensions["mediator"].db.engine
    out = []
    with engine.connect() as conn:
        for statement, parameters in sent:
            explained = conn.exec_driver_sql(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, parameters
            ).scalar_one()
            plan = (explained if isinstance(explained, list) else json.loads(explained))[0]
            out.append((" ".join(statement.split())[:100], _touched(plan["Plan"])))
        conn.rollback()
    return out


def copy_queued(sql: Any, template: str, start: int, n: int, *, aged: bool) -> None:
    """``n`` copies of the queued run ``template``, named ``<template>-<start>`` onwards."""
    cols = [
        r[0]
        for r in sql.execute(
            "select column_name from information_schema.columns where table_name = 'runs'"
            " and column_name not in ('run_id', 'created_at') order by ordinal_position"
        )
    ]
    listed = ", ".join(cols)
    age = "interval '1 hour'" if aged else "interval '0'"
    sql.execute(
        f"insert into runs (run_id, created_at, {listed})"
        f" select %s || '-' || g, now() - {age} + g * interval '1 microsecond', {listed}"
        " from runs, generate_series(%s::int, %s::int) as g where run_id = %s",
        (template, start, start + n - 1, template),
    )
    sql.execute("analyze runs")
