"""self-declared principals are marked

A principal a caller declared in ``X-Enode-Principal`` under a token that has none of its own is
recorded as such: ``runs.principal_self_declared`` (the token is ``runs.token_name``), and beside
``steps.answered_by``, ``run_events.by`` and ``blobs.by`` the name of the token it was declared
under (NULL when the principal was the token's own, or when ``by`` names no principal). Rows
written before keep NULL and false: nothing tells which of them were declared. Adding a column
with a constant default or none rewrites no table.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 01:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "runs",
        sa.Column(
            "principal_self_declared",
            sa.Boolean(),
            server_default=sa.text("false"),
            nullable=False,
        ),
    )
    op.add_column("steps", sa.Column("answered_by_declared_token", sa.Text(), nullable=True))
    op.add_column("run_events", sa.Column("by_declared_token", sa.Text(), nullable=True))
    op.add_column("blobs", sa.Column("by_declared_token", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("blobs", "by_declared_token")
    op.drop_column("run_events", "by_declared_token")
    op.drop_column("steps", "answered_by_declared_token")
    op.drop_column("runs", "principal_self_declared")
