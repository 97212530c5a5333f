"""fair share and quotas among teams

Usage (docs/teams.md, "Fair share"): each lease carries its run's team and ``charged_until``
(its insert time at first). Only the reaper writes ``team_usage`` (decayed node-seconds, 16 slots
a team): each pass charges the leases it can lock for their time since ``charged_until`` and
advances it. A lease deletion instead leaves a ``usage_ended`` row for its time since
``charged_until``, written by a statement trigger on ``leases`` (every deleting path, cascades
and retention included, without a round trip), which the reaper folds into ``team_usage`` by
``DELETE … RETURNING``; so no request writes a row shared with another. ``team_usage_hours`` keeps
what was charged each hour, for the teams' chart of the last day.

Quotas (docs/teams.md, "Quotas"): a placement of a team with ``max_nodes`` locks that team's
``team_limits`` row, then counts the leases its runs hold (``take_team_quota``).

``queue_counts`` is kept per (priority, team) (a queued run's place counts the teams ahead of its
own); the queue gets its runs per (shape, team) in queue order (``ix_runs_queued_shape_team``)
and per team (``ix_runs_queued_team``, now in queue order).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07 20:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_USAGE_ENDED_FUNCTION = """
CREATE FUNCTION leases_usage_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO usage_ended (team, node_seconds)
    SELECT team, sum(GREATEST(extract(epoch FROM now() - charged_until), 0))
    FROM gone WHERE team <> 'health' GROUP BY team;
    RETURN NULL;
END
$$
"""

_QUEUE_COUNT_FUNCTION = """
CREATE OR REPLACE FUNCTION runs_queue_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.state = 'QUEUED' THEN
        INSERT INTO queue_counts AS c (priority, team, slot, queued)
        VALUES (OLD.priority, OLD.team, pg_backend_pid() % 16, -1)
        ON CONFLICT (priority, team, slot) DO UPDATE SET queued = c.queued - 1;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.state = 'QUEUED' THEN
        INSERT INTO queue_counts AS c (priority, team, slot, queued)
        VALUES (NEW.priority, NEW.team, pg_backend_pid() % 16, 1)
        ON CONFLICT (priority, team, slot) DO UPDATE SET queued = c.queued + 1;
    END IF;
    RETURN NULL;
END
$$
"""

_OLD_QUEUE_COUNT_FUNCTION = """
CREATE OR REPLACE FUNCTION runs_queue_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.state = 'QUEUED' THEN
        INSERT INTO queue_counts AS c (priority, slot, queued)
        VALUES (OLD.priority, pg_backend_pid() % 16, -1)
        ON CONFLICT (priority, slot) DO UPDATE SET queued = c.queued - 1;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.state = 'QUEUED' THEN
        INSERT INTO queue_counts AS c (priority, slot, queued)
        VALUES (NEW.priority, pg_backend_pid() % 16, 1)
        ON CONFLICT (priority, slot) DO UPDATE SET queued = c.queued + 1;
    END IF;
    RETURN NULL;
END
$$
"""

# A placement's quota check (docs/teams.md, "Quotas"): the team's row locked (created on first
# use), then the leases of its runs counted in a fresh snapshot (a statement inside a VOLATILE
# function sees every commit before it). ``apart``: NULL for a team counted by its stored name;
# for ``default``, the names whose leases are not its own. Over quota raises SQLSTATE MQ001 (the
# caller's transaction, or savepoint, rolls back); else it returns the nodes held.
_TAKE_TEAM_QUOTA = """
CREATE FUNCTION take_team_quota(p_team text, p_apart text[], p_width integer, p_max integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    held integer;
BEGIN
    INSERT INTO team_limits (name) VALUES (p_team) ON CONFLICT DO NOTHING;
    PERFORM 1 FROM team_limits WHERE name = p_team FOR UPDATE;
    IF p_apart IS NULL THEN
        SELECT count(*) INTO held FROM leases WHERE team = p_team;
    ELSE
        SELECT count(*) INTO held FROM leases WHERE team <> ALL(p_apart);
    END IF;
    IF held + p_width > p_max THEN
        RAISE EXCEPTION 'team % at its quota of % nodes (holding %)', p_team, p_max, held
            USING ERRCODE = 'MQ001';
    END IF;
    RETURN held;
END
$$
"""


def upgrade() -> None:
    op.add_column(
        "leases", sa.Column("team", sa.Text(), server_default=sa.text("'default'"), nullable=False)
    )
    op.add_column(
        "leases",
        sa.Column(
            "charged_until",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
    )
    op.execute("UPDATE leases SET team = runs.team FROM runs WHERE runs.run_id = leases.run_id")
    op.create_index("ix_leases_team", "leases", ["team"])
    op.create_table(
        "usage_ended",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("team", sa.Text(), nullable=False),
        sa.Column("node_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_ended")),
    )
    op.create_table(
        "team_usage",
        sa.Column("team", sa.Text(), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("node_seconds", sa.Float(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("team", "slot", name=op.f("pk_team_usage")),
    )
    op.create_table(
        "team_usage_hours",
        sa.Column("team", sa.Text(), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("team", "hour", name=op.f("pk_team_usage_hours")),
    )
    op.create_index("ix_team_usage_hours_hour", "team_usage_hours", ["hour"])
    op.create_table(
        "team_limits",
        sa.Column("name", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_team_limits")),
    )
    op.execute(_USAGE_ENDED_FUNCTION)
    op.execute(
        "CREATE TRIGGER leases_usage_ended AFTER DELETE ON leases REFERENCING OLD TABLE AS gone"
        " FOR EACH STATEMENT EXECUTE FUNCTION leases_usage_ended()"
    )
    op.execute(_TAKE_TEAM_QUOTA)

    # queue_counts per (priority, team), recounted under a lock that keeps runs still meanwhile.
    op.execute("LOCK TABLE runs IN SHARE MODE")
    op.execute("DELETE FROM queue_counts")
    op.drop_constraint("pk_queue_counts", "queue_counts", type_="primary")
    op.add_column(
        "queue_counts",
        sa.Column("team", sa.Text(), server_default=sa.text("'default'"), nullable=False),
    )
    op.create_primary_key("pk_queue_counts", "queue_counts", ["priority", "team", "slot"])
    op.execute(_QUEUE_COUNT_FUNCTION)
    op.execute(
        "INSERT INTO queue_counts (priority, team, slot, queued)"
        " SELECT priority, team, 0, count(*) FROM runs WHERE state = 'QUEUED'"
        " GROUP BY priority, team"
    )

    op.drop_index("ix_runs_queued_team", table_name="runs")
    op.create_index(
        "ix_runs_queued_team",
        "runs",
        ["team", sa.text("priority DESC"), "created_at", "run_id"],
        postgresql_where=sa.text("state = 'QUEUED'"),
    )
    op.create_index(
        "ix_runs_queued_shape_team",
        "runs",
        ["requires_key", "team", sa.text("priority DESC"), "created_at", "run_id"],
        postgresql_where=sa.text("state = 'QUEUED'"),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_queued_shape_team", table_name="runs")
    op.drop_index("ix_runs_queued_team", table_name="runs")
    op.create_index(
        "ix_runs_queued_team", "runs", ["team"], postgresql_where=sa.text("state = 'QUEUED'")
    )
    op.execute("LOCK TABLE runs IN SHARE MODE")
    op.execute("DELETE FROM queue_counts")
    op.drop_constraint("pk_queue_counts", "queue_counts", type_="primary")
    op.drop_column("queue_counts", "team")
    op.create_primary_key("pk_queue_counts", "queue_counts", ["priority", "slot"])
    op.execute(_OLD_QUEUE_COUNT_FUNCTION)
    op.execute(
        "INSERT INTO queue_counts (priority, slot, queued)"
        " SELECT priority, 0, count(*) FROM runs WHERE state = 'QUEUED' GROUP BY priority"
    )
    op.execute("DROP FUNCTION take_team_quota(text, text[], integer, integer)")
    op.execute("DROP TRIGGER leases_usage_ended ON leases")
    op.execute("DROP FUNCTION leases_usage_ended()")
    op.drop_table("team_limits")
    op.drop_index("ix_team_usage_hours_hour", table_name="team_usage_hours")
    op.drop_table("team_usage_hours")
    op.drop_table("team_usage")
    op.drop_table("usage_ended")
    op.drop_index("ix_leases_team", table_name="leases")
    op.drop_column("leases", "charged_until")
    op.drop_column("leases", "team")
