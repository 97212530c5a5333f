"""A synthetic lab day, replayed against a live server: two kinds of boards, three teams of
different weights sharing them by fair share (docs/teams.md), one of them flooding the queue.

Everything that acts is in this process: simulated node agents (a heartbeat thread advertising
every board each ``lease.renew_seconds``, one thread a board claiming in long poll, "running" the
step by sleeping its drawn duration and posting its result), one submitter thread a team sending
its runs at the times of a schedule drawn from a fixed seed, and a sampler reading
``GET /v1/teams`` twice a second. gunicorn and a ``mediator reaper`` serve a fresh database.

What it measures, from the runs' events (``GET /v1/runs/{id}/events``) once the day is over:

- each team's share of the board-seconds held while every team had runs queued, against its
  weight share;
- the longest queue wait of the teams that do not flood;
- for runs that waited at least ``wait_threshold`` s, the error of the ``expected_start`` their
  202 carried against their promotion, as a fraction of their wait.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.client import Client
from bench.load import percentile
from bench.machine import CpuMeter
from bench.phases import Bench, say
from bench.server import Reaper

INSTANCE = "labday-1"  # every simulated agent's boot instance: none restarts during the day


@dataclass(frozen=True)
class TeamLoad:
    name: str
    weight: float
    # What the team offers, as a multiple of its weight share of the fleet's board-seconds:
    # above 1 it keeps runs queued (the window of the fairness figure needs every team queued).
    offered: float
    # Step durations (seconds) by board kind: lognormal, (median, sigma).
    durations: dict[str, tuple[float, float]]
    max_queued: int | None = None

    def mean_duration(self, mix: dict[str, float]) -> float:
        return sum(
            share * median * math.exp(sigma**2 / 2)
            for kind, share in mix.items()
            for median, sigma in [self.durations[kind]]
        )


@dataclass(frozen=True)
class Day:
    seconds: float  # submits are sent for this long; the fairness window is inside it
    drain_max: float  # then the agents go on until the queue is empty, at most this long
    boards: dict[str, int]  # board kind -> boards of that kind
    teams: tuple[TeamLoad, ...]
    flooding: str  # the team that submits far more than the boards can take
    seed: int
    renew_seconds: int
    half_life_seconds: int
    running_charge_seconds: int
    reserve_after_seconds: int
    wait_threshold: float  # runs that waited at least this long are in the estimate's figure
    sample_every: float
    claim_wait: float  # an agent's long poll, seconds

    @property
    def mix(self) -> dict[str, float]:
        total = sum(self.boards.values())
        return {kind: n / total for kind, n in self.boards.items()}

    def rate(self, team: TeamLoad) -> float:
        """Runs a second that ``team`` submits."""
        weights = sum(t.weight for t in self.teams)
        board_share = team.offered * team.weight / weights * sum(self.boards.values())
        return board_share / team.mean_duration(self.mix)

    def environment(self) -> dict[str, str]:
        teams = [{"name": t.name, "weight": t.weight} for t in self.teams]
        for entry, t in zip(teams, self.teams):
            if t.max_queued is not None:
                entry["max_queued"] = t.max_queued
        return {
            "MEDIATOR_TEAMS": json.dumps(teams),
            "MEDIATOR_LEASE_RENEW_SECONDS": str(self.renew_seconds),
            "MEDIATOR_FAIRSHARE_HALF_LIFE_SECONDS": str(self.half_life_seconds),
            "MEDIATOR_FAIRSHARE_RUNNING_CHARGE_SECONDS": str(self.running_charge_seconds),
            "MEDIATOR_QUEUE_RESERVE_AFTER_SECONDS": str(self.reserve_after_seconds),
        }


# Step durations are those of a lab compressed about 60 times (minutes become seconds), and so
# is the half-life of usage (a day becomes two minutes, 720 times); the running charge h keeps
# its default's ratio to the half-life (an hour to a day: 1 to 24). kernel floods: it offers
# three times its share and is held to max_queued 60 runs queued (429 beyond), as a CI bot with
# a bounded backlog would be, and so that the runs ahead of a queued run stay under
# estimate.max_ahead (200), past which every expected_start would be null.
TEAMS = (
    TeamLoad("kernel", 3, 3.0, {"a": (5.0, 0.5), "b": (7.0, 0.5)}, max_queued=60),
    TeamLoad("qa", 1, 1.1, {"a": (4.0, 0.4), "b": (6.0, 0.45)}),
    TeamLoad("release", 2, 1.1, {"a": (8.0, 0.6), "b": (11.0, 0.6)}),
)

FULL_DAY = Day(
    seconds=180.0,
    drain_max=90.0,
    boards={"a": 12, "b": 6},
    teams=TEAMS,
    flooding="kernel",
    seed=20261207,
    renew_seconds=2,
    half_life_seconds=120,
    running_charge_seconds=5,
    reserve_after_seconds=3600,
    wait_threshold=10.0,
    sample_every=0.5,
    claim_wait=5.0,
)

QUICK_DAY = Day(**{**FULL_DAY.__dict__, "seconds": 60.0, "drain_max": 40.0})


@dataclass
class Planned:
    run_id: str
    team: str
    kind: str
    at: float  # seconds after the day's start
    duration: float


def schedule(day: Day) -> list[Planned]:
    """Every team's submits of the day: Poisson arrivals at :meth:`Day.rate`, the board kind in
    the fleet's proportions, the duration lognormal by team and kind; the same for one seed."""
    out: list[Planned] = []
    kinds = list(day.mix)
    for i, team in enumerate(day.teams):
        rng = random.Random(day.seed * 31 + i)
        rate = day.rate(team)
        t, n = rng.expovariate(rate), 0
        while t < day.seconds:
            kind = rng.choices(kinds, weights=[day.mix[k] for k in kinds])[0]
            median, sigma = team.durations[kind]
            duration = min(max(rng.lognormvariate(math.log(median), sigma), 0.5), 10 * median)
            out.append(Planned(f"ld-{team.name}-{n:05d}", team.name, kind, t, round(duration, 3)))
            t += rng.expovariate(rate)
            n += 1
    return sorted(out, key=lambda p: p.at)


def contract(p: Planned) -> dict[str, Any]:
    """One board of the kind, one step; the step's argv names the team, so its recorded
    durations (keyed by argv and board attributes, docs/queue.md) are the team's on that kind."""
    return {
        "run_id": p.run_id,
        "requires": [{"as": "dut", "capability": "board", "kind": p.kind}],
        "steps": [{"id": "suite", "uses": "dut", "run": [f"{p.team}-suite"]}],
        "queue": {"team": p.team},
    }


def boards(day: Day) -> list[tuple[str, str]]:
    return [(f"ld-{kind}{i:02d}", kind) for kind, n in day.boards.items() for i in range(n)]


def _advert(node: str, kind: str) -> dict[str, Any]:
    return {
        "node_id": node,
        "instance": INSTANCE,
        "capabilities": [{"capability": "board", "attrs": {"kind": kind}}],
    }


def parse_ts(text: str | None) -> float | None:
    return datetime.fromisoformat(text).timestamp() if text else None


class Lab:
    """The agents, the submitters and the sampler of one day, all threads of this process."""

    def __init__(self, port: int, day: Day, plan: list[Planned]) -> None:
        self.port, self.day, self.plan = port, day, plan
        self.duration = {p.run_id: p.duration for p in plan}
        self.boards = boards(day)
        self.stop_agents = threading.Event()
        self.stop_sampler = threading.Event()
        self.lock = threading.Lock()
        self.claims: dict[str, float] = {}  # run_id -> when its step was handed out
        self.submits: dict[str, dict[str, Any]] = {}
        self.samples: list[tuple[float, dict[str, tuple[int, int]]]] = []
        self.last_teams: dict[str, Any] = {}
        self.day_end_teams: dict[str, Any] = {}  # the last GET /v1/teams of the day
        self.errors: dict[str, int] = {}
        self.late_submits = 0
        self.start = 0.0  # wall-clock time of the day's start
        self.threads: list[threading.Thread] = []

    def _error(self, what: str) -> None:
        with self.lock:
            self.errors[what] = self.errors.get(what, 0) + 1

    # -- the fleet

    def advertise_all(self, client: Client) -> None:
        for node, kind in self.boards:
            resp = client.post("/v1/nodes", _advert(node, kind))
            if resp.status != 200:
                raise RuntimeError(f"advert of {node}: {resp.status} {resp.data[:300]!r}")

    def _heartbeat(self) -> None:
        c = Client(self.port, timeout=30)
        while not self.stop_agents.wait(self.day.renew_seconds):
            for node, kind in self.boards:
                try:
                    if c.post("/v1/nodes", _advert(node, kind)).status != 200:
                        self._error("advert")
                except OSError:
                    self._error("advert")
                    c.close()
        c.close()

    def _agent(self, node: str) -> None:
        c = Client(self.port, timeout=self.day.claim_wait + 30)
        claim = f"/v1/nodes/{node}/claim?wait={self.day.claim_wait:g}"
        headers = {"X-Enode-Instance": INSTANCE}
        while not self.stop_agents.is_set():
            try:
                resp = c.post(claim, headers=headers)
            except OSError:
                self._error("claim")
                c.close()
                self.stop_agents.wait(0.2)
                continue
            if resp.status == 204:
                continue
            if resp.status != 200:
                self._error(f"claim {resp.status}")
                self.stop_agents.wait(0.2)
                continue
            step = resp.json()
            with self.lock:
                self.claims.setdefault(step["run_id"], time.time())
            if self.stop_agents.wait(self.duration.get(step["run_id"], 1.0)):
                break  # the day is over: the server stops with the step unfinished
            result = {"node": node, "exit_code": 0, "produced": []}
            try:
                done = c.post(f"/v1/runs/{step['run_id']}/steps/{step['seq']}/result", result)
            except OSError:
                self._error("result")
                c.close()
                continue
            if done.status != 200:
                self._error(f"result {done.status}")
        c.close()

    # -- the teams

    def _submitter(self, team: str) -> None:
        c = Client(self.port, timeout=30)
        for p in (p for p in self.plan if p.team == team):
            pause = self.start + p.at - time.time()
            if pause > 0:
                time.sleep(pause)
            elif pause < -0.1:
                with self.lock:
                    self.late_submits += 1
            sent = time.time()
            try:
                resp = c.post("/v1/runs", contract(p))
            except OSError:
                self._error("submit")
                c.close()
                continue
            doc = resp.json() if resp.status in (201, 202) else {}
            if resp.status not in (201, 202, 429):
                self._error(f"submit {resp.status}")
            with self.lock:
                self.submits[p.run_id] = {
                    "team": team,
                    "kind": p.kind,
                    "status": resp.status,
                    "sent": sent,
                    "created": parse_ts(doc.get("created_at")),
                    "expected_start": parse_ts(doc.get("expected_start")),
                    "expected_basis": doc.get("expected_basis"),
                }
        c.close()

    def _sampler(self) -> None:
        c = Client(self.port, timeout=30)
        while not self.stop_sampler.wait(self.day.sample_every):
            try:
                resp = c.get("/v1/teams")
            except OSError:
                self._error("teams")
                c.close()
                continue
            if resp.status != 200:
                self._error(f"teams {resp.status}")
                continue
            doc = resp.json()
            at = parse_ts(doc["observed_at"])
            assert at is not None
            teams = {t["name"]: (t["running_nodes"], t["queued"]) for t in doc["teams"]}
            with self.lock:
                self.samples.append((at, teams))
                self.last_teams = doc
                if at < self.start + self.day.seconds:
                    self.day_end_teams = doc

    # -- the day

    def _spawn(self, target: Any, *args: Any) -> threading.Thread:
        th = threading.Thread(target=target, args=args, daemon=True)
        th.start()
        self.threads.append(th)
        return th

    def run(self, drained: Any) -> dict[str, float]:
        """The day: agents and sampler first, then the submitters from ``start``; after the
        day, the agents go on until ``drained()`` (the queue is empty) or ``drain_max``.
        Returns the wall-clock times of its edges."""
        self._spawn(self._heartbeat)
        for node, _ in self.boards:
            self._spawn(self._agent, node)
        self._spawn(self._sampler)
        self.start = time.time() + 1.0  # the claims are waiting when the first run comes
        submitters = [self._spawn(self._submitter, t.name) for t in self.day.teams]
        for th in submitters:
            th.join()
        day_end = max(time.time(), self.start + self.day.seconds)
        deadline = day_end + self.day.drain_max
        while time.time() < deadline and not drained():
            time.sleep(0.5)
        drain_end = time.time()
        self.stop_agents.set()
        self.stop_sampler.set()
        for th in self.threads:
            th.join(timeout=self.day.claim_wait + 35)
        return {"start": self.start, "day_end": day_end, "drain_end": drain_end}


def _events(port: int, run_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    local = threading.local()

    def fetch(rid: str) -> tuple[str, list[dict[str, Any]]]:
        if not hasattr(local, "client"):
            local.client = Client(port, timeout=30)
        resp = local.client.get(f"/v1/runs/{rid}/events")
        if resp.status != 200:
            raise RuntimeError(f"events of {rid}: {resp.status} {resp.data[:300]!r}")
        return rid, resp.json()["events"]

    with ThreadPoolExecutor(4) as pool:
        return dict(pool.map(fetch, run_ids))


def _interval(events: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(start, end) of a run's board: its move to RUNNING, and the move that ended it (its
    leases go with the verdict, or with a failure or a cancel)."""
    start = end = None
    for e in events:
        if e["to"] == "RUNNING" and start is None:
            start = parse_ts(e["at"])
        elif start is not None and e["to"] not in ("RUNNING", "VERIFYING"):
            end = parse_ts(e["at"])
    return start, end


def _overlap(a: float, b: float, slots: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) for lo, hi in slots)


def _window(
    samples: list[tuple[float, dict[str, tuple[int, int]]]], teams: Iterable[str], until: float
) -> list[tuple[float, float]]:
    """The stretches of the day in which every team had a run queued: each sample that saw it
    stands for the time up to the next sample."""
    names = list(teams)
    slots: list[tuple[float, float]] = []
    for (at, seen), (nxt, _) in zip(samples, samples[1:]):
        if at >= until:
            break
        if all(seen.get(n, (0, 0))[1] > 0 for n in names):
            hi = min(nxt, until)
            if slots and abs(slots[-1][1] - at) < 1e-9:
                slots[-1] = (slots[-1][0], hi)
            else:
                slots.append((at, hi))
    return slots


def _medians(estimates: list[tuple[float, float, float]]) -> dict[str, Any]:
    """Of (error, expected wait, actual wait) triples: how many, and the median of each."""
    if not estimates:
        return {"runs": 0}
    return {
        "runs": len(estimates),
        "median_signed_error_s": round(statistics.median(e[0] for e in estimates), 1),
        "median_expected_wait_s": round(statistics.median(e[1] for e in estimates), 1),
        "median_actual_wait_s": round(statistics.median(e[2] for e in estimates), 1),
    }


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def analyse(
    lab: Lab, edges: dict[str, float], events: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    day = lab.day
    names = [t.name for t in day.teams]
    weights = {t.name: t.weight for t in day.teams}
    wsum = sum(weights.values())
    runs: dict[str, dict[str, Any]] = {}
    for rid, sub in lab.submits.items():
        if sub["status"] not in (201, 202):
            continue
        start, end = _interval(events.get(rid, []))
        runs[rid] = {**sub, "start": start, "end": end, "claimed": lab.claims.get(rid)}
    slots = _window(lab.samples, names, edges["day_end"])
    covered = sum(hi - lo for lo, hi in slots)

    # (a) board-seconds inside the window, from the runs' own intervals, and from the samples
    held = dict.fromkeys(names, 0.0)
    by_kind = {(n, k): 0.0 for n in names for k in day.boards}
    for r in runs.values():
        if r["start"] is not None:
            seconds = _overlap(r["start"], r["end"] or edges["drain_end"], slots)
            held[r["team"]] += seconds
            by_kind[r["team"], r["kind"]] += seconds
    kind_total = {k: sum(by_kind[n, k] for n in names) for k in day.boards}
    total = sum(held.values())
    sampled = dict.fromkeys(names, 0)
    day_samples = [(at, seen) for at, seen in lab.samples if at < edges["day_end"]]
    for at, seen in day_samples:
        if any(lo <= at < hi for lo, hi in slots):
            for n in names:
                sampled[n] += seen.get(n, (0, 0))[0]
    sampled_total = sum(sampled.values())

    teams: dict[str, Any] = {}
    for t in day.teams:
        mine = [r for r in runs.values() if r["team"] == t.name]
        queued = [r for r in mine if r["status"] == 202]
        waits = [r["start"] - r["created"] for r in queued if r["start"] is not None]
        longest = max(
            ((r["start"] - r["created"], r["created"]) for r in queued if r["start"] is not None),
            default=None,
        )
        left = [edges["drain_end"] - r["created"] for r in queued if r["start"] is None]
        expected = t.weight / wsum
        share = held[t.name] / total if total else None
        teams[t.name] = {
            "weight": t.weight,
            "offered_x_share": t.offered,
            "submits_per_s": round(day.rate(t), 3),
            "submitted": sum(1 for s in lab.submits.values() if s["team"] == t.name),
            "placed_at_submit": sum(1 for r in mine if r["status"] == 201),
            "queued_at_submit": len(queued),
            "refused_429": sum(
                1 for s in lab.submits.values() if s["team"] == t.name and s["status"] == 429
            ),
            "started": sum(1 for r in mine if r["start"] is not None),
            "board_seconds_in_window": round(held[t.name], 1),
            "expected_share": round(expected, 4),
            "share": _r(share, 4),
            "share_error": _r(abs(share - expected) / expected if share is not None else None),
            "share_sampled": _r(sampled[t.name] / sampled_total if sampled_total else None, 4),
            "wait_p50_s": _r(statistics.median(waits) if waits else None, 2),
            "wait_p90_s": percentile(waits, 90),
            "wait_max_s": _r(max(waits, default=None), 2),
            "wait_max_submitted_at_s": _r(longest[1] - edges["start"], 1) if longest else None,
            # The fleet is shared by team, not by kind: a team may hold more than its share of
            # one kind and less of the other.
            "by_kind": {
                k: {
                    "share": _r(by_kind[t.name, k] / kind_total[k] if kind_total[k] else None, 4),
                    "wait_p50_s": _r(statistics.median(kw) if kw else None, 2),
                    "wait_max_s": _r(max(kw, default=None), 2),
                }
                for k in day.boards
                for kw in [
                    [
                        r["start"] - r["created"]
                        for r in queued
                        if r["kind"] == k and r["start"] is not None
                    ]
                ]
            },
            "never_started": len(left),
            "never_started_oldest_s": _r(max(left, default=None), 1),
        }
    others = [t.name for t in day.teams if t.name != day.flooding]
    worst = max(
        (
            (r["start"] - r["created"], rid, r["team"])
            for rid, r in runs.items()
            if r["team"] in others and r["status"] == 202 and r["start"] is not None
        ),
        default=None,
    )

    # (c) expected_start at submit against the promotion, for the runs that waited long
    bases: dict[str, int] = {}
    errors: list[tuple[float, float, str]] = []  # (|error| / wait, signed error s, team)
    estimated: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
    for r in runs.values():
        if r["status"] != 202:
            continue
        bases[r["expected_basis"] or "none"] = bases.get(r["expected_basis"] or "none", 0) + 1
        if r["start"] is None or r["expected_start"] is None:
            continue
        wait = r["start"] - r["created"]
        signed = r["expected_start"] - r["start"]
        # (error, expected wait, actual wait) of every estimate, whatever the wait
        estimated[r["team"]].append((signed, r["expected_start"] - r["created"], wait))
        if wait >= day.wait_threshold:
            errors.append((abs(signed) / wait, signed, r["team"]))
    long_waits = [
        r
        for r in runs.values()
        if r["status"] == 202
        and r["start"] is not None
        and r["start"] - r["created"] >= day.wait_threshold
    ]
    by_team = {}
    for n in names:
        mine_e = [e for e in errors if e[2] == n]
        by_team[n] = {
            "runs": len(mine_e),
            "median_abs_error_fraction": _r(
                statistics.median(e[0] for e in mine_e) if mine_e else None
            ),
            "median_signed_error_s": _r(
                statistics.median(e[1] for e in mine_e) if mine_e else None, 1
            ),
            "all": _medians(estimated[n]),
        }
    claim_ms = [
        (r["claimed"] - r["start"]) * 1000
        for r in runs.values()
        if r["status"] == 202 and r["start"] is not None and r["claimed"] is not None
    ]
    usage = {
        t["name"]: {k: t.get(k) for k in ("share", "usage", "factor", "running_nodes", "queued")}
        for t in lab.day_end_teams.get("teams", [])
        if t["name"] in names
    }
    return {
        "window": {
            "seconds": round(covered, 1),
            "of_day": round(covered / day.seconds, 3),
            "from_s": _r(slots[0][0] - edges["start"], 1) if slots else None,
            "to_s": _r(slots[-1][1] - edges["start"], 1) if slots else None,
            "stretches": len(slots),
        },
        "teams": teams,
        "share_error_max": max(
            (v["share_error"] for v in teams.values() if v["share_error"] is not None),
            default=None,
        ),
        "longest_wait_non_flooding": {
            "seconds": _r(worst[0], 2) if worst else None,
            "run_id": worst[1] if worst else None,
            "team": worst[2] if worst else None,
        },
        "estimate": {
            "threshold_s": day.wait_threshold,
            "queued_runs_by_basis": dict(sorted(bases.items())),
            "waited_at_least_threshold": len(long_waits),
            "runs": len(errors),
            "median_abs_error_fraction": _r(
                statistics.median(e[0] for e in errors) if errors else None
            ),
            "median_signed_error_s": _r(
                statistics.median(e[1] for e in errors) if errors else None, 1
            ),
            "by_team": by_team,
        },
        "promotion_to_claim_ms": {
            "p50": percentile(claim_ms, 50),
            "p99": percentile(claim_ms, 99),
            "runs": len(claim_ms),
        },
        "teams_at_day_end": usage,
        "late_submits": lab.late_submits,
        "client_errors": dict(sorted(lab.errors.items())),
    }


def _json_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _warnings(lines: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """How many warnings and errors gunicorn and the reaper logged over the day, by event."""
    counts: dict[str, int] = {}
    for line in lines:
        level = str(line.get("level", "")).lower()
        if level in ("warning", "error", "critical"):
            key = f"{level}: {line.get('event')}"
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def labday(b: Bench) -> dict[str, Any]:
    """The line: a fresh database, gunicorn and a reaper configured for the day, the day, then
    the figures (see the module's docstring)."""
    day = QUICK_DAY if b.sizes.mode == "quick" else FULL_DAY
    plan = schedule(day)
    url = b.dbs.fresh("labday")
    work = b.workdir / "labday"
    work.mkdir(parents=True, exist_ok=True)
    fleet = ", ".join(f"{n} of kind {k}" for k, n in day.boards.items())
    rates = ", ".join(f"{t.name} (weight {t.weight:g}) {day.rate(t):.2f}/s" for t in day.teams)
    say(f"lab day: {day.seconds:g} s, boards {fleet}; submits {rates}; seed {day.seed}")
    with b.server(url, "labday", day.environment()) as srv, Reaper(srv, work) as reaper:
        lab = Lab(srv.port, day, plan)
        c = Client(srv.port)
        lab.advertise_all(c)

        def drained() -> bool:
            with lab.lock:
                doc = lab.last_teams
            return bool(doc) and all(t["queued"] == 0 for t in doc["teams"])

        meter = CpuMeter([*srv.pids(), reaper.pid], srv.database)
        cpu0 = time.process_time()
        first = meter.snapshot(time.monotonic())
        edges = lab.run(drained)
        last = meter.snapshot(time.monotonic())
        cores = CpuMeter.cores(first, last)
        cores["client"] = round((time.process_time() - cpu0) / max(last.at - first.at, 1e-9), 2)
        accepted = [rid for rid, s in lab.submits.items() if s["status"] in (201, 202)]
        events = _events(srv.port, accepted)
        c.close()
        logged = _warnings([*srv.log_lines(), *_json_lines(reaper.log_path)])
    out = analyse(lab, edges, events)
    out.update(
        {
            "day_seconds": day.seconds,
            "drained_in_s": round(edges["drain_end"] - edges["day_end"], 1),
            "boards": day.boards,
            "seed": day.seed,
            "server_environment": day.environment(),
            "cpu_cores": cores,
            "server_log": logged,
        }
    )
    for name, t in out["teams"].items():
        say(
            f"  {name}: share {t['share']} of the window (weight share {t['expected_share']}, "
            f"error {t['share_error']}), waits p50 {t['wait_p50_s']} s, max {t['wait_max_s']} s"
            f", {t['submitted']} submitted, {t['refused_429']} refused"
        )
    est = out["estimate"]
    say(
        f"  window {out['window']['seconds']} s of {day.seconds:g}; longest wait of the others "
        f"{out['longest_wait_non_flooding']['seconds']} s; expected_start error "
        f"{est['median_abs_error_fraction']} of the wait over {est['runs']} runs "
        f"(bases {est['queued_runs_by_basis']}); {cores}"
    )
    return {"labday": out}
