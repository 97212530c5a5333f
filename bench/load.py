"""Load from client processes (spawned, so each has its own interpreter and GIL), each a pool of
threads with one keep-alive connection apiece.

A :class:`Plan` says what one process sends: a *kind* of request (a function below, by name),
how many threads, closed loop (each thread sends its next request when the last one is back) or
paced (the process sends ``rate`` requests a second in all, spread over its threads), and for how
long. Only requests sent (paced: due) inside the measurement window, ``warmup`` seconds after
the common start and ``duration`` seconds long, are counted. Everything is bounded: when the
window closes nothing new is begun (an iteration of several requests, a submit and its cancel,
is finished, uncounted, so that no run is left holding its board), and what is still in flight
``grace`` seconds later (long polls) is aborted.
"""

from __future__ import annotations

import math
import multiprocessing
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bench.client import Client
from bench.contracts import advert, body, two_steps

# A request: (name it is counted under, method, path, body, extra headers).
Request = tuple[str, str, str, bytes, dict[str, str]]
# Given (global thread index, iteration, plan params): the requests of one iteration, in order.
Maker = Callable[[int, int, dict[str, Any]], list[Request]]


def _contract(g: int, i: int, p: dict[str, Any]) -> dict[str, Any]:
    """Thread ``g``'s ``i``-th two-step contract: a board with ``attrs``. With ``slots``, thread
    ``g`` asks only for the boards of its own slot; with ``boards`` (a list of boards per thread,
    disjoint), it names one of its own boards, in turn: either way two threads never race for one
    node (the loser would be queued, then promoted by a wake scan: another measurement). With
    ``teams``, each run names one of them in ``queue.team``."""
    attrs = dict(p.get("attrs", {}))
    if p.get("slots"):
        attrs["slot"] = f"s{g % p['slots']}"
    if p.get("boards"):
        mine = p["boards"][g]
        attrs["board"] = mine[i % len(mine)]
    doc = two_steps(f"{p['prefix']}-{g}-{i}", **attrs)
    if p.get("teams"):
        # Dealt in turn, so that every thread's submits go to every team.
        doc["queue"] = {"team": p["teams"][(g + i) % len(p["teams"])]}
    return doc


def _submit(g: int, i: int, p: dict[str, Any]) -> list[Request]:
    """A submit of :func:`_contract`'s run (placed or queued, as the fleet allows)."""
    return [("submit", "POST", "/v1/runs", body(_contract(g, i, p)), {})]


def _dry_run(g: int, i: int, p: dict[str, Any]) -> list[Request]:
    """A dry-run of :func:`_contract`'s run: where it would be placed, nothing stored."""
    return [("dry-run", "POST", "/v1/runs/dry-run", body(_contract(g, i, p)), {})]


def _submit_cancel(g: int, i: int, p: dict[str, Any]) -> list[Request]:
    """A submit of :func:`_contract`'s run, then its cancel (which frees the board again)."""
    doc = _contract(g, i, p)
    return [
        ("submit", "POST", "/v1/runs", body(doc), {}),
        ("cancel", "POST", f"/v1/runs/{doc['run_id']}/cancel", b"", {}),
    ]


def _advert(g: int, i: int, p: dict[str, Any]) -> list[Request]:
    """The heartbeat of node ``n``: the fleet's nodes in turn, each once every nodes/rate s."""
    n = (i * p["threads_total"] + g) % p["nodes"]
    doc = advert(f"{p['prefix']}{n:05d}", **p["attrs_of"][n % len(p["attrs_of"])])
    return [("advert", "POST", "/v1/nodes", body(doc), {})]


def _claim(g: int, i: int, p: dict[str, Any]) -> list[Request]:
    """A node agent's long poll (no instance header: no redelivery, it only waits)."""
    node = f"{p['prefix']}{g:05d}"
    query = f"?wait={p['wait']}" if p.get("wait") is not None else ""
    return [("claim", "POST", f"/v1/nodes/{node}/claim{query}", b"", {})]


KINDS: dict[str, Maker] = {
    "submit": _submit,
    "dry-run": _dry_run,
    "submit-cancel": _submit_cancel,
    "advert": _advert,
    "claim": _claim,
}


@dataclass
class Plan:
    port: int
    kind: str
    params: dict[str, Any]
    threads: int
    duration: float
    warmup: float = 0.0
    rate: float | None = None  # requests a second for the whole process; None: closed loop
    first_thread: int = 0  # global index of this process's first thread
    start_delay: float = 0.0  # seconds after the common start before this process sends
    grace: float = 15.0  # seconds that requests in flight when the window closes may take


@dataclass
class Tally:
    lat_ms: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: int = 0
    late: int = 0  # paced requests sent more than 10 ms after their time

    def merge(self, other: Tally) -> None:
        self.lat_ms += other.lat_ms
        for k, v in other.statuses.items():
            self.statuses[k] = self.statuses.get(k, 0) + v
        self.errors += other.errors
        self.late += other.late


@dataclass
class ProcessResult:
    tallies: dict[str, Tally]
    cpu_seconds: float
    wall_seconds: float


def _thread(
    plan: Plan,
    t: int,
    start: float,
    aborted: threading.Event,
    client: Client,
    tallies: dict[str, Tally],
    lock: threading.Lock,
) -> None:
    """Send until the window closes; count what was sent (paced: due) inside the window."""
    make = KINDS[plan.kind]
    g = plan.first_thread + t
    origin = start + plan.start_delay
    begin, end = origin + plan.warmup, origin + plan.warmup + plan.duration
    local: dict[str, Tally] = {}
    if plan.rate is None and plan.start_delay:
        time.sleep(plan.start_delay)
    i = 0
    while time.monotonic() < end:
        scheduled = None
        if plan.rate:
            scheduled = origin + (i * plan.threads + t) / plan.rate
            if scheduled >= end:
                break
            pause = scheduled - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        for j, (name, method, path, data, headers) in enumerate(make(g, i, plan.params)):
            sent = time.monotonic()
            if sent >= end and j == 0:
                break  # an iteration begun is finished (a cancel after its submit), uncounted
            # A paced request's latency counts from the time it was due, so a server that
            # falls behind is not hidden by the client waiting for it (coordinated omission).
            due = scheduled if scheduled is not None and j == 0 else sent
            tally = local.setdefault(name, Tally())
            try:
                resp = client.request(method, path, data, headers)
            except OSError:
                if aborted.is_set():
                    break  # cut off after the window (a long poll, or past the grace)
                tally.errors += 1
                client.close()
                continue
            back = time.monotonic()
            if begin <= due < end:
                tally.lat_ms.append((back - due) * 1000)
                tally.statuses[resp.status] = tally.statuses.get(resp.status, 0) + 1
                if j == 0 and scheduled is not None and sent - scheduled > 0.010:
                    tally.late += 1
        if aborted.is_set():
            break
        i += 1
    with lock:
        for name, tally in local.items():
            tallies.setdefault(name, Tally()).merge(tally)


def run_plan(plan: Plan, start_wall: float) -> ProcessResult:
    """One client process: wait for the common start (wall clock, shared by all processes),
    run the threads until the window closes, give what is in flight ``grace`` seconds to come
    back, then abort the rest."""
    pause = start_wall - time.time()
    if pause > 0:
        time.sleep(pause)
    start = time.monotonic()
    cpu0 = time.process_time()
    end = start + plan.start_delay + plan.warmup + plan.duration
    clients = [Client(plan.port) for _ in range(plan.threads)]
    tallies: dict[str, Tally] = {}
    lock = threading.Lock()
    aborted = threading.Event()
    threads = [
        threading.Thread(
            target=_thread, args=(plan, t, start, aborted, clients[t], tallies, lock), daemon=True
        )
        for t in range(plan.threads)
    ]
    for th in threads:
        th.start()
    cutoff = end + plan.grace
    for th in threads:
        th.join(timeout=max(0.0, cutoff - time.monotonic()))
    aborted.set()
    for c in clients:
        c.abort()
    for th in threads:
        th.join(timeout=10)
    for c in clients:
        c.close()
    return ProcessResult(tallies, time.process_time() - cpu0, time.monotonic() - start)


@dataclass
class LoadResult:
    tallies: dict[str, Tally]
    client_cpu_seconds: float
    wall_seconds: float

    def tally(self, name: str) -> Tally:
        return self.tallies.get(name, Tally())


class Load:
    """``with Load(plans) as run:`` starts the processes; ``run.start`` is the monotonic time of
    the common start; ``run.result()`` waits for them and merges what they counted."""

    def __init__(self, plans: list[Plan], lead: float = 1.5) -> None:
        self.plans = plans
        self.lead = lead
        self._pool: ProcessPoolExecutor | None = None
        self._futures: list[Any] = []
        self.start = 0.0

    def __enter__(self) -> Load:
        ctx = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(max_workers=len(self.plans), mp_context=ctx)
        start_wall = time.time() + self.lead
        self.start = time.monotonic() + self.lead
        self._futures = [self._pool.submit(run_plan, p, start_wall) for p in self.plans]
        return self

    def result(self) -> LoadResult:
        merged: dict[str, Tally] = {}
        cpu = wall = 0.0
        for f in self._futures:
            r: ProcessResult = f.result()
            for name, tally in r.tallies.items():
                merged.setdefault(name, Tally()).merge(tally)
            cpu += r.cpu_seconds
            wall = max(wall, r.wall_seconds)
        return LoadResult(merged, cpu, wall)

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return round(ordered[k], 2)


def closed_loop(
    port: int,
    kind: str,
    params: dict[str, Any],
    *,
    processes: int,
    threads: int,
    duration: float,
    warmup: float,
) -> list[Plan]:
    return [
        Plan(port, kind, params, threads, duration, warmup, first_thread=i * threads)
        for i in range(processes)
    ]
