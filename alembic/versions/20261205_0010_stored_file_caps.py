"""caps on the files a run stores

``runs.stored_bytes`` counts the bytes of the files a run's steps stored (blobs, logs and their
progress), ``steps.stored_files`` the distinct files of each step, and ``log_files`` holds the length
of each log and progress as last written (and, for progress, its attempt): the uploads check the
caps ``records.max_run_bytes`` and ``records.max_step_files`` against them in the transaction that
records them, whichever process or host serves it (docs/security.md#runs-records-and-uploads).

Runs that have not finished are given the counts of the blobs their steps stored already (uploads
only: the Mediator's own answers and acquire results are written ``by`` a principal or
``mediator`` on steps of kind ask or acquire, which no node uploads to). Their logs were never
measured in the database: the next append to each counts it whole, as a file and in bytes.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UNFINISHED = "('QUEUED', 'RUNNING', 'VERIFYING')"
UPLOADED = f"""
    FROM blobs b JOIN steps s ON s.run_id = b.run_id AND s.seq = b.seq
    JOIN runs r ON r.run_id = b.run_id
    WHERE r.state IN {UNFINISHED} AND s.kind IN ('run', 'agent')
"""


def upgrade() -> None:
    # Constant defaults: a change of the catalog only, no table is rewritten.
    op.add_column(
        "runs",
        sa.Column("stored_bytes", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column(
        "steps",
        sa.Column("stored_files", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.create_table(
        "log_files",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("bytes", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.CheckConstraint("kind IN ('log', 'progress')", name=op.f("ck_log_files_kind")),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
            name=op.f("fk_log_files_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "seq", "kind", "name", name=op.f("pk_log_files")),
    )
    op.execute(
        f"""
        UPDATE runs SET stored_bytes = t.total
        FROM (SELECT b.run_id, sum(b.bytes) AS total {UPLOADED} GROUP BY b.run_id) t
        WHERE runs.run_id = t.run_id
        """
    )
    op.execute(
        f"""
        UPDATE steps SET stored_files = t.files
        FROM (SELECT b.run_id, b.seq, count(*) AS files {UPLOADED} GROUP BY b.run_id, b.seq) t
        WHERE steps.run_id = t.run_id AND steps.seq = t.seq
        """
    )


def downgrade() -> None:
    op.drop_table("log_files")
    op.drop_column("steps", "stored_files")
    op.drop_column("runs", "stored_bytes")
