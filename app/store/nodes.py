"""Node adverts: the fleet as the matcher sees it."""

from __future__ import annotations

import functools
import json
from collections import namedtuple
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, Integer, Select, bindparam, func, or_, select, text, union
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from app.contract.types import Role
from app.match import Advert, Firsts, adverts_from_rows, candidate_order
from app.models import NODE_OUT, Lease, Node, NodeHealth, Reservation, Run
from app.reserve import Held
from app.store.node_health import OUT_OF_SERVICE
from app.store.pipeline import fetch


@dataclass(frozen=True)
class PreviousAdvert:
    drain: str
    capabilities: Any
    live: bool


@dataclass(frozen=True)
class Heartbeat:
    """What :func:`heartbeat` found and did. ``restarted``: a step of this node is CLAIMED by
    another instance, and nothing was written (the caller takes the restart path)."""

    restarted: bool
    previous: PreviousAdvert | None
    leases: list[LeaseLine]


@dataclass(frozen=True)
class LeaseLine:
    """One lease of the heartbeat reply (docs/queue.md#heartbeats-what-a-node-learns)."""

    run_id: str
    node_id: str
    capability: str
    not_after: datetime
    nonce: str


_HEARTBEAT = text(
    """
    WITH prev AS (
      SELECT drain, capabilities, expires_at > now() AS live FROM nodes
      WHERE node_id = :node_id FOR UPDATE
    ), look AS (
      SELECT
        EXISTS (
          SELECT 1 FROM steps
          WHERE steps.node_id = :node_id AND steps.state = 'CLAIMED'
            AND steps.claimed_instance IS NOT NULL AND steps.claimed_instance <> :instance
        ) AS restarted,
        -- Soft state (a renewal of a live advert that changes neither its capabilities nor its
        -- drain) commits without waiting for the disk or a standby; anything else, as the
        -- server is configured (docs/deploy.md#11-a-database-with-a-standby).
        set_config('synchronous_commit', CASE WHEN EXISTS (
            SELECT 1 FROM prev WHERE prev.live AND prev.capabilities = :capabilities
              AND prev.drain = :drain
          ) THEN 'off' ELSE current_setting('synchronous_commit') END, true) AS soft
    ), go AS (
      SELECT 1 FROM look WHERE NOT (CAST(:check_restart AS boolean) AND look.restarted)
    ), renewed AS (
      UPDATE leases SET not_after = now() + make_interval(secs => :window)
      WHERE leases.node_id = :node_id
        AND EXISTS (SELECT 1 FROM go)
        AND NOT EXISTS (
          SELECT 1 FROM runs
          WHERE runs.run_id = leases.run_id AND runs.state IN ('SUCCEEDED', 'FAILED')
        )
      RETURNING leases.run_id, leases.node_id, leases.capability, leases.not_after, leases.nonce
    ), stored AS (
      INSERT INTO nodes AS n (node_id, label, principal, instance, capabilities, attr_count, drain,
                              seen_at, expires_at)
      SELECT :node_id, :label, :principal, :instance, :capabilities, :attr_count, :drain,
             now(), now() + make_interval(secs => :window)
      FROM go LEFT JOIN prev ON true  -- prev is read (and its row locked) before the upsert
      ON CONFLICT (node_id) DO UPDATE SET
        label = excluded.label, principal = excluded.principal, instance = excluded.instance,
        capabilities = excluded.capabilities, attr_count = excluded.attr_count,
        drain = excluded.drain, seen_at = excluded.seen_at, expires_at = excluded.expires_at
      RETURNING 1
    )
    SELECT look.restarted, look.soft, prev.drain, prev.capabilities, prev.live,
           r.run_id, r.node_id, r.capability, r.not_after, r.nonce
    FROM look LEFT JOIN prev ON true LEFT JOIN renewed AS r ON true
    """
).bindparams(bindparam("capabilities", type_=JSONB))


class _HeartbeatRow(NamedTuple):
    """A row of ``_HEARTBEAT``, in its column order: ``prev`` (drain, capabilities, live) is all
    NULL for a new node, and the lease columns are all NULL on a row without a lease."""

    restarted: bool
    soft: str
    drain: Any
    capabilities: Any
    live: bool | None
    run_id: str | None
    node_id: Any
    capability: Any
    not_after: Any
    nonce: Any


def heartbeat(
    s: Session | Connection,
    *,
    node_id: str,
    label: str | None,
    principal: str | None,
    instance: str | None,
    capabilities: list[dict[str, Any]],
    drain: str,
    window_seconds: int,
    check_restart: bool = True,
    begin: bool = False,
) -> Heartbeat:
    """An advert in one statement (docs/queue.md#heartbeats-what-a-node-learns): whether another
    instance holds a claim of this node (a restart), with the node row locked and read as it was;
    unless it restarted (and ``check_restart``), the lease renewal (``now() + window`` for every
    lease of a run not finished, returned as the reply's lease list) and the advert stored in place
    of the previous one. An advert that changes nothing thus costs this one statement
    (docs/design.md#targets).

    A renewal is soft state: its commit does not wait for the WAL to reach the disk or a
    standby (``synchronous_commit`` off for this transaction only). A crash or a switch may
    forget the last renewals of the last few hundred milliseconds; the nodes send the next within
    ``renew_seconds`` and the reaper's outage grace gives every lease a full window after a
    restart (docs/queue.md#crashes-and-restarts), so nothing that was acknowledged to a submitter is
    lost. An advert that is its node's first (or its first since it stopped being live), changes
    its capabilities, or sets or lifts its drain commits as the server is configured
    (docs/deploy.md#11-a-database-with-a-standby).

    The node row is locked first here (``prev`` is read before the upsert, which selects from
    it), then the node's lease row: the lock order (docs/queue.md, "Lock order"). What else locks
    the node's row (a lease insert, the reservation writer) never holds its lease row while it
    waits for it, and what deletes the node's lease (a cancel, a settle, a release) never waits
    for the node's row (an acquire after a release takes its node ``SKIP LOCKED``), so this
    cannot deadlock with them.

    ``begin``: on a connection whose transaction begins with its first write
    (``Database.transaction``), begin it with this statement, so that the row's lock is held
    until the commit; else, there, the statement commits by itself."""
    found = fetch(
        s,
        _HEARTBEAT,
        {
            "node_id": node_id,
            "label": label,
            "principal": principal,
            "instance": instance,
            "check_restart": bool(check_restart and instance),
            "capabilities": capabilities,
            "attr_count": sum(len(c.get("attrs") or {}) for c in capabilities),
            "drain": drain,
            "window": window_seconds,
        },
        begin=begin,
    )
    rows = [_HeartbeatRow._make(row) for row in found]
    head = rows[0]
    previous = (
        None
        if head.live is None
        else PreviousAdvert(head.drain, head.capabilities, bool(head.live))
    )
    if check_restart and instance and head.restarted:
        return Heartbeat(True, previous, [])
    leases = sorted(
        (
            LeaseLine(r.run_id, r.node_id, r.capability, r.not_after, r.nonce)
            for r in rows
            if r.run_id is not None
        ),
        key=lambda line: line.run_id,
    )
    return Heartbeat(False, previous, leases)


@dataclass(frozen=True)
class Candidates:
    """The live adverts that may satisfy some role, and which of them are unavailable now (a
    lease, or a drain): what the matcher decides among."""

    adverts: list[Advert]
    unavailable: set[str]
    held: dict[str, Held] = field(default_factory=dict)  # node -> its reservation's holder
    # With ``with_leases``: node -> the run holding its lease, and the draining candidates (by
    # their advert or an operator's hold).
    holders: dict[str, str] = field(default_factory=dict)
    draining: set[str] = field(default_factory=set)
    # Quarantined candidates (docs/operators.md), and those unavailable for that alone: a health
    # run may have its pinned node among them.
    quarantined: set[str] = field(default_factory=set)
    quarantined_only: set[str] = field(default_factory=set)


def containment(role: Role) -> list[dict[str, Any]]:
    """The JSONB a satisfying advert's ``capabilities`` contains (one entry with the role's
    capability name and every requested attribute equal:
    docs/contract.md#requirements-and-how-runs-are-placed)."""
    entry: dict[str, Any] = {"capability": role.capability}
    if role.attrs:
        entry["attrs"] = dict(role.attrs)
    return [entry]


def containment_key(role: Role) -> str:
    """Roles with the same key have the same candidates."""
    return json.dumps(containment(role), sort_keys=True)


@functools.lru_cache(maxsize=256)
def _candidates_statement(
    wanted: int, reserving: bool, with_holders: bool, with_leases: bool
) -> tuple[Select[Any], type[Any]]:
    """:func:`candidate_adverts`' statement for ``wanted`` distinct containments, built and
    compiled once per shape (the driver path), and the named tuple of its rows."""
    # Correlated on the node only: the outer statement may join leases and reservations too.
    leased = (
        select(Lease.node_id).where(Lease.node_id == Node.node_id).correlate_except(Lease).exists()
    )
    held = (
        select(NodeHealth.node_id)
        .where(NodeHealth.node_id == Node.node_id, NodeHealth.hold_mode.is_not(None))
        .correlate_except(NodeHealth)
        .exists()
    )
    quarantined = (
        select(NodeHealth.node_id)
        .where(NodeHealth.node_id == Node.node_id, NodeHealth.quarantined_at.is_not(None))
        .correlate_except(NodeHealth)
        .exists()
        .label("quarantined")
    )
    reasons = [Node.drain != "", leased, held]
    if reserving:
        reasons.append(
            select(Reservation.node_id)
            .join(Run, Run.run_id == Reservation.run_id)
            .where(
                Reservation.node_id == Node.node_id,
                Run.priority >= bindparam("reserved_for", type_=Integer),
            )
            .correlate_except(Reservation, Run)
            .exists()
        )
    busy = or_(*reasons).label("busy")
    q = select(Node.node_id, Node.capabilities, Node.label, busy, quarantined).where(
        Node.expires_at > func.now(),
        or_(
            *(Node.capabilities.contains(bindparam(f"want{i}", type_=JSONB)) for i in range(wanted))
        ),
    )
    if with_holders:
        q = (
            q.add_columns(Reservation.run_id.label("holder"), Run.priority.label("holder_priority"))
            .outerjoin(Reservation, Reservation.node_id == Node.node_id)
            .outerjoin(Run, Run.run_id == Reservation.run_id)
        )
    if with_leases:
        q = q.add_columns(
            or_(Node.drain != "", held).label("draining"), Lease.run_id.label("lease_holder")
        ).outerjoin(Lease, Lease.node_id == Node.node_id)
    shape = namedtuple("CandidateRow", [c.name for c in q.selected_columns])  # type: ignore[misc]
    return q, shape


def candidate_adverts(
    s: Session | Connection,
    roles: Iterable[Role],
    *,
    reserved_for: int | None = None,
    with_holders: bool = False,
    with_leases: bool = False,
) -> Candidates:
    """One statement through ``ix_nodes_capabilities``: only the adverts that can satisfy one of
    ``roles`` are read, each with whether it is unavailable (a lease, whatever its ``not_after``,
    or a drain), in :func:`candidate_order`. Containment finds a superset of what the matcher
    accepts (the matcher stays the judge), so the cost follows the run, not the fleet.
    ``reserved_for``: the priority of a run that holds no reservation (a submit, an acquire): a
    node reserved by a run of that priority or higher is unavailable too
    (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits). ``with_holders``: each
    candidate's reservation holder and its priority come back in the same statement (``held``;
    dry-run warns about them). ``with_leases``: the run holding each candidate's lease and whether
    it drains come back too (``holders``, ``draining``: what the explanation of a wait reads,
    docs/queue.md#what-a-queued-runs-view-explains)."""
    wanted = {containment_key(r): containment(r) for r in roles}
    if not wanted:
        return Candidates([], set())
    statement, shape = _candidates_statement(
        len(wanted), reserved_for is not None, with_holders, with_leases
    )
    params: dict[str, Any] = {f"want{i}": v for i, v in enumerate(wanted.values())}
    if reserved_for is not None:
        params["reserved_for"] = reserved_for
    if isinstance(s, Session):
        s.flush()  # what Session.execute would do first: the transaction's own writes are seen
    rows = [shape._make(row) for row in fetch(s, statement, params)]
    adverts = candidate_order(adverts_from_rows((r.node_id, r.capabilities, r.label) for r in rows))
    held = (
        {r.node_id: Held(r.holder, int(r.holder_priority)) for r in rows if r.holder is not None}
        if with_holders
        else {}
    )
    found = Candidates(adverts, {r.node_id for r in rows if r.busy or r.quarantined}, held)
    found.quarantined.update(r.node_id for r in rows if r.quarantined)
    found.quarantined_only.update(r.node_id for r in rows if r.quarantined and not r.busy)
    if with_leases:
        found.holders.update((r.node_id, r.lease_holder) for r in rows if r.lease_holder)
        found.draining.update(r.node_id for r in rows if r.draining)
    return found


# The satisfying live nodes of wanted entry {i} in candidate order, each with whether it is
# unavailable (a lease, a drain, an operator's hold or a quarantine, or a reservation of a run of
# ``reserved_for``'s priority or higher; never, for a dry-run, which reads live adverts only).
# ``busy`` is computed row by row as a LIMIT above pulls them, so a placement that finds free nodes
# first looks up the holders of those only; each holder is an index probe (a scalar subquery:
# never a hash of the whole leases table built for one submit). The containment is a parameter of
# its own, so the planner sees its value: a requirement that most of the fleet fits walks
# ``ix_nodes_order`` in candidate order and stops at its limit, a rare one is looked up in
# ``ix_nodes_capabilities`` (docs/design.md#targets: the fleet's size costs nothing per request).
_BUSY = f"""(n.drain <> ''
           OR (SELECT true FROM leases WHERE leases.node_id = n.node_id LIMIT 1) IS NOT NULL
           OR {OUT_OF_SERVICE}
           OR (CAST(:reserved_for AS integer) IS NOT NULL AND (
                 SELECT true FROM reservations JOIN runs ON runs.run_id = reservations.run_id
                 WHERE reservations.node_id = n.node_id
                   AND runs.priority >= CAST(:reserved_for AS integer) LIMIT 1) IS NOT NULL))"""
_ORDERED = """
        SELECT n.node_id, n.label, n.attr_count, {busy} AS busy
        FROM nodes AS n
        WHERE n.expires_at > now() AND n.capabilities @> :want{i}
        ORDER BY n.attr_count, n.node_id COLLATE "C"
        OFFSET 0"""
# The first ``limit`` of entry {i}: the free ones in order, then (only when they are fewer) the
# unavailable ones in order.
_FIRSTS_OF = """
      (SELECT {i} AS key_no, c.* FROM (
        (SELECT o.* FROM ({ordered}) AS o WHERE NOT o.busy LIMIT :limit{i})
        UNION ALL
        (SELECT o.* FROM ({ordered}) AS o WHERE o.busy LIMIT :limit{i})
      ) AS c LIMIT :limit{i})"""
# A dry-run's: the first ``limit`` of entry {i} in order, every one counted free.
_DRY_FIRSTS_OF = """
      (SELECT {i} AS key_no, o.* FROM ({ordered}) AS o LIMIT :limit{i})"""


@functools.lru_cache(maxsize=64)
def _firsts_statement(wanted: int, dry: bool) -> Any:
    """:func:`first_candidates`' statement for ``wanted`` distinct containments, built once per
    shape. A dry-run's reads each candidate's reservation holder too (its warnings)."""
    parts = []
    for i in range(wanted):
        ordered = _ORDERED.format(i=i, busy="false" if dry else _BUSY)
        parts.append((_DRY_FIRSTS_OF if dry else _FIRSTS_OF).format(i=i, ordered=ordered))
    body = "\n      UNION ALL".join(parts)
    if dry:
        sql = f"""
    SELECT f.key_no, f.node_id, f.label, f.busy, r.run_id AS holder, runs.priority AS holder_priority
    FROM ({body}) AS f
    LEFT JOIN reservations AS r ON r.node_id = f.node_id
    LEFT JOIN runs ON runs.run_id = r.run_id
    ORDER BY f.key_no, f.attr_count, f.node_id COLLATE "C"
    """
    else:
        sql = f"""
    SELECT f.key_no, f.node_id, f.label, f.busy, NULL AS holder, NULL AS holder_priority
    FROM ({body}) AS f
    ORDER BY f.key_no, f.busy, f.attr_count, f.node_id COLLATE "C"
    """
    params = [bindparam(f"want{i}", type_=JSONB) for i in range(wanted)]
    params += [bindparam(f"limit{i}", type_=Integer) for i in range(wanted)]
    if not dry:
        params.append(bindparam("reserved_for", type_=Integer))
    return text(sql).bindparams(*params)


def firsts_rows(
    s: Session | Connection,
    wanted: list[dict[str, Any]],
    reserved_for: int | None,
    *,
    dry: bool = False,
) -> list[Any]:
    """The rows of :func:`_firsts_statement` for ``wanted`` (each ``{"contains": …, "limit":
    …}``): (entry, 0-based; node; label; busy; reservation holder; its priority)."""
    params: dict[str, Any] = {}
    for i, entry in enumerate(wanted):
        params[f"want{i}"] = entry["contains"]
        params[f"limit{i}"] = entry["limit"]
    if not dry:
        params["reserved_for"] = reserved_for
    return fetch(s, _firsts_statement(len(wanted), dry), params)


@dataclass(frozen=True)
class FirstCandidates:
    """Per role (in the contract's order), the first satisfying nodes a placement needs to look
    at (:class:`app.match.Firsts`, for :func:`app.match.match_firsts`), their labels, and for a
    dry-run the reservation holders among them."""

    firsts: list[Firsts]
    labels: dict[str, str | None]
    held: dict[str, Held] = field(default_factory=dict)


def first_candidates(
    s: Session | Connection,
    roles: list[Role] | tuple[Role, ...],
    *,
    reserved_for: int | None = None,
    dry: bool = False,
) -> FirstCandidates:
    """One statement, bounded by the run and not by the fleet (a submit's cost must not follow
    the fleet's size: docs/design.md#targets): for each distinct requirement, through
    ``ix_nodes_order`` or ``ix_nodes_capabilities`` (whichever the planner finds cheaper for that
    requirement's value), the first ``count`` live satisfying nodes (the largest count of the
    roles that share it) in
    :func:`app.match.candidate_order` (``node_id`` compared by code point, as Python does), free
    ones before unavailable ones (a lease, whatever its ``not_after``, a drain, or with
    ``reserved_for`` a reservation of a run of that priority or higher,
    docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits). Containment is exactly
    :func:`app.match.satisfies` for one role. Nothing is locked: a node taken meanwhile fails the
    insert on ``pk_leases``. ``dry``: a dry-run's read, live adverts only (every node counts
    free), with each one's reservation holder (``held``)."""
    keys: dict[str, int] = {}
    wanted: list[dict[str, Any]] = []
    role_keys = [containment_key(role) for role in roles]
    for role, key in zip(roles, role_keys, strict=True):
        if key not in keys:
            keys[key] = len(wanted)
            wanted.append({"contains": containment(role), "limit": role.count})
        else:
            entry = wanted[keys[key]]
            entry["limit"] = max(entry["limit"], role.count)
    free: list[list[str]] = [[] for _ in wanted]
    found = [0] * len(wanted)
    labels: dict[str, str | None] = {}
    held: dict[str, Held] = {}
    if wanted:
        rows = firsts_rows(s, wanted, reserved_for, dry=dry)
        for key_no, node_id, label, busy, holder, holder_priority in rows:
            found[key_no] += 1
            if not busy:
                free[key_no].append(node_id)
            labels[node_id] = label
            if holder is not None:
                held[node_id] = Held(holder, int(holder_priority))
    firsts = []
    for key in role_keys:
        k = keys[key]
        firsts.append(Firsts(tuple(free[k]), found[k], wanted[k]["limit"]))
    return FirstCandidates(firsts, labels, held)


def live_adverts(s: Session) -> list[Advert]:
    rows = s.execute(
        select(Node.node_id, Node.capabilities, Node.label).where(Node.expires_at > func.now())
    ).all()
    return adverts_from_rows((r.node_id, r.capabilities, r.label) for r in rows)


def _out_of_service() -> Select[Any]:
    """Nodes an operator's hold or a quarantine keeps out (``ix_node_health_out``)."""
    return select(NodeHealth.node_id).where(text(NODE_OUT))


def draining_node_ids(s: Session) -> set[str]:
    """Live nodes no new placement may have: draining by their advert or an operator's hold, or
    quarantined (what a reservation may not keep, docs/priorities.md)."""
    draining = select(Node.node_id).where(Node.expires_at > func.now(), Node.drain != "")
    return set(s.execute(union(draining, _out_of_service())).scalars())


def unavailable_node_ids(s: Session, *, reserved_for: int | None = None) -> set[str]:
    """Nodes holding a lease ∪ draining nodes, read once (docs/design.md#submit-and-dry-run).
    ``reserved_for``: the priority of a run that holds no reservation (a submit, an acquire): the
    nodes reserved against it join the set, in the same statement
    (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits)."""
    leased = select(Lease.node_id)
    draining = select(Node.node_id).where(Node.expires_at > func.now(), Node.drain != "")
    if reserved_for is None:
        return set(s.execute(union(leased, draining, _out_of_service())).scalars())
    reserved = (
        select(Reservation.node_id)
        .join(Run, Run.run_id == Reservation.run_id)
        .where(Run.priority >= reserved_for)
    )
    return set(s.execute(union(leased, draining, _out_of_service(), reserved)).scalars())


def node_labels(s: Session, node_ids: list[str]) -> dict[str, str | None]:
    if not node_ids:
        return {}
    rows = s.execute(select(Node.node_id, Node.label).where(Node.node_id.in_(node_ids)))
    return {r.node_id: r.label for r in rows}


@dataclass(frozen=True)
class NodeRow:
    node: Node
    live: bool
    lease: Lease | None


def listed_nodes(s: Session, node_id: str | None = None) -> tuple[datetime, list[NodeRow]]:
    """Live nodes, and nodes that still hold a lease though their advert expired
    (docs/api.md#get-v1nodes--the-fleet), by node_id, with the database time of the snapshot; with
    ``node_id``, that node alone, live or not (an operator's change answers with its line)."""
    now = s.execute(select(func.now())).scalar_one()
    q = (
        select(Node, (Node.expires_at > func.now()).label("live"), Lease)
        .outerjoin(Lease, Lease.node_id == Node.node_id)
        .order_by(Node.node_id)
    )
    if node_id is None:
        q = q.where(or_(Node.expires_at > func.now(), Lease.node_id.is_not(None)))
    else:
        q = q.where(Node.node_id == node_id)
    return now, [NodeRow(r[0], bool(r[1]), r[2]) for r in s.execute(q).all()]


def live_nodes(s: Session) -> tuple[datetime, list[Node]]:
    now = s.execute(select(func.now())).scalar_one()
    q = select(Node).where(Node.expires_at > func.now()).order_by(Node.node_id)
    return now, list(s.execute(q).scalars())


_IS_LIVE = select(Node.node_id).where(
    Node.node_id == bindparam("node_id"), Node.expires_at > func.now()
)  # built once: every claim's first look that finds nothing runs it


def is_live(s: Session, node_id: str) -> bool:
    """Whether the node has a live advert (``expires_at > now()``, the database's clock)."""
    return s.execute(_IS_LIVE, {"node_id": node_id}).first() is not None


def drain_of(s: Session, node_id: str) -> str:
    """The node's stored drain ("" when none, or no such node)."""
    return s.execute(select(Node.drain).where(Node.node_id == node_id)).scalar_one_or_none() or ""
