"""retention: tombstones of pruned runs, and an index to find old sealed runs

``run_tombstones`` keeps the id of every pruned run, so that the id stays the idempotency key: a
trigger refuses a new ``runs`` row whose id has a tombstone (SQLSTATE 23505, constraint
``pk_run_tombstones``). It fires after the row is inserted, when the primary key's check has
waited for a concurrent prune to commit, and its query takes a snapshot of its own (a VOLATILE
function), so a prune that deleted the old row and wrote the tombstone in one transaction is seen.
``record_pending`` is true until the pruned run's Record is deleted (after the commit that deleted
its rows): the next pass deletes the Records a crash left behind.

``ix_runs_prunable`` lets a retention pass find the oldest runs it may prune (sealed runs and
rejected submits) without reading the rest of the history; it is built CONCURRENTLY, so writers of
``runs`` are not held meanwhile.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PRUNABLE_RUNS = "sealed_at IS NOT NULL OR (reject ->> 'Code') = '422'"

TRIGGER_FUNCTION = """
CREATE FUNCTION mediator_refuse_pruned_run_id() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM run_tombstones WHERE run_id = NEW.run_id) THEN
        RAISE EXCEPTION 'run id used by a pruned run'
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'pk_run_tombstones';
    END IF;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "run_tombstones",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column(
            "pruned_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("record_pending", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_run_tombstones")),
    )
    op.create_index(
        "ix_run_tombstones_record_pending",
        "run_tombstones",
        ["pruned_at"],
        unique=False,
        postgresql_where=sa.text("record_pending"),
    )
    op.execute(TRIGGER_FUNCTION)
    op.execute(
        "CREATE TRIGGER runs_refuse_pruned_id AFTER INSERT ON runs "
        "FOR EACH ROW EXECUTE FUNCTION mediator_refuse_pruned_run_id()"
    )
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_runs_prunable",
            "runs",
            ["ended_at"],
            unique=False,
            postgresql_where=sa.text(PRUNABLE_RUNS),
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(
            "ix_runs_prunable",
            table_name="runs",
            postgresql_concurrently=True,
            if_exists=True,
        )
    op.execute("DROP TRIGGER runs_refuse_pruned_id ON runs")
    op.execute("DROP FUNCTION mediator_refuse_pruned_run_id()")
    op.drop_index("ix_run_tombstones_record_pending", table_name="run_tombstones")
    op.drop_table("run_tombstones")
