"""The expected start of a QUEUED run (docs/queue.md, "What a QUEUED run's view explains").

Pure: plain data in (the nodes a run could use and when each is expected free, the runs ahead of
it and their expected durations, recorded medians), a time out. The reads are in
``app/store/estimates.py``; ``app/services/expected.py`` puts the two together.

The simulation is deliberately simple and bounded: the nodes' free times come from their holders'
remaining steps; then each run ahead (in queue order, only those sharing a candidate) takes the
earliest-free nodes that fit it for its own expected duration; the run starts when its roles can
all be filled. Reservations, quotas and runs that will arrive later are not simulated.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.states import CLAIMED, DONE, FAILED, SKIPPED

# expected_basis, as on the wire.
HISTORY = "history"
NO_HISTORY = "no_history"
TOO_FAR_BACK = "too_far_back"
BUDGET = "budget"
WAITS_FOR_PERSON = "waits_for_person"
UNAVAILABLE = "unavailable"
BASES = (HISTORY, NO_HISTORY, TOO_FAR_BACK, BUDGET, WAITS_FOR_PERSON, UNAVAILABLE)

# How many recorded durations of a key the median is taken over (the newest).
DURATIONS_PER_KEY = 50

# Of two unknown spans, the one whose reason ranks higher explains the estimate: a person's answer
# is unknowable, a missing history will fill itself in.
_RANK = {NO_HISTORY: 1, WAITS_FOR_PERSON: 2}

KINDS_TIMED = ("run", "agent")  # the step kinds whose durations are recorded


def duration_key(
    step_id: str, kind: str, spec: Mapping[str, Any], role: Mapping[str, Any] | None
) -> str:
    """The key durations are recorded and looked up under: sha256 of the step's id and kind,
    its ``run`` argv or ``agent.model``, and its role's capability and attributes (not the
    role's name or count: the same step on the same kind of board takes the same time)."""
    body = spec.get(kind)
    what = body if kind == "run" else (body or {}).get("model") if kind == "agent" else None
    where = (
        None
        if role is None
        else {"capability": role.get("capability"), "attrs": dict(role.get("attrs") or {})}
    )
    doc = json.dumps([step_id, kind, what, where], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()


def roles_by_name(
    requires: Iterable[Mapping[str, Any]], specs: Iterable[Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """A run's roles by name, as :func:`duration_key` reads them: its ``requires`` (the wire
    form, attributes nested) and the roles its acquire steps may add (their flat ``want``)."""
    out = {
        r["as"]: {"capability": r["capability"], "attrs": r.get("attrs") or {}} for r in requires
    }
    for spec in specs:
        want = (spec.get("acquire") or {}).get("want")
        if isinstance(want, Mapping) and "as" in want:
            attrs = {k: v for k, v in want.items() if k not in ("as", "capability", "count")}
            out.setdefault(want["as"], {"capability": want.get("capability"), "attrs": attrs})
    return out


@dataclass(frozen=True)
class Span:
    """An expected length of time in seconds, or None (unknown) with the reason why."""

    seconds: float | None
    basis: str = HISTORY

    def __add__(self, other: Span) -> Span:
        if self.seconds is None or other.seconds is None:
            return _worst([x for x in (self, other) if x.seconds is None])
        return Span(self.seconds + other.seconds)

    @property
    def order(self) -> tuple[bool, float]:
        return (self.seconds is None, self.seconds or 0.0)


NOW = Span(0.0)


def _worst(unknown: Sequence[Span]) -> Span:
    return max(unknown, key=lambda x: _RANK.get(x.basis, 0))


def latest(spans: Iterable[Span]) -> Span:
    """The last of ``spans`` to end: unknown if any is (the highest-ranked reason), else the
    longest; NOW when there is none."""
    spans = list(spans)
    unknown = [x for x in spans if x.seconds is None]
    if unknown:
        return _worst(unknown)
    return Span(max((x.seconds or 0.0 for x in spans), default=0.0))


@dataclass(frozen=True)
class PlannedStep:
    """One step of a run as the estimate sees it."""

    seq: int
    kind: str
    key: str | None  # its duration key (run and agent steps)
    needs: tuple[int, ...] = ()
    uses: str | None = None
    state: str = "PENDING"
    ran: float = 0.0  # seconds since its claim, for a CLAIMED step


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def remaining(steps: Iterable[PlannedStep], medians: Mapping[str, float]) -> Span:
    """How long until a run's steps still to run are done: each step starts when its needs and
    the step before it on its role's node have ended (a node works one step at a time) and takes
    its key's median; a CLAIMED step takes its median less the time it has run, and a step past
    its median counts as ending now. Acquire steps take no time; an ask step makes it unknown
    (``waits_for_person``), as does a step without a recorded duration (``no_history``). Steps
    that ended or were skipped count as done."""
    ends: dict[int, Span] = {}
    on_node: dict[str, Span] = {}
    for st in sorted(steps, key=lambda x: x.seq):
        if st.state in (DONE, FAILED, SKIPPED):
            ends[st.seq] = NOW
            continue
        before = [ends.get(n, NOW) for n in st.needs]
        if st.uses:
            before.append(on_node.get(st.uses, NOW))
        start = latest(before)
        if st.kind == "acquire":
            took = NOW
        elif st.kind == "ask":
            took = Span(None, WAITS_FOR_PERSON)
        elif st.key is None or st.key not in medians:
            took = Span(None, NO_HISTORY)
        else:
            left = medians[st.key] - (st.ran if st.state == CLAIMED else 0.0)
            took = Span(max(0.0, left))
        ends[st.seq] = start + took
        if st.uses:
            on_node[st.uses] = ends[st.seq]
    return latest(ends.values())


@dataclass(frozen=True)
class Need:
    """One role of a run: how many nodes, and which nodes can fill it."""

    count: int
    candidates: frozenset[str]


@dataclass(frozen=True)
class Ahead:
    """A queued run ahead of the estimated one: its roles and how long it is expected to run."""

    roles: tuple[Need, ...]
    takes: Span


@dataclass(frozen=True)
class Expected:
    """The estimate: seconds from now (None: no estimate) and its basis."""

    seconds: float | None
    basis: str


def _fill(roles: Sequence[Need], free: Mapping[str, Span]) -> list[str] | None:
    """The earliest-free usable nodes for each role in turn (distinct within the run); None when
    some role cannot be filled from the usable nodes."""
    taken: list[str] = []
    for role in roles:
        usable = sorted(
            (n for n in role.candidates if n in free and n not in taken),
            key=lambda n: (free[n].order, n),
        )
        if len(usable) < role.count:
            return None
        taken.extend(usable[: role.count])
    return taken


def expected_start(
    roles: Sequence[Need], free: Mapping[str, Span], ahead: Sequence[Ahead]
) -> Expected:
    """When ``roles`` can all be filled, from now. ``free``: each usable node (live, neither
    draining nor quarantined) and when it is expected free (NOW when it is); a candidate not in
    it can never be used. ``ahead``: the runs ahead in queue order that share a candidate; each
    takes the earliest-free nodes that fit it, from the latest of their free times for its
    expected duration (a run ahead that cannot be filled takes nothing)."""
    times = dict(free)
    for run in ahead:
        chosen = _fill(run.roles, times)
        if chosen is None:
            continue
        end = latest(times[n] for n in chosen) + run.takes
        for n in chosen:
            times[n] = end
    chosen = _fill(roles, times)
    if chosen is None:
        return Expected(None, UNAVAILABLE)
    start = latest(times[n] for n in chosen)
    return Expected(start.seconds, start.basis)
