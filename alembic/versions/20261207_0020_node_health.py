"""operators' holds and quarantine, per node (docs/operators.md)

``node_health`` keeps what is not the node's own advert: an operator's hold (a drain with its
mode, reason, who and when), the node's strikes, its quarantine (since when, why, by whom) and its
health runs (how many were queued, when the last one was queued and when it ended). ``nodes``
stays the advert's alone. ``node_events`` is the history of those changes, each with its reason.
A health run stores the node it is pinned to (``runs.pinned_node``).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07 22:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_health",
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("hold_mode", sa.Text(), nullable=True),
        sa.Column("hold_reason", sa.Text(), nullable=True),
        sa.Column("hold_by", sa.Text(), nullable=True),
        sa.Column("hold_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("strikes", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("quarantined_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("quarantine_reason", sa.Text(), nullable=True),
        sa.Column("quarantine_by", sa.Text(), nullable=True),
        sa.Column("health_runs", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("health_queued_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("health_ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "hold_mode IS NULL OR hold_mode IN ('graceful', 'at-boundary')",
            name=op.f("ck_node_health_hold_mode"),
        ),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_node_health")),
    )
    # The nodes out of service by this table (a hold or a quarantine): what every candidate
    # read probes, one index entry each.
    op.create_index(
        "ix_node_health_out",
        "node_health",
        ["node_id"],
        postgresql_where=sa.text("hold_mode IS NOT NULL OR quarantined_at IS NOT NULL"),
    )
    op.create_table(
        "node_events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("change", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("by", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_events")),
    )
    op.create_index("ix_node_events_node_id", "node_events", ["node_id", "at"])
    op.add_column("runs", sa.Column("pinned_node", sa.Text(), nullable=True))
    # A node's health runs (at most one open): the reaper's look for a due one, a hand lift.
    op.create_index(
        "ix_runs_pinned_node",
        "runs",
        ["pinned_node"],
        postgresql_where=sa.text("pinned_node IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_pinned_node", table_name="runs")
    op.drop_column("runs", "pinned_node")
    op.drop_index("ix_node_events_node_id", table_name="node_events")
    op.drop_table("node_events")
    op.drop_index("ix_node_health_out", table_name="node_health")
    op.drop_table("node_health")
