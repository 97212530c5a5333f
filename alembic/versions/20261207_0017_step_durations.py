"""step durations, for the expected start of a queued run

Each run or agent step that ends with a result leaves one row: how long it took from its claim to
its result, under a key naming what ran where (the step's id and kind, its ``run`` argv or
``agent.model``, its role's capability and attributes). Rows are only ever inserted (a result's
transaction) and read as the newest 50 of a key, by ``ix_step_durations_key``
(docs/queue.md, "What a QUEUED run's view explains").

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "step_durations",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_step_durations")),
    )
    # The newest rows of one key first: the estimate reads at most 50 of them.
    op.create_index("ix_step_durations_key", "step_durations", ["key", sa.text("ended_at DESC")])


def downgrade() -> None:
    op.drop_index("ix_step_durations_key", table_name="step_durations")
    op.drop_table("step_durations")
