"""the reaper finds QUEUED runs past their ``queue.timeout`` through an index on the deadline

The reaper's queue-timeout read (docs/queue.md, "Leaving the queue") compared
``created_at + queue_timeout_seconds`` with ``now()`` for every QUEUED run that has a timeout: a
read that grew with the queue, paid by every pass. ``queue_deadline(created_at, seconds)`` is that
sum as an IMMUTABLE function (an interval of seconds alone is added the same way in every time
zone), and ``ix_runs_queue_deadline`` indexes it over QUEUED runs with a timeout, so the pass
reads only the runs whose deadline passed.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE FUNCTION queue_deadline(created timestamptz, seconds integer)"
        " RETURNS timestamptz LANGUAGE sql IMMUTABLE PARALLEL SAFE"
        " RETURN created + make_interval(secs => seconds)"
    )
    op.execute(
        "CREATE INDEX ix_runs_queue_deadline ON runs"
        " (queue_deadline(created_at, queue_timeout_seconds))"
        " WHERE state = 'QUEUED' AND queue_timeout_seconds IS NOT NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX ix_runs_queue_deadline")
    op.execute("DROP FUNCTION queue_deadline(timestamptz, integer)")
