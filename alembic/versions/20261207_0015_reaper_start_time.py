"""the reaper notices a database restart or switch

A restart or a failover may swallow what the queue was owed: a wake mark that could not be taken,
a wake debt that could not be written, the renewals of every lease while it lasted (docs/queue.md,
"Crashes and restarts"). The reaper sees one by two signs: ``reaper_state.server_started_at``
keeps the ``pg_postmaster_start_time()`` of the server its last pass ran on (a restart or another
server changes it), and ``reaper_marker`` is an UNLOGGED table holding the one row each pass
writes (crash recovery empties UNLOGGED tables and a promoted standby never had their rows,
while a crash restart keeps the start time).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NULL until the first pass after this upgrade, which does not count as a restart.
    op.add_column(
        "reaper_state", sa.Column("server_started_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_table(
        "reaper_marker",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "written_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("id = 1", name=op.f("ck_reaper_marker_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reaper_marker")),
        prefixes=["UNLOGGED"],
    )


def downgrade() -> None:
    op.drop_table("reaper_marker")
    op.drop_column("reaper_state", "server_started_at")
