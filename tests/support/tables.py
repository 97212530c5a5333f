"""Emptying the Mediator's tables between tests, so each test starts from no rows.

``DELETE`` rather than ``TRUNCATE``: on tables this small a ``TRUNCATE`` of fourteen tables costs
tens of milliseconds (new files for every table and index, flushed at commit), a ``DELETE`` of each
about one, and the suite empties them a few thousand times. The sequences the tables own go back to
their start as ``RESTART IDENTITY`` would, and so do the wake marks
(docs/design.md#the-scan-gate-and-wake-marks), which no table owns.
"""

from __future__ import annotations

from typing import Any

# Every table a test can write, the ones that reference ``runs`` before it (``ui_secret`` stays:
# it is the pages' signing key, made once per database).
TABLES = (
    "blobs",
    "leases",
    "run_events",
    "steps",
    "reservations",
    "log_files",
    "placements",
    "runs",
    "queue_counts",
    "nodes",
    "wake_debt",
    "reaper_state",
    "reaper_marker",
    "run_tombstones",
    "auth_failures",
    "ui_sessions",
    "step_durations",
    # After leases: deleting a lease writes its usage_ended row.
    "usage_ended",
    "team_usage",
    "team_usage_hours",
    "team_limits",
    "node_health",
    "node_events",
)

_OWNED_SEQUENCES = """
SELECT s.oid::regclass::text FROM pg_class s
JOIN pg_depend d ON d.objid = s.oid AND d.deptype IN ('a', 'i')
WHERE s.relkind = 'S' AND d.refobjid = ANY(%s::regclass[])
"""

RESET_WAKE_MARKS = "SELECT setval('wake_mark', 1, false), setval('wake_covered', 0)"


def empty_tables(conn: Any) -> None:
    """Delete every row of :data:`TABLES` and restart their sequences and the wake marks, in one
    transaction on ``conn`` (a psycopg connection in autocommit mode)."""
    sequences = [row[0] for row in conn.execute(_OWNED_SEQUENCES, (list(TABLES),))]
    statements = [f"DELETE FROM {table}" for table in TABLES]
    statements += [f"SELECT setval('{seq}', 1, false)" for seq in sequences]
    statements.append(RESET_WAKE_MARKS)
    with conn.transaction():
        conn.execute("; ".join(statements))
