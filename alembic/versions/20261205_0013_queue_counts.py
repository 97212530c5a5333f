"""the number of QUEUED runs per priority, kept by a trigger on ``runs``

A queued run's place in the queue (docs/queue.md#what-a-queued-runs-view-explains: ``ahead``, the
QUEUED runs ahead of it) was a count over every QUEUED run of its priority and above, paid by every
queued submit's 202 and growing with the queue. ``queue_counts (priority, slot) -> queued`` holds
those numbers; a row trigger on ``runs`` adds one when a run enters QUEUED and takes one away when
it leaves it (promotion, cancel, queue timeout) or is deleted while QUEUED, in the same transaction,
so a statement reads counts and runs from one snapshot. Each connection writes the slot of its
backend's process id (16 slots), so concurrent submits rarely wait on one counter row.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FUNCTION = """
CREATE FUNCTION runs_queue_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.state = 'QUEUED' THEN
        INSERT INTO queue_counts AS c (priority, slot, queued)
        VALUES (OLD.priority, pg_backend_pid() % 16, -1)
        ON CONFLICT (priority, slot) DO UPDATE SET queued = c.queued - 1;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.state = 'QUEUED' THEN
        INSERT INTO queue_counts AS c (priority, slot, queued)
        VALUES (NEW.priority, pg_backend_pid() % 16, 1)
        ON CONFLICT (priority, slot) DO UPDATE SET queued = c.queued + 1;
    END IF;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "queue_counts",
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("queued", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("priority", "slot", name="pk_queue_counts"),
    )
    op.execute(_FUNCTION)
    op.execute(
        "CREATE TRIGGER runs_queue_count_insert AFTER INSERT ON runs FOR EACH ROW"
        " WHEN (NEW.state = 'QUEUED') EXECUTE FUNCTION runs_queue_count()"
    )
    op.execute(
        "CREATE TRIGGER runs_queue_count_update AFTER UPDATE OF state, priority ON runs"
        " FOR EACH ROW WHEN ((OLD.state = 'QUEUED' OR NEW.state = 'QUEUED')"
        " AND (OLD.state IS DISTINCT FROM NEW.state OR OLD.priority <> NEW.priority))"
        " EXECUTE FUNCTION runs_queue_count()"
    )
    op.execute(
        "CREATE TRIGGER runs_queue_count_delete AFTER DELETE ON runs FOR EACH ROW"
        " WHEN (OLD.state = 'QUEUED') EXECUTE FUNCTION runs_queue_count()"
    )
    # The runs already waiting, counted once under the lock the triggers' creation took.
    op.execute(
        "INSERT INTO queue_counts (priority, slot, queued)"
        " SELECT priority, 0, count(*) FROM runs WHERE state = 'QUEUED' GROUP BY priority"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER runs_queue_count_delete ON runs")
    op.execute("DROP TRIGGER runs_queue_count_update ON runs")
    op.execute("DROP TRIGGER runs_queue_count_insert ON runs")
    op.execute("DROP FUNCTION runs_queue_count()")
    op.drop_table("queue_counts")
