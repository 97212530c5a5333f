"""The Mediator's tables (SQLAlchemy 2.0, typed). Migrations in ``alembic/versions`` create them.

Constraint names are stable (naming convention) because conflicts are told apart by name
(docs/design.md#transactions-conflicts-and-retries): ``pk_runs`` is a duplicate run_id,
``pk_leases`` is a node taken by another run.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from app.states import RUN_STATES, STEP_KINDS, STEP_STATES

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# The two files a step's log name may have: the appended log and its progress
# (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log).
LOG_KINDS = ("log", "progress")

RUNS_PKEY = "pk_runs"
TOMBSTONES_PKEY = "pk_run_tombstones"  # also what the trigger names when it refuses a pruned id
LEASES_PKEY = "pk_leases"


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


# What retention may prune once old enough (docs/retention.md#what-is-pruned-and-what-is-kept):
# sealed runs, and rejected submits (reject Code 422: born FAILED, never sealed). Repeated word for
# word by the query that must use the partial index ``ix_runs_prunable`` (a parameter in its place
# would keep the plan off it).
PRUNABLE_RUNS = "sealed_at IS NOT NULL OR (reject ->> 'Code') = '422'"

# Python None is SQL NULL, not the JSON value null, so `IS NULL` finds it.
NULLABLE_JSONB = JSONB(none_as_null=True)


# A node out of service by node_health (an operator's hold or a quarantine): the predicate of
# ``ix_node_health_out``, repeated word for word by the candidate reads.
NODE_OUT = "hold_mode IS NOT NULL OR quarantined_at IS NOT NULL"

# Partial-index predicates, repeated word for word by the queries that must use them (a
# parameter in their place would keep a prepared statement's generic plan off the index).
OPEN_STEPS = "state IN ('PENDING', 'CLAIMED', 'ASKED')"
# Finished and not sealed, rejected submits left out: they never get a Record (reject Code 422).
UNSEALED_RUNS = (
    "sealed_at IS NULL AND state IN ('SUCCEEDED', 'FAILED')"
    " AND (reject IS NULL OR (reject ->> 'Code') <> '422')"
)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: DateTime(timezone=True), dict[str, Any]: JSONB, Any: JSONB}


class Node(Base):
    """The latest advert of a node; live while ``expires_at > now()``
    (docs/queue.md#heartbeats-what-a-node-learns)."""

    __tablename__ = "nodes"

    node_id: Mapped[str] = mapped_column(Text, primary_key=True)
    label: Mapped[str | None] = mapped_column(Text)
    principal: Mapped[str | None] = mapped_column(Text)
    instance: Mapped[str | None] = mapped_column(Text)
    capabilities: Mapped[Any] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    attr_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    drain: Mapped[str] = mapped_column(Text, server_default=text("''"))
    seen_at: Mapped[datetime] = mapped_column(server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column()

    __table_args__ = (
        Index("ix_nodes_expires_at", "expires_at"),
        # Candidates by containment: ``capabilities @> '[{"capability": …, "attrs": {…}}]'``,
        # for a requirement few nodes fit. Without GIN's pending list: every advert rewrites its
        # row, and a search scans the whole pending list (it cost milliseconds at 20,000 nodes).
        Index(
            "ix_nodes_capabilities",
            "capabilities",
            postgresql_using="gin",
            postgresql_ops={"capabilities": "jsonb_path_ops"},
            postgresql_with={"fastupdate": "off"},
        ),
        # Candidates in candidate order (docs/contract.md#requirements-and-how-runs-are-placed),
        # for a requirement most nodes fit: a bounded read walks it and stops at its limit.
        Index("ix_nodes_order", "attr_count", text('node_id COLLATE "C"')),
    )


def _in_queue_order(name: str, *leading: str) -> Index:
    """An index of the QUEUED runs in queue order (priority descending, then arrival) after the
    ``leading`` columns."""
    return Index(
        name,
        *leading,
        text("priority DESC"),
        "created_at",
        "run_id",
        postgresql_where=text("state = 'QUEUED'"),
    )


class Run(Base):
    __tablename__ = "runs"

    run_id: Mapped[str] = mapped_column(Text, primary_key=True)
    state: Mapped[str] = mapped_column(Text)
    work_id: Mapped[str] = mapped_column(Text, server_default=text("''"))
    principal: Mapped[str | None] = mapped_column(Text)
    token_name: Mapped[str | None] = mapped_column(Text)
    # The principal came from X-Enode-Principal, not from the token (token_name):
    # docs/tokens.md#principal.
    principal_self_declared: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    contract: Mapped[Any] = mapped_column(JSONB)
    requires: Mapped[Any] = mapped_column(JSONB)
    # A hash of the normalised requires, so a wake scan looks at the oldest run of each shape
    # (docs/design.md#the-queue).
    requires_key: Mapped[str] = mapped_column(Text)
    assigned: Mapped[Any | None] = mapped_column(NULLABLE_JSONB)
    reject: Mapped[Any | None] = mapped_column(NULLABLE_JSONB)
    verdict: Mapped[Any | None] = mapped_column(NULLABLE_JSONB)
    warnings: Mapped[Any] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    ledger_scope: Mapped[str] = mapped_column(Text, server_default=text("'run'"))
    queue_timeout_seconds: Mapped[int | None] = mapped_column(Integer)
    # The queue is ordered by priority (descending), then arrival (docs/priorities.md#priority).
    priority: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))
    # Attempts count from 0 (docs/contract.md#loop); runs created before that revision count from 1.
    attempt_base: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # Where the run's Record lives (docs/configuration.md#where-records-are-kept), chosen once at
    # creation; NULL for runs created before it was kept here, whose Record is where the old rule
    # put it (``location_of``).
    record_location: Mapped[str | None] = mapped_column(Text)
    # Bytes of the files (docs/security.md#runs-records-and-uploads) the run's steps stored (blobs,
    # logs, progress), at most ``records.max_run_bytes``; what the Mediator writes itself is not
    # counted.
    stored_bytes: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    # docs/teams.md: chosen at submit and kept, even once the configuration no longer names it.
    team: Mapped[str] = mapped_column(Text, server_default=text("'default'"))
    # A health run's node (docs/operators.md, "Health runs"): its first role's only candidate.
    pinned_node: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    promoted_at: Mapped[datetime | None] = mapped_column()
    ended_at: Mapped[datetime | None] = mapped_column()
    sealed_at: Mapped[datetime | None] = mapped_column()

    __table_args__ = (
        CheckConstraint(_in("state", RUN_STATES), name="state"),
        CheckConstraint("priority BETWEEN -100 AND 100", name="priority"),
        # The queue in its order (priority descending, then arrival), and per requirement shape
        # (docs/design.md#the-queue,
        # docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits); arrival alone for
        # the reaper's probe of the reservation age.
        _in_queue_order("ix_runs_queued"),
        _in_queue_order("ix_runs_queued_shape", "requires_key"),
        Index("ix_runs_queued_age", "created_at", postgresql_where=text("state = 'QUEUED'")),
        # The reaper's queue timeouts (docs/queue.md "Leaving the queue"): an IMMUTABLE function
        # of migration 0014.
        Index(
            "ix_runs_queue_deadline",
            text("queue_deadline(created_at, queue_timeout_seconds)"),
            postgresql_where=text("state = 'QUEUED' AND queue_timeout_seconds IS NOT NULL"),
        ),
        # GET /v1/runs: newest first, with a (created_at, run_id) cursor.
        Index("ix_runs_created", text("created_at DESC"), text("run_id DESC")),
        Index("ix_runs_state_created", "state", text("created_at DESC")),
        Index("ix_runs_work_created", "work_id", "created_at"),
        # GET /v1/runs?team=: a team's runs newest first, with the same cursor.
        Index("ix_runs_team_created", "team", text("created_at DESC"), text("run_id DESC")),
        # A team's queued runs, counted up to its max_queued at a submit that would queue
        # (docs/teams.md, "Queue length"), and a queued run's place among its team's runs; per
        # (shape, team) for the scans (docs/teams.md, "Fair share").
        _in_queue_order("ix_runs_queued_team", "team"),
        _in_queue_order("ix_runs_queued_shape_team", "requires_key", "team"),
        # A node's health runs (docs/operators.md, "Health runs").
        Index(
            "ix_runs_pinned_node", "pinned_node", postgresql_where=text("pinned_node IS NOT NULL")
        ),
        # The reaper's passes look only at the runs that need it.
        Index(
            "ix_runs_unsealed",
            "ended_at",
            postgresql_where=text(UNSEALED_RUNS),
        ),
        Index("ix_runs_verifying", "run_id", postgresql_where=text("state = 'VERIFYING'")),
        # Retention finds the oldest prunable runs first
        # (docs/retention.md#what-is-pruned-and-what-is-kept).
        Index("ix_runs_prunable", "ended_at", postgresql_where=text(PRUNABLE_RUNS)),
    )


class Step(Base):
    __tablename__ = "steps"

    run_id: Mapped[str] = mapped_column(
        Text, ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    step_id: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(Text)
    uses: Mapped[str | None] = mapped_column(Text)
    node_id: Mapped[str | None] = mapped_column(Text)
    needs: Mapped[list[int]] = mapped_column(ARRAY(Integer), server_default=text("'{}'"))
    state: Mapped[str] = mapped_column(Text, server_default=text("'PENDING'"))
    attempt: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    spec: Mapped[Any] = mapped_column(JSONB)
    # Restart detection compares the advertised instance with the one that claimed
    # (docs/queue.md#heartbeats-what-a-node-learns).
    claimed_instance: Mapped[str | None] = mapped_column(Text)
    envelope_key: Mapped[str | None] = mapped_column(Text)
    # Any exit code an operating system reports (docs/contract.md#limits): Windows codes exceed 32
    # bits.
    exit_code: Mapped[int | None] = mapped_column(BigInteger)
    produced: Mapped[Any | None] = mapped_column(NULLABLE_JSONB)
    error: Mapped[str | None] = mapped_column(Text)
    result: Mapped[Any | None] = mapped_column(NULLABLE_JSONB)
    chosen: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    answered_by: Mapped[str | None] = mapped_column(Text)
    # The token's name when answered_by is a principal self-declared under it
    # (docs/tokens.md#principal).
    answered_by_declared_token: Mapped[str | None] = mapped_column(Text)
    # Distinct files (docs/security.md#runs-records-and-uploads) the step stored (each blob's
    # (attempt, name), each log, each progress of a name), at most ``records.max_step_files``.
    stored_files: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    asked_at: Mapped[datetime | None] = mapped_column()
    ask_deadline: Mapped[datetime | None] = mapped_column()
    started_at: Mapped[datetime | None] = mapped_column()
    ended_at: Mapped[datetime | None] = mapped_column()

    __table_args__ = (
        CheckConstraint(_in("state", STEP_STATES), name="state"),
        CheckConstraint(_in("kind", STEP_KINDS), name="kind"),
        # Claims and restart detection look up steps by node and state.
        Index("ix_steps_node_state", "node_id", "state"),
        Index("ix_steps_ask_deadline", "ask_deadline", postgresql_where=text("state = 'ASKED'")),
        # The live work only: steps close when their run ends, so history stays out of it.
        Index("ix_steps_open", "run_id", postgresql_where=text(OPEN_STEPS)),
    )


class Lease(Base):
    """A node granted to a run. ``node_id`` is the primary key: a node is never held twice."""

    __tablename__ = "leases"

    node_id: Mapped[str] = mapped_column(Text, primary_key=True)
    run_id: Mapped[str] = mapped_column(Text, ForeignKey("runs.run_id", ondelete="CASCADE"))
    role: Mapped[str] = mapped_column(Text)
    capability: Mapped[str] = mapped_column(Text)
    not_after: Mapped[datetime] = mapped_column()
    nonce: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    # docs/teams.md, "Fair share": the run's stored team, and the time up to which the reaper has
    # charged this lease's node-seconds to it (its insert time at first).
    team: Mapped[str] = mapped_column(Text, server_default=text("'default'"))
    charged_until: Mapped[datetime] = mapped_column(server_default=func.now())

    __table_args__ = (
        Index("ix_leases_run_id", "run_id"),
        Index("ix_leases_not_after", "not_after"),
        Index("ix_leases_team", "team"),
    )


class Placement(Base):
    """When a run of ``priority`` was last placed on ``node_id`` (a lease insert: submit,
    promotion, acquire). "Overtaken" is read from here, not from leases still held
    (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits)."""

    __tablename__ = "placements"

    node_id: Mapped[str] = mapped_column(Text, primary_key=True)
    priority: Mapped[int] = mapped_column(Integer, primary_key=True)
    last_at: Mapped[datetime] = mapped_column(server_default=func.now())


class QueueCount(Base):
    """How many runs of ``priority`` are QUEUED, in slots summed by the reader: kept by a row
    trigger on ``runs`` (migration 0013), never written by the Mediator's code. A queued run's
    place in the queue is read from it instead of a count of the queue
    (docs/queue.md#what-a-queued-runs-view-explains, docs/design.md#targets)."""

    __tablename__ = "queue_counts"

    priority: Mapped[int] = mapped_column(Integer, primary_key=True)
    # The stored team (migration 0019): a run's place counts the teams ahead of its own.
    team: Mapped[str] = mapped_column(Text, primary_key=True, server_default=text("'default'"))
    slot: Mapped[int] = mapped_column(Integer, primary_key=True)
    queued: Mapped[int] = mapped_column(BigInteger)


class NodeHealth(Base):
    """What an operator and the Mediator keep about a node apart from its advert
    (docs/operators.md): an operator's hold, strikes, quarantine and health runs."""

    __tablename__ = "node_health"

    node_id: Mapped[str] = mapped_column(Text, primary_key=True)
    hold_mode: Mapped[str | None] = mapped_column(Text)
    hold_reason: Mapped[str | None] = mapped_column(Text)
    hold_by: Mapped[str | None] = mapped_column(Text)
    hold_at: Mapped[datetime | None] = mapped_column()
    strikes: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    quarantined_at: Mapped[datetime | None] = mapped_column()
    quarantine_reason: Mapped[str | None] = mapped_column(Text)
    quarantine_by: Mapped[str | None] = mapped_column(Text)
    health_runs: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    health_queued_at: Mapped[datetime | None] = mapped_column()
    health_ended_at: Mapped[datetime | None] = mapped_column()

    __table_args__ = (
        CheckConstraint(
            "hold_mode IS NULL OR hold_mode IN ('graceful', 'at-boundary')", name="hold_mode"
        ),
        Index(
            "ix_node_health_out",
            "node_id",
            postgresql_where=text(NODE_OUT),
        ),
    )


class NodeEvent(Base):
    """A change of a node's hold, strikes or quarantine, with its reason (docs/operators.md)."""

    __tablename__ = "node_events"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(server_default=func.now())
    change: Mapped[str] = mapped_column(Text)
    reason: Mapped[str | None] = mapped_column(Text)
    by: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (Index("ix_node_events_node_id", "node_id", "at"),)


class UsageEnded(Base):
    """Node-seconds of leases deleted since their last charge, by team: written by a statement
    trigger on ``leases`` (migration 0019), folded into ``team_usage`` and deleted by the reaper
    alone (docs/teams.md, "Fair share")."""

    __tablename__ = "usage_ended"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    team: Mapped[str] = mapped_column(Text)
    node_seconds: Mapped[float] = mapped_column(Float)


class TeamUsage(Base):
    """A team's decayed node-seconds as of ``at``, in 16 slots summed by the reader, each
    decayed from its own ``at``; written by the reaper alone (docs/teams.md, "Fair share")."""

    __tablename__ = "team_usage"

    team: Mapped[str] = mapped_column(Text, primary_key=True)
    slot: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_seconds: Mapped[float] = mapped_column(Float)
    at: Mapped[datetime] = mapped_column(server_default=func.now())


class TeamUsageHour(Base):
    """Node-seconds charged to a team in an hour (not decayed): the teams' chart of the last
    day. Written by the reaper alone; hours older than two days are deleted by it."""

    __tablename__ = "team_usage_hours"

    team: Mapped[str] = mapped_column(Text, primary_key=True)
    hour: Mapped[datetime] = mapped_column(primary_key=True)
    node_seconds: Mapped[float] = mapped_column(Float)

    __table_args__ = (Index("ix_team_usage_hours_hour", "hour"),)


class TeamLimit(Base):
    """One row per team with ``max_nodes`` that placed: locked by its placements
    (``take_team_quota``, migration 0019; docs/teams.md, "Quotas")."""

    __tablename__ = "team_limits"

    name: Mapped[str] = mapped_column(Text, primary_key=True)


class Reservation(Base):
    """A node a long-waiting QUEUED run holds back from runs of its priority or lower
    (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits). Rewritten by every wake
    scan; deleted with the holder's promotion, cancel or queue timeout."""

    __tablename__ = "reservations"

    node_id: Mapped[str] = mapped_column(Text, primary_key=True)
    run_id: Mapped[str] = mapped_column(Text, ForeignKey("runs.run_id", ondelete="CASCADE"))
    since: Mapped[datetime] = mapped_column(server_default=func.now())

    __table_args__ = (Index("ix_reservations_run_id", "run_id"),)


class StepDuration(Base):
    """How long a run or agent step took from its claim to its result, under its duration key
    (``app/estimate.py``): inserted by the result's transaction, never updated, read as the
    newest 50 of a key for the expected start of a queued run (docs/queue.md, "What a QUEUED
    run's view explains")."""

    __tablename__ = "step_durations"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(Text)
    seconds: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[datetime] = mapped_column()

    __table_args__ = (Index("ix_step_durations_key", "key", text("ended_at DESC")),)


class RunEvent(Base):
    """The audit trail: every state change of a run
    (docs/api.md#get-v1runsrun_idevents--a-runs-audit-trail)."""

    __tablename__ = "run_events"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(Text, ForeignKey("runs.run_id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(server_default=func.now())
    from_state: Mapped[str | None] = mapped_column(Text)
    to_state: Mapped[str] = mapped_column(Text)
    cause: Mapped[str] = mapped_column(Text)
    by: Mapped[str | None] = mapped_column(Text)
    # The token's name when ``by`` is a principal self-declared under it (docs/tokens.md#principal).
    by_declared_token: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (Index("ix_run_events_run_id", "run_id", "id"),)


class Blob(Base):
    """Ledger metadata of one stored artifact; the bytes live in the Record
    (docs/api.md#get-v1runsrun_idledger--the-artifacts-a-run-can-see)."""

    __tablename__ = "blobs"

    run_id: Mapped[str] = mapped_column(
        Text, ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    work_id: Mapped[str] = mapped_column(Text, server_default=text("''"))
    by: Mapped[str | None] = mapped_column(Text)
    # The token's name when ``by`` is a principal self-declared under it (docs/tokens.md#principal).
    by_declared_token: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(server_default=func.now())
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(Text)
    schema_ok: Mapped[bool | None] = mapped_column(Boolean)

    __table_args__ = (Index("ix_blobs_work_id", "work_id", "at"),)


class LogFile(Base):
    """A log of a step, or its progress (``kind``), as last written: its length (what the run's
    ``stored_bytes`` counts for it) and, for progress, the attempt it holds
    (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log,
    docs/security.md#runs-records-and-uploads). A row is the step's file: the first append of a
    (kind, name) makes it."""

    __tablename__ = "log_files"

    run_id: Mapped[str] = mapped_column(
        Text, ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(Text, primary_key=True)
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    bytes: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))

    __table_args__ = (CheckConstraint(_in("kind", LOG_KINDS), name="kind"),)


class RunTombstone(Base):
    """The id of a pruned run (docs/retention.md#what-is-pruned-and-what-is-kept): a trigger on
    ``runs`` refuses the id again (migration 0005), so it stays the idempotency key.
    ``record_pending`` until its Record is deleted."""

    __tablename__ = "run_tombstones"

    run_id: Mapped[str] = mapped_column(Text, primary_key=True)
    pruned_at: Mapped[datetime] = mapped_column(server_default=func.now())
    record_pending: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))
    record_location: Mapped[str | None] = mapped_column(Text)  # the run's, NULL as on its row

    __table_args__ = (
        Index(
            "ix_run_tombstones_record_pending", "pruned_at", postgresql_where=text("record_pending")
        ),
    )


class WakeDebt(Base):
    """One row: a wake failed after its freeing commit; the reaper's next pass scans
    (docs/queue.md#crashes-and-restarts)."""

    __tablename__ = "wake_debt"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    set_at: Mapped[datetime] = mapped_column(server_default=func.now())
    reason: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (CheckConstraint("id = 1", name="one_row"),)


class ReaperState(Base):
    __tablename__ = "reaper_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    last_pass_at: Mapped[datetime | None] = mapped_column()
    # The ``wake_mark`` this pass read: the next pass scans when it exceeds ``wake_covered``
    # (docs/design.md#the-scan-gate-and-wake-marks).
    wake_mark: Mapped[int | None] = mapped_column(BigInteger)
    # ``pg_postmaster_start_time()`` of the server the last pass ran on: another value means the
    # database restarted or switched since (docs/queue.md, "Crashes and restarts").
    server_started_at: Mapped[datetime | None] = mapped_column()

    __table_args__ = (CheckConstraint("id = 1", name="one_row"),)


class ReaperMarker(Base):
    """One row each reaper pass writes, in an UNLOGGED table: crash recovery empties it and a
    promoted standby never had it, so a pass that finds no row sees the database restarted or
    switched even where the start time stayed the same (docs/queue.md, "Crashes and restarts")."""

    __tablename__ = "reaper_marker"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    written_at: Mapped[datetime] = mapped_column(server_default=func.now())

    __table_args__ = (CheckConstraint("id = 1", name="one_row"), {"prefixes": ["UNLOGGED"]})


class AuthFailure(Base):
    """Failed authentications of one client address in its current minute
    (docs/security.md#tokens-and-authentication), counted by every serving process in the same
    row."""

    __tablename__ = "auth_failures"

    address: Mapped[str] = mapped_column(Text, primary_key=True)
    window_start: Mapped[datetime] = mapped_column(server_default=func.now())
    failures: Mapped[int] = mapped_column(Integer, server_default=text("0"))


class UiSession(Base):
    """A signed-in browser (docs/pages.md#signing-in): the cookie holds a random id, the row its
    SHA-256, so a copy of the table signs nobody in. ``entry_digest`` is the digest of the token's
    entry at sign-in: a removed or changed entry ends the session."""

    __tablename__ = "ui_sessions"

    id_digest: Mapped[str] = mapped_column(Text, primary_key=True)
    token_name: Mapped[str] = mapped_column(Text)
    entry_digest: Mapped[str] = mapped_column(Text)
    principal: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(index=True)


class UiSecret(Base):
    """One row: the key every serving process signs the pages' CSRF tokens with."""

    __tablename__ = "ui_secret"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(Text)

    __table_args__ = (CheckConstraint("id = 1", name="one_row"),)
