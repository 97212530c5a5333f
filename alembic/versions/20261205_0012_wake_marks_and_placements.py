"""wake marks, the reaper's last mark, and the record of placements

``wake_mark`` is a sequence every wake point advances right after its freeing commit;
``wake_covered`` holds the highest mark a successful scan has covered, and
``reaper_state.wake_mark`` the mark each reaper pass read: the next pass scans when that value is
above ``wake_covered``, so a skip in favour of a waiter that never scans is paid within two
reaper periods (docs/design.md#the-scan-gate-and-wake-marks). Both sequences have CACHE 1, so every
process sees one order of marks.

``placements (node_id, priority) -> last_at`` is upserted by every lease insert (submit,
promotion, acquire): "a run of lower priority was placed on a candidate while this run waited" is
read from it, not from leases still held
(docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("CREATE SEQUENCE wake_mark AS bigint MINVALUE 0 START 1 CACHE 1")
    op.execute("CREATE SEQUENCE wake_covered AS bigint MINVALUE 0 START 0 CACHE 1")
    op.add_column("reaper_state", sa.Column("wake_mark", sa.BigInteger(), nullable=True))
    op.create_table(
        "placements",
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column(
            "last_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("node_id", "priority", name=op.f("pk_placements")),
    )
    # Seeded from the leases held now, so an upgrade forgets no placement a waiting run counts.
    op.execute(
        "INSERT INTO placements (node_id, priority, last_at) "
        "SELECT l.node_id, r.priority, max(l.created_at) "
        "FROM leases l JOIN runs r USING (run_id) GROUP BY l.node_id, r.priority"
    )


def downgrade() -> None:
    op.drop_table("placements")
    op.drop_column("reaper_state", "wake_mark")
    op.execute("DROP SEQUENCE wake_covered")
    op.execute("DROP SEQUENCE wake_mark")
