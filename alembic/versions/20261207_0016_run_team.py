"""each run keeps the team it was submitted for

A run's team is chosen at submit (docs/teams.md, "A run's team") and stored on the run, which keeps
it even once the configuration no longer names that team. Runs created before this revision are
team ``default``, as every run of a configuration without teams is. ``ix_runs_team_created`` serves
``GET /v1/runs?team=`` in the list's order (newest first, by the (created_at, run_id) cursor).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 16:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A constant default: PostgreSQL 11+ adds the column without rewriting the table.
    op.add_column(
        "runs",
        sa.Column("team", sa.Text(), server_default=sa.text("'default'"), nullable=False),
    )
    op.create_index(
        "ix_runs_team_created",
        "runs",
        ["team", sa.text("created_at DESC"), sa.text("run_id DESC")],
    )


def downgrade() -> None:
    op.drop_index("ix_runs_team_created", table_name="runs")
    op.drop_column("runs", "team")
