"""queue priorities and reservations

``runs.priority`` (the contract's ``queue.priority``, -100..100, default 0) orders the queue:
priority descending, then arrival. The two queue indexes follow that order, so a wake scan still
reads the head of each requirement shape with one index probe; arrival order alone stays
indexed (``ix_runs_queued_age``) for the reaper's probe of runs that crossed the reservation age.
``reservations`` holds the nodes a long-waiting run has reserved, one row per node.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

QUEUED = sa.text("state = 'QUEUED'")


def upgrade() -> None:
    op.add_column(
        "runs",
        sa.Column("priority", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
    )
    op.create_check_constraint(op.f("ck_runs_priority"), "runs", "priority BETWEEN -100 AND 100")
    op.drop_index("ix_runs_queued", table_name="runs", postgresql_where=QUEUED)
    op.drop_index("ix_runs_queued_shape", table_name="runs", postgresql_where=QUEUED)
    op.create_index(
        "ix_runs_queued",
        "runs",
        [sa.text("priority DESC"), "created_at", "run_id"],
        postgresql_where=QUEUED,
    )
    op.create_index(
        "ix_runs_queued_shape",
        "runs",
        ["requires_key", sa.text("priority DESC"), "created_at", "run_id"],
        postgresql_where=QUEUED,
    )
    op.create_index("ix_runs_queued_age", "runs", ["created_at"], postgresql_where=QUEUED)
    op.create_table(
        "reservations",
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column(
            "since", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
            name="fk_reservations_run_id_runs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("node_id", name="pk_reservations"),
    )
    op.create_index("ix_reservations_run_id", "reservations", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_reservations_run_id", table_name="reservations")
    op.drop_table("reservations")
    op.drop_index("ix_runs_queued_age", table_name="runs", postgresql_where=QUEUED)
    op.drop_index("ix_runs_queued_shape", table_name="runs", postgresql_where=QUEUED)
    op.drop_index("ix_runs_queued", table_name="runs", postgresql_where=QUEUED)
    op.create_index("ix_runs_queued", "runs", ["created_at", "run_id"], postgresql_where=QUEUED)
    op.create_index(
        "ix_runs_queued_shape",
        "runs",
        ["requires_key", "created_at", "run_id"],
        postgresql_where=QUEUED,
    )
    op.drop_constraint(op.f("ck_runs_priority"), "runs", type_="check")
    op.drop_column("runs", "priority")
