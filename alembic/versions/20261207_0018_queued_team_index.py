"""a team's queued runs, by index

A submit that would queue a run of a team with ``max_queued`` counts that team's QUEUED runs,
stopping at the limit (docs/teams.md, "Queue length"). ``ix_runs_queued_team`` keeps only the
QUEUED runs, by team: the count reads at most ``max_queued`` entries of its team, and the stored
team names of the queue by one probe each.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_runs_queued_team",
        "runs",
        ["team"],
        postgresql_where=sa.text("state = 'QUEUED'"),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_queued_team", table_name="runs")
