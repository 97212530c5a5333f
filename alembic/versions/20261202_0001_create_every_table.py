"""create every table

Revision ID: 0001
Revises: (none)
Create Date: 2026-12-02 18:48:59.832862
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Reviewed by hand from the autogenerate draft: names follow app.models.NAMING.
    op.create_table(
        "nodes",
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("label", sa.Text(), nullable=True),
        sa.Column("principal", sa.Text(), nullable=True),
        sa.Column("instance", sa.Text(), nullable=True),
        sa.Column(
            "capabilities",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("attr_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("drain", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column(
            "seen_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_nodes")),
    )
    op.create_index("ix_nodes_expires_at", "nodes", ["expires_at"], unique=False)
    op.create_table(
        "reaper_state",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("last_pass_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("id = 1", name=op.f("ck_reaper_state_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reaper_state")),
    )
    op.create_table(
        "runs",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("work_id", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("principal", sa.Text(), nullable=True),
        sa.Column("token_name", sa.Text(), nullable=True),
        sa.Column("contract", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("requires", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("requires_key", sa.Text(), nullable=False),
        sa.Column("assigned", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("reject", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("verdict", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column(
            "warnings",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("ledger_scope", sa.Text(), server_default=sa.text("'run'"), nullable=False),
        sa.Column("queue_timeout_seconds", sa.Integer(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("promoted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("sealed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('QUEUED', 'RUNNING', 'VERIFYING', 'SUCCEEDED', 'FAILED')",
            name=op.f("ck_runs_state"),
        ),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_runs")),
    )
    op.create_index(
        "ix_runs_created",
        "runs",
        [sa.literal_column("created_at DESC"), sa.literal_column("run_id DESC")],
        unique=False,
    )
    op.create_index(
        "ix_runs_queued",
        "runs",
        ["created_at", "run_id"],
        unique=False,
        postgresql_where=sa.text("state = 'QUEUED'"),
    )
    op.create_index(
        "ix_runs_queued_shape",
        "runs",
        ["requires_key", "created_at", "run_id"],
        unique=False,
        postgresql_where=sa.text("state = 'QUEUED'"),
    )
    op.create_index(
        "ix_runs_state_created",
        "runs",
        ["state", sa.literal_column("created_at DESC")],
        unique=False,
    )
    op.create_index(
        "ix_runs_unsealed",
        "runs",
        ["ended_at"],
        unique=False,
        postgresql_where=sa.text("sealed_at IS NULL AND state IN ('SUCCEEDED', 'FAILED')"),
    )
    op.create_index(
        "ix_runs_verifying",
        "runs",
        ["run_id"],
        unique=False,
        postgresql_where=sa.text("state = 'VERIFYING'"),
    )
    op.create_index("ix_runs_work_created", "runs", ["work_id", "created_at"], unique=False)
    op.create_table(
        "wake_debt",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "set_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.CheckConstraint("id = 1", name=op.f("ck_wake_debt_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_wake_debt")),
    )
    op.create_table(
        "blobs",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("work_id", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("by", sa.Text(), nullable=True),
        sa.Column(
            "at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.Column("schema_ok", sa.Boolean(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
            name=op.f("fk_blobs_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "seq", "attempt", "name", name=op.f("pk_blobs")),
    )
    op.create_index("ix_blobs_work_id", "blobs", ["work_id", "at"], unique=False)
    op.create_table(
        "leases",
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("capability", sa.Text(), nullable=False),
        sa.Column("not_after", sa.DateTime(timezone=True), nullable=False),
        sa.Column("nonce", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
            name=op.f("fk_leases_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_leases")),
    )
    op.create_index("ix_leases_not_after", "leases", ["not_after"], unique=False)
    op.create_index("ix_leases_run_id", "leases", ["run_id"], unique=False)
    op.create_table(
        "run_events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column(
            "at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("from_state", sa.Text(), nullable=True),
        sa.Column("to_state", sa.Text(), nullable=False),
        sa.Column("cause", sa.Text(), nullable=False),
        sa.Column("by", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
            name=op.f("fk_run_events_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_events")),
    )
    op.create_index("ix_run_events_run_id", "run_events", ["run_id", "id"], unique=False)
    op.create_table(
        "steps",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("step_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("uses", sa.Text(), nullable=True),
        sa.Column("node_id", sa.Text(), nullable=True),
        sa.Column(
            "needs",
            postgresql.ARRAY(sa.Integer()),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
        sa.Column("state", sa.Text(), server_default=sa.text("'PENDING'"), nullable=False),
        sa.Column("attempt", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("spec", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("claimed_instance", sa.Text(), nullable=True),
        sa.Column("envelope_key", sa.Text(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("produced", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("chosen", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("answered_by", sa.Text(), nullable=True),
        sa.Column("asked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ask_deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "kind IN ('run', 'agent', 'ask', 'acquire')", name=op.f("ck_steps_kind")
        ),
        sa.CheckConstraint(
            "state IN ('PENDING', 'CLAIMED', 'ASKED', 'DONE', 'FAILED', 'SKIPPED')",
            name=op.f("ck_steps_state"),
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
            name=op.f("fk_steps_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "seq", name=op.f("pk_steps")),
    )
    op.create_index(
        "ix_steps_ask_deadline",
        "steps",
        ["ask_deadline"],
        unique=False,
        postgresql_where=sa.text("state = 'ASKED'"),
    )
    op.create_index("ix_steps_node_state", "steps", ["node_id", "state"], unique=False)


def downgrade() -> None:
    # Reviewed by hand from the autogenerate draft: names follow app.models.NAMING.
    op.drop_index("ix_steps_node_state", table_name="steps")
    op.drop_index(
        "ix_steps_ask_deadline",
        table_name="steps",
        postgresql_where=sa.text("state = 'ASKED'"),
    )
    op.drop_table("steps")
    op.drop_index("ix_run_events_run_id", table_name="run_events")
    op.drop_table("run_events")
    op.drop_index("ix_leases_run_id", table_name="leases")
    op.drop_index("ix_leases_not_after", table_name="leases")
    op.drop_table("leases")
    op.drop_index("ix_blobs_work_id", table_name="blobs")
    op.drop_table("blobs")
    op.drop_table("wake_debt")
    op.drop_index("ix_runs_work_created", table_name="runs")
    op.drop_index(
        "ix_runs_verifying",
        table_name="runs",
        postgresql_where=sa.text("state = 'VERIFYING'"),
    )
    op.drop_index(
        "ix_runs_unsealed",
        table_name="runs",
        postgresql_where=sa.text("sealed_at IS NULL AND state IN ('SUCCEEDED', 'FAILED')"),
    )
    op.drop_index("ix_runs_state_created", table_name="runs")
    op.drop_index(
        "ix_runs_queued_shape",
        table_name="runs",
        postgresql_where=sa.text("state = 'QUEUED'"),
    )
    op.drop_index(
        "ix_runs_queued",
        table_name="runs",
        postgresql_where=sa.text("state = 'QUEUED'"),
    )
    op.drop_index("ix_runs_created", table_name="runs")
    op.drop_table("runs")
    op.drop_table("reaper_state")
    op.drop_index("ix_nodes_expires_at", table_name="nodes")
    op.drop_table("nodes")
