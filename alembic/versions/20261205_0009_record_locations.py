"""a run's Record location is kept on its row

``runs.record_location`` is where the run's Record lives in the Record store (a directory under
``records.root``, a key prefix in the bucket): the run id itself when it is a plain file name, else
``_h/`` and the whole sha256 of the id. It is chosen once, when the run is created, so no run id can
name another run's Record and a later rule never moves one. Runs created before this revision keep
NULL, which means the rule they were created under: the run id, else ``run-`` and the first 40 hex
digits of its sha256; their Records stay where they are and nothing is moved or renamed.

``run_tombstones.record_location`` carries the pruned run's location to the deletion of its Record,
which happens after the run's row is gone (NULL as on the row).

Both columns are nullable and have no default: adding them rewrites no table and takes only a
brief lock.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 01:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("record_location", sa.Text(), nullable=True))
    op.add_column("run_tombstones", sa.Column("record_location", sa.Text(), nullable=True))


def downgrade() -> None:
    # The previous version looks for every Record by the old rule: a run whose Record is kept
    # anywhere else (a hashed id, under _h/) would lose it, so the downgrade is refused while one
    # exists (prune such runs, or restore the backup taken before the upgrade).
    elsewhere = (
        op.get_bind()
        .execute(
            sa.text(
                "SELECT count(*) FROM runs WHERE record_location <> run_id"
                " UNION ALL SELECT count(*) FROM run_tombstones"
                " WHERE record_pending AND record_location <> run_id"
            )
        )
        .scalars()
        .all()
    )
    if any(elsewhere):
        raise RuntimeError(
            f"downgrade refused: {sum(elsewhere)} runs keep their Record where the previous "
            "version would not look for it (under _h/ of the Record store)"
        )
    op.drop_column("run_tombstones", "record_location")
    op.drop_column("runs", "record_location")
