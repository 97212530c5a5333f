"""Rows read the way an operator would: plain SQL over a psycopg connection (the ``sql`` fixture),
never through the Mediator's own code."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row


def rows(sql: Any, query: str, *args: Any) -> list[dict[str, Any]]:
    return sql.cursor(row_factory=dict_row).execute(query, args).fetchall()


def one(sql: Any, query: str, *args: Any) -> dict[str, Any]:
    row = sql.cursor(row_factory=dict_row).execute(query, args).fetchone()
    assert row is not None, (query, args)
    return row


def scalar(sql: Any, query: str, *args: Any) -> Any:
    return sql.execute(query, args).fetchone()[0]


# ---------------------------------------------------------------- runs


def find_run(sql: Any, run_id: str) -> dict[str, Any] | None:
    """The run's row, or None when there is no such run."""
    return (
        sql.cursor(row_factory=dict_row)
        .execute("select * from runs where run_id = %s", (run_id,))
        .fetchone()
    )


def run_row(sql: Any, run_id: str) -> dict[str, Any]:
    """The run's row; the run must exist."""
    row = find_run(sql, run_id)
    assert row is not None, run_id
    return row


def run_state(sql: Any, run_id: str) -> str:
    """The run's state; the run must exist."""
    return str(run_row(sql, run_id)["state"])


def transitions(sql: Any, run_id: str) -> list[tuple[str | None, str]]:
    """(from_state, to_state) of the run's audit events, oldest first."""
    return [
        (r["from_state"], r["to_state"])
        for r in rows(sql, "select * from run_events where run_id = %s order by id", run_id)
    ]


def events_like(sql: Any, run_id: str, pattern: str) -> list[str]:
    return [
        r[0]
        for r in sql.execute(
            "select cause from run_events where run_id = %s and cause like %s order by id",
            (run_id, pattern),
        )
    ]


def count_events(sql: Any, run_id: str, cause: str) -> int:
    """How many audit events of the run have that cause."""
    return scalar(
        sql, "select count(*) from run_events where run_id = %s and cause = %s", run_id, cause
    )


# ---------------------------------------------------------------- steps


def step_row(sql: Any, run_id: str, seq: int, columns: str = "*") -> dict[str, Any]:
    """The step's row (only ``columns``, a select list, when given); the step must exist."""
    return one(sql, f"select {columns} from steps where run_id = %s and seq = %s", run_id, seq)


def step_rows(sql: Any, run_id: str) -> dict[str, dict[str, Any]]:
    """step id -> its row, in seq order."""
    return {
        r["step_id"]: r
        for r in rows(sql, "select * from steps where run_id = %s order by seq", run_id)
    }


def states(sql: Any, run_id: str) -> dict[str, str]:
    """step id -> state."""
    return {sid: r["state"] for sid, r in step_rows(sql, run_id).items()}


def attempts(sql: Any, run_id: str) -> dict[str, tuple[str, int]]:
    """step id -> (state, attempt)."""
    return {sid: (r["state"], r["attempt"]) for sid, r in step_rows(sql, run_id).items()}


def step_outcomes(sql: Any, run_id: str) -> list[tuple[int, str, str | None]]:
    """(seq, state, error) of each step, by seq."""
    return [
        tuple(r)
        for r in sql.execute(
            "select seq, state, error from steps where run_id = %s order by seq", (run_id,)
        ).fetchall()
    ]


# ---------------------------------------------------------------- leases and reservations


def leases(sql: Any) -> list[tuple[str, str]]:
    """(node_id, run_id) of every lease, by node."""
    return [tuple(r) for r in sql.execute("select node_id, run_id from leases order by node_id")]


def leases_of(sql: Any, run_id: str) -> list[str]:
    """The nodes the run holds a lease on, by node."""
    return [
        r[0]
        for r in sql.execute(
            "select node_id from leases where run_id = %s order by node_id", (run_id,)
        )
    ]


def reservations(sql: Any) -> dict[str, str]:
    """node -> holder, as stored."""
    return dict(sql.execute("select node_id, run_id from reservations").fetchall())


# ---------------------------------------------------------------- every row of a run

# Every table that holds rows of a run, with the column naming it.
RUN_TABLES = ("runs", "steps", "run_events", "blobs", "leases")


def rows_of(sql: Any, run_id: str) -> dict[str, int]:
    """The run's rows in every table that holds any."""
    return {
        t: scalar(sql, f"select count(*) from {t} where run_id = %s", run_id) for t in RUN_TABLES
    }


def no_rows(sql: Any, run_id: str) -> bool:
    return all(n == 0 for n in rows_of(sql, run_id).values())


def tombstone(sql: Any, run_id: str) -> tuple[bool] | None:
    """(record_pending,) of the run's tombstone, or None when it has none."""
    return sql.execute(
        "select record_pending from run_tombstones where run_id = %s", (run_id,)
    ).fetchone()
