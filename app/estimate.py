"""The expected start of a QUEUED run (docs/queue.md, "What a QUEUED run's view explains").

Pure: plain data in (the nodes a run could use and when each is expected free, the runs ahead of
it and their expected durations, recorded medians), a time out. The reads are in
``app/store/estimates.py``; ``app/services/expected.py`` puts the two together.

The simulation is deliberately simple and bounded: the nodes' free times come from their holders'
remaining steps; then each run ahead (in queue order, only those sharing a candidate) takes the
earliest-free nodes that fit it for its own expected duration; the run starts when its roles can
all be filled. With teams (:func:`expected_start_shared`) the queue's order moves as the nodes
change hands, as the scan's does, and the other teams on these nodes keep asking for their share.
Reservations and quotas are not simulated.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.states import CLAIMED, DONE, FAILED, SKIPPED
from app.teams import rank_of

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
    """A queued run ahead of the estimated one: its roles and how long it is expected to run
    (with teams: its team, as counted for share, and its priority)."""

    roles: tuple[Need, ...]
    takes: Span
    team: str = "default"
    priority: int = 0


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


# ------------------------------------------------------------------ with teams


@dataclass(frozen=True)
class TeamShare:
    """A team as the queue's order sees it (docs/teams.md, "Fair share"): its share S (None:
    outside the sums), its usage U (raw decayed node-seconds) and the nodes its runs hold R."""

    share: float | None
    usage: float
    held: int


@dataclass(frozen=True)
class FairShare:
    """The teams' standing at the estimate's start, and the two settings that move it:
    ``running_charge`` (h, seconds) and ``half_life`` (of usage, seconds)."""

    teams: Mapping[str, TeamShare]
    running_charge: float
    half_life: float


class _Sim:
    """The state of :func:`expected_start_shared`'s simulation: when each usable node is free
    (None: unknown, with the reason), which team holds it until then, and each team's U and R."""

    def __init__(
        self, free: Mapping[str, Span], held_by: Mapping[str, str], fair: FairShare
    ) -> None:
        self.free: dict[str, Span] = dict(free)
        self.holder: dict[str, str | None] = {n: held_by.get(n) for n in free}
        self.fair = fair
        self.usage = {name: t.usage for name, t in fair.teams.items()}
        self.held = {name: t.held for name, t in fair.teams.items()}
        self.at = 0.0
        self._release()

    def share(self, team: str) -> float | None:
        return self.fair.teams[team].share if team in self.fair.teams else None

    def rank(self, team: str) -> float:
        """As the scan ranks teams (:func:`app.teams.rank_of`), with this simulation's U and R."""
        spent = self.usage.get(team, 0.0) + self.held.get(team, 0) * self.fair.running_charge
        return rank_of(self.share(team), spent)

    def holding(self, team: str) -> int:
        """The nodes of this simulation that ``team`` holds now."""
        return sum(1 for t in self.holder.values() if t == team)

    def usable_now(self) -> dict[str, Span]:
        return {
            n: at for n, at in self.free.items() if at.seconds is not None and at.seconds <= self.at
        }

    def take(self, team: str, nodes: list[str], takes: Span) -> None:
        for n in nodes:
            self.free[n] = Span(self.at) + takes
            self.holder[n] = team
        self.held[team] = self.held.get(team, 0) + len(nodes)

    def advance(self) -> bool:
        """On to the next time a node is expected free: usage decays and the holders are
        charged for the time between; the nodes freed leave their team's R. False when no
        node is expected free later."""
        later = [at.seconds for at in self.free.values() if at.seconds is not None]
        later = [x for x in later if x > self.at]
        if not later:
            return False
        step = min(later) - self.at
        decay = 0.5 ** (step / self.fair.half_life) if self.fair.half_life > 0 else 1.0
        for team in set(self.usage) | set(self.held):
            self.usage[team] = self.usage.get(team, 0.0) * decay + self.held.get(team, 0) * step
        self.at += step
        self._release()
        return True

    def _release(self) -> None:
        """The nodes free by now leave their holders' R."""
        for n, at in self.free.items():
            team = self.holder.get(n)
            if team is not None and at.seconds is not None and at.seconds <= self.at:
                self.held[team] = max(0, self.held.get(team, 0) - 1)
                self.holder[n] = None


def expected_start_shared(
    roles: Sequence[Need],
    team: str,
    priority: int,
    free: Mapping[str, Span],
    held_by: Mapping[str, str],
    ahead: Sequence[Ahead],
    typical: Mapping[str, Ahead],
    fair: FairShare,
    *,
    max_placed: int,
) -> Expected:
    """When ``roles`` (a run of ``team`` at ``priority``) is placed, from now, with teams: the
    queue's scans replayed at each time a node is expected free. Each scan places, by priority,
    then by the teams' factors (which move as the simulated runs take and hold nodes, and as
    usage is charged and decays), then in each team's arrival order, every run that fits the
    free nodes (a run that does not fit never blocks one that does). ``ahead``: the runs ahead
    in today's order that share a candidate. ``typical``: for another team with a share that
    uses these nodes, a run like the ones it runs here; once its runs ahead are placed it keeps
    asking for one like it while it holds less than its share of these nodes, as a team that is
    using its share goes on doing (the later arrivals a fair-shared queue places ahead of older
    runs). ``held_by``: the team holding each busy
    node. More than ``max_placed`` placements before this run's is ``too_far_back``."""
    sim = _Sim(free, held_by, fair)
    me = Ahead(tuple(roles), NOW, team, priority)
    # Each (priority, team)'s runs in arrival order, with their place in today's order: of two
    # teams ranked alike, the one with the older run goes first, as the scan's ties do.
    queues: dict[tuple[int, str], list[tuple[int, Ahead]]] = {}
    for i, run in enumerate([*ahead, me]):
        queues.setdefault((run.priority, run.team), []).append((i, run))
    again = {
        name: run
        for name, run in typical.items()
        if name != team and (run.takes.seconds or 0.0) > 0 and sim.share(name) is not None
    }
    # A team asks again only up to its share of these nodes: it goes on using its share, it
    # does not flood them.
    room = {name: max(1, round((sim.share(name) or 0.0) * len(free))) for name in again}
    placed = 0
    while True:
        while True:
            asking = {n: run for n, run in again.items() if sim.holding(n) < room[n]}
            pick = _next_placed(sim, queues, asking, priority)
            if pick is None:
                break
            run, nodes = pick
            if run is me:
                return Expected(sim.at, HISTORY)
            placed += 1
            if placed > max_placed:
                return Expected(None, TOO_FAR_BACK)
            sim.take(run.team, nodes, run.takes)
        if not sim.advance():
            break
    unknown = [sim.free[n] for role in roles for n in role.candidates if n in sim.free]
    unknown = [at for at in unknown if at.seconds is None]
    return Expected(None, _worst(unknown).basis if unknown else UNAVAILABLE)


def _next_placed(
    sim: _Sim,
    queues: dict[tuple[int, str], list[tuple[int, Ahead]]],
    again: Mapping[str, Ahead],
    priority: int,
) -> tuple[Ahead, list[str]] | None:
    """The run the scan places next on the nodes free now, removed from its queue (a ``again``
    run stays), and the nodes it takes; None when nothing fits."""
    usable = sim.usable_now()
    if not usable:
        return None
    unfit: set[tuple[Need, ...]] = set()  # roles already found not to fit this time

    def fits(run: Ahead) -> list[str] | None:
        if run.roles in unfit:
            return None
        nodes = _fill(run.roles, usable)
        if nodes is None:
            unfit.add(run.roles)
        return nodes

    levels = sorted({p for p, _ in queues} | ({priority} if again else set()), reverse=True)
    for level in levels:
        teams = {t for p, t in queues if p == level and queues[(p, t)]}
        if level == priority:
            teams |= set(again)

        def order(name: str) -> tuple[float, float, str]:
            waiting = queues.get((level, name))  # noqa: B023 (used within the loop's turn)
            return (sim.rank(name), waiting[0][0] if waiting else float("inf"), name)

        for name in sorted(teams, key=order):
            waiting = queues.get((level, name), [])
            for i, (_, run) in enumerate(waiting):
                nodes = fits(run)
                if nodes is not None:
                    del waiting[i]
                    return run, nodes
            if level == priority and name in again:
                nodes = fits(again[name])
                if nodes is not None:
                    return again[name], nodes
    return None
