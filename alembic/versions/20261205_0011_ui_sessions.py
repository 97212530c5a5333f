"""sessions of the pages for people

``ui_sessions`` holds one row per signed-in browser (docs/pages.md#signing-in): the SHA-256 of the
random 256-bit id its cookie carries (a copy of the table yields no cookie), the token's name, a
digest of the token's configuration entry (a removed or changed entry ends the session), the
principal and the expiry. ``ui_secret`` holds the one random key every serving process signs the
pages' CSRF tokens with, so a form served by one worker is accepted by another, on any host.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 12:00:00
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ui_sessions",
        sa.Column("id_digest", sa.Text(), nullable=False),
        sa.Column("token_name", sa.Text(), nullable=False),
        sa.Column("entry_digest", sa.Text(), nullable=False),
        sa.Column("principal", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id_digest", name=op.f("pk_ui_sessions")),
    )
    op.create_index(op.f("ix_ui_sessions_expires_at"), "ui_sessions", ["expires_at"])
    op.create_table(
        "ui_secret",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_ui_secret_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ui_secret")),
    )
    op.execute(
        sa.text("INSERT INTO ui_secret (id, key) VALUES (1, :key)").bindparams(
            key=secrets.token_hex(32)
        )
    )


def downgrade() -> None:
    op.drop_table("ui_secret")
    op.drop_index(op.f("ix_ui_sessions_expires_at"), table_name="ui_sessions")
    op.drop_table("ui_sessions")
