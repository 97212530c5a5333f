"""exit codes are 64-bit

``steps.exit_code`` holds every exit code an operating system reports: Windows reports NTSTATUS
values such as 0xC0000005 as 3221225477, beyond a PostgreSQL ``integer``. Widening the column
rewrites ``steps`` under an ACCESS EXCLUSIVE lock; every stored value fits the new type.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.alter_column("steps", "exit_code", type_=sa.BigInteger(), existing_type=sa.Integer())


def downgrade() -> None:
    # Refused by PostgreSQL ("integer out of range") while a step holds a code beyond 32 bits:
    # narrowing would have to lose it.
    op.alter_column("steps", "exit_code", type_=sa.Integer(), existing_type=sa.BigInteger())
