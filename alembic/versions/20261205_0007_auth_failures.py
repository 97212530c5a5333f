"""auth_failures: failed authentications by client address, shared by every serving process

One row per address that failed to authenticate: the start of its current one-minute window and the
failures in it. Every process and host counts into the same row (one upsert per failed request),
so an address is answered 429 after ``auth.max_failures_per_minute`` failures however its requests
were spread over workers. Rows of windows long past are deleted by the reaper's pass.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "auth_failures",
        sa.Column("address", sa.Text(), nullable=False),
        sa.Column(
            "window_start",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("failures", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("address", name=op.f("pk_auth_failures")),
    )


def downgrade() -> None:
    op.drop_table("auth_failures")
