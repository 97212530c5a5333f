"""attempts are counted from 0

A step's first attempt is 0 from this revision on. Runs created before it keep their numbering
(their step rows and Record files are not renumbered): ``runs.attempt_base`` is 1 for them and 0
for every run created afterwards, and the rollback limits count attempts from that base.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-04 01:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing runs get 1 (their numbering); the default for new runs is then 0.
    op.add_column(
        "runs",
        sa.Column("attempt_base", sa.Integer(), server_default=sa.text("1"), nullable=False),
    )
    op.alter_column("runs", "attempt_base", server_default=sa.text("0"))
    op.alter_column("steps", "attempt", server_default=sa.text("0"))


def downgrade() -> None:
    op.alter_column("steps", "attempt", server_default=sa.text("1"))
    op.drop_column("runs", "attempt_base")
