"""The expected start of a QUEUED run, read at request time (docs/queue.md, "What a QUEUED run's
view explains"): the bounded reads of ``app/store/estimates.py`` fed to the pure simulation of
``app/estimate.py``. Reads only."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from app.contract.types import Role, role_from_wire
from app.estimate import (
    BUDGET,
    KINDS_TIMED,
    NOW,
    TOO_FAR_BACK,
    Ahead,
    Expected,
    FairShare,
    Need,
    PlannedStep,
    Span,
    TeamShare,
    duration_key,
    expected_start,
    expected_start_shared,
    remaining,
    roles_by_name,
)
from app.match import Advert, satisfies
from app.store.estimates import (
    StepRow,
    median_durations,
    queued_ahead_of_shapes,
    steps_of_estimated,
)
from app.store.nodes import Candidates, candidate_adverts
from app.store.queue import QueuedRun, TeamOrder, queued_shape_heads
from app.teams import HEALTH_TEAM, Standing
from app.wire import ts

DEFAULT_MAX_AHEAD = 200  # ``estimate.max_ahead``'s default


class EstimateBudget:
    """The runs ahead one request may still look at (``estimate.max_ahead``), shared by every
    expected start it renders; ``shapes``: the process's list of queued shapes."""

    def __init__(self, max_ahead: int, shapes: QueuedShapes) -> None:
        self.max_ahead = max_ahead
        self.left = max_ahead
        self.shapes = shapes


# How long a process uses the queued shapes it read before it reads them again
# (docs/queue.md, "What a QUEUED run's view explains").
SHAPES_FRESH_SECONDS = 1.0

# A role of a queued shape filed under its capability and one of its attributes (None: it asks
# for none): a candidate's capability finds the roles it may fit under its name with None and
# under each of its own attributes, never by a look at every queued shape.
RoleSlot = tuple[str, str | None, str | None]


@dataclass(frozen=True)
class _Listed:
    """The queued shapes as one process knows them (``requires_key`` -> its ``requires``), with
    their roles filed by :data:`RoleSlot`."""

    requires: dict[str, Any]
    roles: dict[RoleSlot, list[tuple[str, Role]]]

    @classmethod
    def of(cls, requires: dict[str, Any]) -> _Listed:
        filed: dict[RoleSlot, list[tuple[str, Role]]] = {}
        for key, doc in requires.items():
            for role in _roles(doc):
                filed.setdefault(_slot(role), []).append((key, role))
        return cls(requires, filed)

    def with_shape(self, key: str, doc: Any) -> _Listed:
        """This list and one more shape (copies of the mappings, no other shape decoded)."""
        filed = dict(self.roles)
        for role in _roles(doc):
            slot = _slot(role)
            filed[slot] = [*filed.get(slot, ()), (key, role)]
        return _Listed({**self.requires, key: doc}, filed)

    def fitting(self, adverts: Sequence[Advert]) -> dict[str, Any]:
        """The shapes with a role that one of ``adverts`` fits (app.match.satisfies)."""
        out: dict[str, Any] = {}
        for a in adverts:
            for cap in a.capabilities:
                slots = [(cap.name, None, None)] + [(cap.name, k, v) for k, v in cap.attrs.items()]
                for slot in slots:
                    for key, role in self.roles.get(slot, ()):
                        if key not in out and all(
                            cap.attrs.get(k) == v for k, v in role.attrs.items()
                        ):
                            out[key] = self.requires[key]
        return out


def _slot(role: Role) -> RoleSlot:
    first = min(role.attrs.items(), default=(None, None))
    return (role.capability, first[0], first[1])


class QueuedShapes:
    """The shapes with runs QUEUED (``requires_key`` -> its ``requires``), as this process last
    read them, at most :data:`SHAPES_FRESH_SECONDS` ago, with every shape this process has
    estimated a run of since: which shapes can share a candidate with a queued run is then worked
    out here, from the candidates' capabilities, instead of by a walk of every queued shape per
    estimate. A shape's ``requires`` never changes (the key is made from it); a shape whose runs
    all left the queue has no run ahead, and one first queued by another process in the last
    second is missed until the next read. Threads share it: the list is replaced, never changed
    in place."""

    def __init__(self, fresh_seconds: float = SHAPES_FRESH_SECONDS) -> None:
        self.fresh_seconds = fresh_seconds
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._listed = _Listed({}, {})

    def note(self, key: str, requires: Any) -> None:
        """A shape known to have a run QUEUED (the estimated run's own)."""
        listed = self._listed
        if key and key not in listed.requires:
            self._listed = listed.with_shape(key, requires)

    def _refresh(self, s: Session | Connection) -> None:
        read_at = self._read_at
        if read_at is not None and time.monotonic() - read_at < self.fresh_seconds:
            return
        # The first read waits for another thread's; later ones use the list they have meanwhile.
        if not self._lock.acquire(blocking=read_at is None):
            return
        try:
            if self._read_at is not read_at:
                return  # another thread read them while this one waited
            started = time.monotonic()
            heads = queued_shape_heads(s)
            self._listed = _Listed.of({h.requires_key: h.requires for h in heads})
            self._read_at = started
        finally:
            self._lock.release()

    def sharing(
        self, s: Session | Connection, adverts: Sequence[Advert], run: QueuedRun
    ) -> dict[str, Any]:
        """``requires_key`` -> ``requires`` of every queued shape with a role that one of
        ``adverts`` (``run``'s candidates) fits: ``run``'s own shape among them."""
        self._refresh(s)
        self.note(run.requires_key, run.requires)  # a list read just now may lack it
        return self._listed.fitting(adverts)


@dataclass(frozen=True)
class TeamsNow:
    """With teams configured: where the estimated run's team stands (``order``, for the read of
    the runs ahead), the teams' standing, and the two settings that move it (seconds)."""

    order: TeamOrder
    standing: Standing
    running_charge: float
    half_life: float

    def fair(self, names: set[str]) -> FairShare:
        """The teams ``names`` (stored names) as the simulation ranks them, by counted name:
        ``health`` first, as the scan orders it."""
        st = self.standing
        teams: dict[str, TeamShare] = {}
        for name in {st.teams.counted_as(n) for n in names}:
            share = float("inf") if name == HEALTH_TEAM else st.share(name)
            teams[name] = TeamShare(share, st.usage.get(name, 0.0), st.held.get(name, 0))
        return FairShare(teams, self.running_charge, self.half_life)


def _roles(requires: Any) -> list[Role]:
    """A queued run's roles as stored; a ``requires`` that does not decode (written by hand, or
    by an older release) has none here: the estimate skips it, as the scan does."""
    try:
        return [role_from_wire(w) for w in requires]
    except (KeyError, TypeError, ValueError, AttributeError):
        return []


def _needs(roles: list[Role], adverts: list[Advert]) -> tuple[Need, ...]:
    return tuple(
        Need(r.count, frozenset(a.node_id for a in adverts if satisfies(a, r))) for r in roles
    )


# Documents of at most this many characters (a run's requires and its steps' specs together) are
# remembered, at most DURATION_KEYS_KEPT of them: 8 MiB a process at worst.
DURATION_KEYS_DOCUMENT_MAX = 16 * 1024
DURATION_KEYS_KEPT = 512

StepDocs = tuple[tuple[str, str, str | None, str], ...]


def _duration_keys(requires: str, steps: StepDocs) -> tuple[str | None, ...]:
    """The duration keys of a run's steps ((step id, kind, uses, spec) each, documents as JSON
    text) under its ``requires``. Small documents are remembered by their text, so a queue of
    copies of one contract decodes and hashes them once, and nothing remembered can go stale."""
    size = len(requires) + sum(len(spec) for _, _, _, spec in steps)
    if size > DURATION_KEYS_DOCUMENT_MAX:
        return _keys_of(requires, steps)
    return _kept_keys(requires, steps)


def _keys_of(requires: str, steps: StepDocs) -> tuple[str | None, ...]:
    specs = [json.loads(spec) for _, _, _, spec in steps]
    roles = roles_by_name(json.loads(requires) or [], specs)
    return tuple(
        duration_key(step_id, kind, spec, roles.get(uses or "")) if kind in KINDS_TIMED else None
        for (step_id, kind, uses, _), spec in zip(steps, specs, strict=True)
    )


_kept_keys = lru_cache(maxsize=DURATION_KEYS_KEPT)(_keys_of)


def _plans(rows: list[StepRow]) -> dict[str, list[PlannedStep]]:
    """Each run's steps as the estimate sees them, with their duration keys."""
    by_run: dict[str, list[StepRow]] = {}
    for row in rows:
        by_run.setdefault(row.run_id, []).append(row)
    out: dict[str, list[PlannedStep]] = {}
    for run_id, steps in by_run.items():
        try:
            keys = _duration_keys(
                steps[0].requires,
                tuple((st.step_id, st.kind, st.uses, st.spec) for st in steps),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            # A ``requires`` that does not decode (written by hand, or by an older release): the
            # scan never places the run, and the estimate skips it.
            continue
        out[run_id] = [
            PlannedStep(
                seq=st.seq,
                kind=st.kind,
                key=key,
                needs=tuple(st.needs),
                uses=st.uses,
                state=st.state,
                ran=st.ran,
            )
            for st, key in zip(steps, keys, strict=True)
        ]
    return out


def expected_of(
    s: Session | Connection,
    run: QueuedRun,
    found: Candidates,
    *,
    now: datetime,
    ahead: int,
    budget: EstimateBudget,
    teams: TeamsNow | None = None,
) -> dict[str, Any]:
    """``expected_start`` and ``expected_basis`` of the QUEUED ``run``, whose candidates (with
    their holders and drains) are ``found`` and which has ``ahead`` QUEUED runs ahead of it in
    queue order (``teams``: in the teams' order, and the estimate follows fair share). At most
    four statements: the runs ahead of the shapes that share a candidate with it (those shapes
    found in the process's list, :class:`QueuedShapes`, which reads the queued shapes at most once
    a second), their candidates (unless their roles are this run's), then the steps of the
    holders and runs ahead, and their recorded durations (only the last two when nothing is
    ahead)."""
    # Its shape has a run QUEUED: a run of another shape that shares its candidates counts it
    # ahead from now on, in this process, whatever its list of queued shapes says.
    budget.shapes.note(run.requires_key, run.requires)
    roles = _roles(run.requires)
    adverts = list(found.adverts)
    holders = dict(found.holders)
    draining = set(found.draining)
    order = teams.order if teams is not None else None
    queued: list[QueuedRun] = []
    if ahead > 0:
        if budget.left <= 0:
            return _wire(None, BUDGET, now)
        requires_of = budget.shapes.sharing(s, found.adverts, run)
        if requires_of:
            n = min(budget.left, budget.max_ahead)
            queued, looked_at = queued_ahead_of_shapes(s, requires_of, run, n + 1, order)
            budget.left -= min(looked_at, n)
            if looked_at > n:
                return _wire(None, TOO_FAR_BACK if n == budget.max_ahead else BUDGET, now)
            # The candidates of the shapes with runs ahead, unless their roles are this run's
            # (the common case: the same shape), whose candidates are read already.
            mine = {(r.capability, tuple(sorted(r.attrs.items()))) for r in roles}
            other = [
                r
                for key in dict.fromkeys(q.requires_key for q in queued)
                for r in _roles(requires_of[key])
                if (r.capability, tuple(sorted(r.attrs.items()))) not in mine
            ]
            if other:
                theirs = candidate_adverts(s, other, with_leases=True)
                known = {a.node_id for a in adverts}
                adverts += [a for a in theirs.adverts if a.node_id not in known]
                holders.update(theirs.holders)
                draining |= theirs.draining
    # A drained node is never given out again, even once its holder ends.
    held = sorted(
        {holders[a.node_id] for a in adverts if a.node_id in holders and a.node_id not in draining}
    )
    rows = steps_of_estimated(s, held + [q.run_id for q in queued])
    plans = _plans(rows)
    keys = [st.key for steps in plans.values() for st in steps if st.key is not None]
    medians = median_durations(s, keys)
    free: dict[str, Span] = {}
    for a in adverts:
        if a.node_id in draining:
            continue
        holder = holders.get(a.node_id)
        free[a.node_id] = NOW if holder is None else remaining(plans.get(holder, []), medians)
    # The runs ahead are mostly copies of a few contracts, none started: their needs by shape
    # and their spans by plan are worked out once.
    needs_of: dict[str, tuple[Need, ...]] = {}
    spans: dict[tuple[PlannedStep, ...], Span] = {}
    runs_ahead = []
    for q in queued:
        if q.run_id not in plans:
            continue  # its requires do not decode (_plans)
        needs = needs_of.get(q.requires_key)
        if needs is None:
            needs = needs_of[q.requires_key] = _needs(_roles(q.requires), adverts)
        plan = tuple(plans.get(q.run_id, ()))
        span = spans.get(plan)
        if span is None:
            span = spans[plan] = remaining(plan, medians)
        runs_ahead.append(Ahead(needs, span, q.team, q.priority))
    if teams is None:
        found_start = expected_start(_needs(roles, adverts), free, runs_ahead)
    else:
        found_start = _shared(
            teams, run, roles, adverts, free, holders, runs_ahead, rows, plans, medians, budget
        )
    return _wire(found_start.seconds, found_start.basis, now)


def _shared(
    teams: TeamsNow,
    run: QueuedRun,
    roles: list[Role],
    adverts: list[Advert],
    free: dict[str, Span],
    holders: dict[str, str],
    runs_ahead: list[Ahead],
    rows: list[StepRow],
    plans: dict[str, list[PlannedStep]],
    medians: dict[str, float],
    budget: EstimateBudget,
) -> Expected:
    """The estimate with teams (:func:`app.estimate.expected_start_shared`), team names counted
    as the share counts them: each other team on these nodes asks again for a run like its
    newest one ahead, else like the longest one it holds here (``health`` never asks again)."""
    st = teams.standing
    team_of = {row.run_id: row.team for row in rows}
    held_by = {n: st.teams.counted_as(team_of.get(r, "default")) for n, r in holders.items()}
    counted = [Ahead(a.roles, a.takes, st.teams.counted_as(a.team), a.priority) for a in runs_ahead]
    requires_of = {row.run_id: row.requires for row in rows}  # JSON text
    typical: dict[str, Ahead] = {}
    for run_id in sorted(set(holders.values())):
        steps = plans.get(run_id)
        name = st.teams.counted_as(team_of.get(run_id, "default"))
        if not steps or name == HEALTH_TEAM:
            continue
        whole = remaining([replace(x, state="PENDING", ran=0.0) for x in steps], medians)
        roles_held = _roles(json.loads(requires_of[run_id]))
        like = Ahead(_needs(roles_held, adverts), whole, name, run.priority)
        if name not in typical or like.takes.order > typical[name].takes.order:
            typical[name] = like
    for a in counted:
        if a.team != HEALTH_TEAM:
            typical[a.team] = Ahead(a.roles, a.takes, a.team, run.priority)
    names = {run.team} | {a.team for a in counted} | set(held_by.values())
    return expected_start_shared(
        _needs(roles, adverts),
        st.teams.counted_as(run.team),
        run.priority,
        free,
        held_by,
        counted,
        typical,
        teams.fair(names),
        max_placed=4 * budget.max_ahead,
    )


def _wire(seconds: float | None, basis: str, now: datetime) -> dict[str, Any]:
    return {
        "expected_start": None if seconds is None else ts(now + timedelta(seconds=seconds)),
        "expected_basis": basis,
    }
