"""the candidate read's cost does not follow the fleet (docs/design.md#targets)

``ix_nodes_order`` holds the nodes in candidate order (fewer attributes first, then ``node_id``
by code point), so that a bounded read of a requirement most of the fleet fits stops at its
limit. ``ix_nodes_capabilities`` loses GIN's pending list (``fastupdate``): every advert rewrites
its node's row, and every search read the whole pending list, which cost milliseconds a submit
at 20,000 nodes until a vacuum merged it.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_nodes_order", "nodes", ["attr_count", sa.text('node_id COLLATE "C"')])
    op.execute("ALTER INDEX ix_nodes_capabilities SET (fastupdate = off)")
    # What the pending list held goes into the index now, not at the next vacuum.
    op.execute("SELECT gin_clean_pending_list('ix_nodes_capabilities'::regclass)")


def downgrade() -> None:
    op.execute("ALTER INDEX ix_nodes_capabilities RESET (fastupdate)")
    op.drop_index("ix_nodes_order", table_name="nodes")
