"""indexes for the live path: candidates by capability, history kept out of the reaper's reads

- ``ix_nodes_capabilities``: a GIN index (``jsonb_path_ops``) on ``nodes.capabilities``, so the
  adverts that can satisfy a role are found by containment (``capabilities @> '[{"capability":
  …, "attrs": {…}}]'``) instead of every advert of the fleet being read and decoded per request.
- ``ix_steps_open``: the open steps only (PENDING, CLAIMED, ASKED). Steps of finished runs close
  when their run ends, so this index holds the live work, not the history, and the reaper's "open
  steps of finished runs" no longer reads every step ever made.
- ``ix_runs_unsealed`` without rejected submits: those never get a Record, so they stayed in the
  partial index for ever and were filtered out on every reaper pass.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN_STEPS = "state IN ('PENDING', 'CLAIMED', 'ASKED')"
UNSEALED_BEFORE = "sealed_at IS NULL AND state IN ('SUCCEEDED', 'FAILED')"
UNSEALED = UNSEALED_BEFORE + " AND (reject IS NULL OR (reject ->> 'Code') <> '422')"


def upgrade() -> None:
    op.create_index(
        "ix_nodes_capabilities",
        "nodes",
        ["capabilities"],
        postgresql_using="gin",
        postgresql_ops={"capabilities": "jsonb_path_ops"},
    )
    op.create_index("ix_steps_open", "steps", ["run_id"], postgresql_where=sa.text(OPEN_STEPS))
    op.drop_index("ix_runs_unsealed", table_name="runs")
    op.create_index("ix_runs_unsealed", "runs", ["ended_at"], postgresql_where=sa.text(UNSEALED))


def downgrade() -> None:
    op.drop_index("ix_runs_unsealed", table_name="runs")
    op.create_index(
        "ix_runs_unsealed", "runs", ["ended_at"], postgresql_where=sa.text(UNSEALED_BEFORE)
    )
    op.drop_index("ix_steps_open", table_name="steps")
    op.drop_index("ix_nodes_capabilities", table_name="nodes")
