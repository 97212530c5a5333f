"""The measurements, one function each, every one on a fresh database and (but for the reaper,
which is no HTTP route) a fresh gunicorn: the lines of docs/design.md#targets."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.client import Client
from bench.contracts import advert, one_step, two_steps
from bench.database import (
    FLOOR_PINNED_SQL,
    FLOOR_SQL,
    Databases,
    clone_run,
    connect,
    floor_statements,
    pgbench_script,
    run_pgbench,
    vacuum_analyze,
)
from bench.inprocess import client_of, mediator_app
from bench.load import Load, LoadResult, Plan, Tally, closed_loop, percentile
from bench.machine import CpuMeter, record_opening
from bench.server import Reaper, Server, floor, mediator


@dataclass(frozen=True)
class Sizes:
    mode: str
    warmup: float  # seconds of load before a window is counted
    round_seconds: float  # one window of a round (docs/design.md#targets)
    submit_rounds: int  # rounds of a line beside its floor, and of the cancel line
    submit_nodes: int  # the pool shape
    pinned_nodes: int  # the pinned shape
    pgbench_seconds: float
    queued_before: int  # runs QUEUED before a queued line starts (10,000)
    candidates_nodes: tuple[int, int]  # the smaller fleet and the larger of the candidates line
    candidates_rounds: int
    wake_sizes: tuple[int, ...]
    wake_shapes: int
    wake_reps: int  # freed nodes per size (wake_sizes × wake_reps ≤ wake_shapes)
    release_reps: int
    fleet_nodes: int
    fleet_seconds: float
    fleet_claims: tuple[int, ...]
    fleet_advert_every: float  # seconds between two adverts of one node
    fleet_submits_per_s: float
    reaper_steps: int
    reaper_passes: int


FULL = Sizes(
    mode="full",
    warmup=3.0,
    round_seconds=5.0,
    submit_rounds=6,
    submit_nodes=2000,
    pinned_nodes=200,
    pgbench_seconds=20.0,
    queued_before=10_000,
    candidates_nodes=(2000, 20_000),
    candidates_rounds=3,
    wake_sizes=(1000, 10000, 100000),
    wake_shapes=20,
    wake_reps=5,
    release_reps=200,
    fleet_nodes=1000,
    fleet_seconds=45.0,
    fleet_claims=(100, 900),
    fleet_advert_every=10.0,
    fleet_submits_per_s=25.0,
    reaper_steps=1_000_000,
    reaper_passes=5,
)

QUICK = Sizes(
    mode="quick",
    warmup=1.0,
    round_seconds=2.0,
    submit_rounds=2,
    submit_nodes=2000,
    pinned_nodes=200,
    pgbench_seconds=3.0,
    queued_before=10_000,
    candidates_nodes=(2000, 5000),
    candidates_rounds=2,
    wake_sizes=(1000, 10000),
    wake_shapes=20,
    wake_reps=2,
    release_reps=20,
    fleet_nodes=300,
    fleet_seconds=8.0,
    fleet_claims=(50,),
    fleet_advert_every=3.0,
    fleet_submits_per_s=25.0,
    reaper_steps=20_000,
    reaper_passes=3,
)


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Bench:
    dbs: Databases
    workdir: Path
    sizes: Sizes
    workers: int
    threads: int | None
    log_level: str
    processes: int  # client processes of a closed loop
    client_threads: int  # threads in each

    def server(self, db_url: str, name: str, extra: dict[str, str] | None = None) -> Server:
        work = self.workdir / name
        work.mkdir(parents=True, exist_ok=True)
        return mediator(
            db_url,
            work,
            workers=self.workers,
            threads=self.threads,
            log_level=self.log_level,
            extra=extra,
        )

    @property
    def clients(self) -> int:
        return self.processes * self.client_threads

    def measure(
        self,
        srv: Server,
        plans: list[Plan],
        begin: float,
        duration: float,
        probes: Sequence[tuple[float, Callable[[], None]]] = (),
        also: Sequence[int] = (),
    ) -> tuple[LoadResult, dict[str, float]]:
        """Run ``plans`` and snapshot the CPU at the window's edges (``begin`` seconds after the
        common start, ``duration`` long); each probe is called ``offset`` seconds after the
        common start (before the window closes). The processes ``also`` count as the server's."""
        meter = CpuMeter([*srv.pids(), *also], srv.database)
        with Load(plans) as run:
            waits = sorted(
                [(begin, "first"), (begin + duration, "last")]
                + [(offset, i) for i, (offset, _) in enumerate(probes)],
                key=lambda w: w[0],
            )
            snaps = {}
            for offset, what in waits:
                _sleep_until(run.start + offset)
                if isinstance(what, int):
                    probes[what][1]()
                else:
                    snaps[what] = meter.snapshot(time.monotonic())
            result = run.result()
        cores = CpuMeter.cores(snaps["first"], snaps["last"])
        cores["client"] = round(result.client_cpu_seconds / max(result.wall_seconds, 1e-9), 2)
        return result, cores


def _sleep_until(t: float) -> None:
    pause = t - time.monotonic()
    if pause > 0:
        time.sleep(pause)


def summary(tally: Tally, seconds: float, ok: tuple[int, ...]) -> dict[str, Any]:
    good = sum(n for code, n in tally.statuses.items() if code in ok)
    return {
        "per_s": round(good / seconds, 1),
        "p50_ms": percentile(tally.lat_ms, 50),
        "p99_ms": percentile(tally.lat_ms, 99),
        "max_ms": percentile(tally.lat_ms, 100),
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "errors": tally.errors,
    }


def _ok(resp: Any, status: int, what: str) -> Any:
    if resp.status != status:
        raise RuntimeError(f"{what}: expected {status}, got {resp.status}: {resp.data[:500]!r}")
    return resp.json()


class Sweeper:
    """Frees the boards of placed benchmark runs behind the Mediator's back (their lease rows
    deleted every few ms), so a closed loop of placed submits never runs out of free nodes. It
    costs the database one small DELETE per tick, beside thousands of submits. On leaving, once
    the load is over, it frees the last ones too: on the pinned shape a board left held would
    queue the next window's submits that name it."""

    def __init__(self, db_url: str, run_prefix: str, every: float = 0.02) -> None:
        self.db_url, self.prefix, self.every = db_url, run_prefix, every
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.deleted = 0

    def _sweep(self, conn: Any, older_than: str) -> None:
        cur = conn.execute(
            "DELETE FROM leases WHERE run_id LIKE %s AND created_at < now() - %s::interval",
            (self.prefix + "%", older_than),
        )
        self.deleted += cur.rowcount

    def _run(self) -> None:
        with connect(self.db_url) as conn:
            while not self.stop.wait(self.every):
                self._sweep(conn, "5 milliseconds")
            self._sweep(conn, "0 seconds")

    def __enter__(self) -> Sweeper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


# ---------------------------------------------------------------- the lines beside a floor


# Vacuumed and analysed before every window of a line's rounds, so that none starts on the dead
# rows and stale statistics the one before it left.
SUBMIT_TABLES = ("nodes", "leases", "reservations", "runs", "steps", "queue_counts")

# An advert lives lease.renew_seconds × lease.not_after_factor (3 minutes by default). The lines
# that advertise once and then run rounds for minutes give it an hour, so that no node expires
# under them; the factor is read by adverts and the reaper only, on no path these lines time.
LIVE = {"MEDIATOR_LEASE_NOT_AFTER_FACTOR": "60"}

# The sweeper of a window frees the leases of the runs whose ids start with this: ``{prefix}``
# is the window's own prefix (the Mediator's runs), FLOOR_RUNS the floor's (``pgb-…``, leases of
# nodes that do not exist, swept so that both windows read a leases table of the same size).
OWN = "{prefix}-"
FLOOR_RUNS = "pgb-"


def board(n: int) -> str:
    """The attribute value that names the pinned shape's board ``n``."""
    return f"pin-{n:04d}"


@dataclass(frozen=True)
class Shape:
    """A fleet of docs/design.md#targets and the floor's statements for it.

    *pool*: ``nodes`` boards dealt into one slot per client thread (attrs ``{"slot": "s<k>"}``),
    each submit asking for any board of its thread's slot (``nodes`` ÷ clients candidates: 125
    of 2,000 for 16 threads). *pinned*: every board with an attribute of its own (``{"board":
    "pin-NNNN"}``), each submit naming one board (one candidate), the boards dealt to the client
    threads so that no board is named by two threads. Either way two threads never race for one
    node."""

    name: str
    nodes: int
    pinned: bool
    floor_sql: Path

    def attrs(self, n: int, clients: int) -> dict[str, str]:
        """Node ``n``'s attributes, which the submits that want it (and only those) ask for."""
        return {"board": board(n)} if self.pinned else {"slot": f"s{n % clients}"}

    def requirements(self, clients: int) -> int:
        """How many distinct requirements the shape's submits make (node ``k`` has the ``k``-th):
        one a board, or one a slot."""
        return self.nodes if self.pinned else clients

    def params(self, clients: int) -> dict[str, Any]:
        """What load._contract needs so that client thread ``g`` asks only for its own boards:
        its slot's number, or its own boards (``range(g, nodes, clients)``, cycled through)."""
        if not self.pinned:
            return {"slots": clients}
        if clients > self.nodes:
            raise ValueError(f"{clients} client threads for {self.nodes} pinned boards")
        return {
            "boards": [[board(n) for n in range(g, self.nodes, clients)] for g in range(clients)]
        }

    def adverts(self, clients: int) -> list[dict[str, Any]]:
        return [
            advert(f"{self.name}-node-{n:05d}", **self.attrs(n, clients)) for n in range(self.nodes)
        ]


def pool_shape(s: Sizes) -> Shape:
    return Shape("pool", s.submit_nodes, False, FLOOR_SQL)


def pinned_shape(s: Sizes) -> Shape:
    return Shape("pinned", s.pinned_nodes, True, FLOOR_PINNED_SQL)


@dataclass(frozen=True)
class Window:
    """One side of a line's rounds: a closed loop of ``kind`` requests (load.KINDS) carrying
    ``params`` to ``server`` on database ``url``; its rate counts the ``ok`` answers of tally
    ``counted``. Meanwhile a Sweeper frees the leases of the runs whose ids start with ``sweep``
    (``{prefix}``: the window's own; None: no sweeper)."""

    label: str
    server: Server
    url: str
    kind: str
    params: dict[str, Any]
    prefix: str  # of the client's run ids; the round's number is appended
    counted: str
    ok: tuple[int, ...]
    sweep: str | None = OWN
    clients: tuple[int, int] | None = None  # (processes, threads each); None: the bench's


@dataclass
class Rounds:
    """What a line's rounds measured: by window label, every tally pooled over its windows and
    the cores of each window; each round's rate, p50 and p99 by label."""

    seconds: float  # one window's length
    rounds: list[dict[str, Any]] = field(default_factory=list)
    tallies: dict[str, dict[str, Tally]] = field(default_factory=dict)
    cores: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def pooled(self, label: str, name: str, ok: tuple[int, ...]) -> dict[str, Any]:
        """:func:`summary` of tally ``name`` over every window of ``label``."""
        tally = self.tallies.get(label, {}).get(name, Tally())
        return summary(tally, self.seconds * len(self.cores.get(label, [])), ok)

    def mean_cores(self, label: str) -> dict[str, float]:
        return _mean_cores(self.cores.get(label, []))


def _rounds(b: Bench, windows: Sequence[Window], rounds: int) -> Rounds:
    """``rounds`` rounds of ``windows`` (``round_seconds`` each, after ``warmup``), in order in
    even rounds and in reverse in odd ones, so that a drift of the machine's speed (±20 % within
    minutes on the machines we used) moves every side alike. The tables are vacuumed and
    analysed before every window."""
    s = b.sizes
    out = Rounds(s.round_seconds)
    for r in range(rounds):
        row: dict[str, Any] = {}
        for w in windows if r % 2 == 0 else windows[::-1]:
            vacuum_analyze(w.url, SUBMIT_TABLES)
            prefix = f"{w.prefix}{r}"
            processes, threads = w.clients or (b.processes, b.client_threads)
            plans = closed_loop(
                w.server.port,
                w.kind,
                {**w.params, "prefix": prefix},
                processes=processes,
                threads=threads,
                duration=s.round_seconds,
                warmup=s.warmup,
            )
            with ExitStack() as stack:
                if w.sweep is not None:
                    stack.enter_context(Sweeper(w.url, w.sweep.format(prefix=prefix)))
                result, cores = b.measure(w.server, plans, s.warmup, s.round_seconds)
            pooled = out.tallies.setdefault(w.label, {})
            for name, tally in result.tallies.items():
                pooled.setdefault(name, Tally()).merge(tally)
            out.cores.setdefault(w.label, []).append(cores)
            got = summary(result.tally(w.counted), s.round_seconds, w.ok)
            row |= {
                w.label: got["per_s"],
                f"{w.label}_p50_ms": got["p50_ms"],
                f"{w.label}_p99_ms": got["p99_ms"],
            }
            say(
                f"  round {r + 1}: {w.label} {got['per_s']}/s, p50 {got['p50_ms']} ms, "
                f"p99 {got['p99_ms']} ms, {got['statuses']}"
            )
        out.rounds.append(row)
    return out


def _quotient(x: float | None, y: float | None, digits: int) -> float | None:
    return round(x / y, digits) if x is not None and y else None


def _mean_cores(windows: list[dict[str, float]]) -> dict[str, float]:
    """The cores of equally long windows, averaged."""
    keys = windows[0].keys() if windows else ()
    return {k: round(sum(w[k] for w in windows) / len(windows), 2) for k in keys}


def _beside_floor(
    b: Bench,
    url: str,
    *,
    name: str,
    shape: Shape,
    prefix: str,
    ok: tuple[int, ...],
    params: dict[str, Any] | None = None,
    extra: dict[str, str] | None = None,
    prepare: Callable[[Server, str], None] | None = None,
) -> dict[str, Any]:
    """A line beside its floor (docs/design.md#targets): the Mediator (``extra`` in its
    environment) and the floor of ``shape`` up at once on ``url``, the shape advertised,
    ``prepare`` run, then ``submit_rounds`` rounds of a Mediator window and a floor window whose
    submits carry the same contracts (and ``params``: see load._contract). The floor opens its
    Records under the Mediator's Records root. The line's ratio is the median of the rounds'
    ratios; its p99 is pooled over its Mediator windows and set against the floor's, pooled over
    the floor's windows."""
    s = b.sizes
    work = b.workdir / name
    fl_work = work / "floor"
    fl_work.mkdir(parents=True, exist_ok=True)
    threads = b.threads or 1000  # gunicorn.conf.py's default: the same settings as the Mediator
    contracts = {**shape.params(b.clients), **(params or {})}
    with ExitStack() as stack:
        srv = stack.enter_context(b.server(url, name, {**LIVE, **(extra or {})}))
        fsrv = stack.enter_context(
            floor(
                url,
                fl_work,
                workers=b.workers,
                threads=threads,
                sql=shape.floor_sql,
                records=srv.records,
            )
        )
        _advertise_all(srv.port, shape.adverts(b.clients))
        if prepare is not None:
            prepare(srv, url)
        say(
            f"{name}: {b.processes}×{b.client_threads} clients, the {shape.name} shape "
            f"({shape.nodes} nodes), {s.submit_rounds} rounds of a Mediator window and a floor "
            f"window of {s.round_seconds:g} s"
        )
        windows = [
            Window("app", srv, url, "submit", contracts, prefix, "submit", ok),
            Window("floor", fsrv, url, "submit", contracts, "fl", "submit", (201,), FLOOR_RUNS),
        ]
        res = _rounds(b, windows, s.submit_rounds)
    app = res.pooled("app", "submit", ok)
    fl = res.pooled("floor", "submit", (201,))
    for row in res.rounds:
        row["ratio"] = _quotient(row["app"], row["floor"], 3)
    ratios = [row["ratio"] for row in res.rounds if row["ratio"] is not None]
    line = {
        "app_per_s": app["per_s"],
        "floor_per_s": fl["per_s"],
        "ratio": round(statistics.median(ratios), 3) if ratios else None,
        "ratio_min": min(ratios, default=None),
        "ratio_max": max(ratios, default=None),
        "ratio_pooled": _quotient(app["per_s"], fl["per_s"], 3),
        "p50_ms": app["p50_ms"],
        "p99_ms": app["p99_ms"],
        "max_ms": app["max_ms"],
        "floor_p50_ms": fl["p50_ms"],
        "floor_p99_ms": fl["p99_ms"],
        "p99_vs_floor": _quotient(app["p99_ms"], fl["p99_ms"], 2),
        "statuses": app["statuses"],
        "errors": app["errors"],
        "floor_statuses": fl["statuses"],
        "floor_errors": fl["errors"],
        "shape": shape.name,
        "nodes": shape.nodes,
        "clients": f"{b.processes} processes × {b.client_threads} threads, keep-alive",
        "rounds": res.rounds,
        "round_seconds": s.round_seconds,
        "cpu_cores": res.mean_cores("app"),
        "floor_cpu_cores": res.mean_cores("floor"),
    }
    say(
        f"  {name}: {app['per_s']}/s ÷ floor {fl['per_s']}/s: median of the rounds' ratios "
        f"{line['ratio']} (lowest {line['ratio_min']}); pooled p99 {app['p99_ms']} ms, "
        f"floor {fl['p99_ms']} ms ({line['p99_vs_floor']} ×); {line['cpu_cores']}, "
        f"floor {line['floor_cpu_cores']}"
    )
    return line


# ---------------------------------------------------------------- placed submits and pgbench


def _opening(probe: dict[str, float]) -> str:
    return (
        f"p50 {probe['p50_us']} us, p99 {probe['p99_us']} us, {probe['system_us']} us of system CPU"
    )


def placed_submits(b: Bench) -> dict[str, Any]:
    """Placed two-step submits on the pool shape beside its floor (:func:`_beside_floor`); then
    pgbench replaying the floor's statements on the same database, for context. Before the
    rounds and after them, 1,000 Records opened alone on the same file system."""
    s = b.sizes
    url = b.dbs.fresh("submit")
    work = b.workdir / "submit"
    work.mkdir(parents=True, exist_ok=True)
    statements = floor_statements()
    slots = b.clients
    script = work / "submit.pgbench.sql"
    script.write_text(pgbench_script(statements, slots))
    opening = {"before": record_opening(work / "record-probe", "before")}
    say(f"placed submits: opening a Record here, alone: {_opening(opening['before'])}")
    line = _beside_floor(b, url, name="submit", shape=pool_shape(s), prefix="sp", ok=(201,))
    opening["after"] = record_opening(work / "record-probe", "after")
    say(f"  opening a Record here after the rounds: {_opening(opening['after'])}")

    say(f"pgbench: bench/floor.sql ({len(statements)} statements), {slots} clients")
    vacuum_analyze(url, SUBMIT_TABLES)
    pg = run_pgbench(url, script, clients=slots, threads=2, seconds=s.pgbench_seconds)
    say(f"  {pg['tps']} TPS")
    return {
        "submit": {
            **line,
            "pgbench_per_s": pg["tps"],
            "vs_pgbench": _quotient(line["app_per_s"], pg["tps"], 3),
            "record_opening": opening,
        },
        "pgbench": {**pg, "statements": len(statements), "script": script.read_text()},
        # The pool shape's floor, as results.json has always had it.
        "floor": {
            "per_s": line["floor_per_s"],
            "p50_ms": line["floor_p50_ms"],
            "p99_ms": line["floor_p99_ms"],
            "statuses": line["floor_statuses"],
            "cpu_cores": line["floor_cpu_cores"],
        },
    }


def placed_pinned(b: Bench) -> dict[str, Any]:
    """Placed two-step submits on the pinned shape (each naming one board of its client
    thread's own) beside the pinned floor (``bench/floor_pinned.sql``)."""
    url = b.dbs.fresh("submit_pinned")
    line = _beside_floor(
        b, url, name="submit-pinned", shape=pinned_shape(b.sizes), prefix="pp", ok=(201,)
    )
    return {"submit_pinned": line}


# The teams of the placed line with teams: each with a max_nodes it never reaches (the sweeper
# frees the boards within milliseconds), so that every placement of theirs locks its team's
# row and counts its leases (docs/teams.md, "Quotas") without ever being refused.
PLACED_TEAMS = (("kernel", 3), ("qa", 1), ("release", 2))


def placed_submits_teams(b: Bench) -> dict[str, Any]:
    """The placed line on the pool shape (same fleet, clients, sweeper and rounds beside the
    floor), with ``MEDIATOR_TEAMS`` configuring three teams with ``max_nodes`` and the submits
    dealt in turn to those three and to ``default`` (no quota) by ``queue.team``."""
    s = b.sizes
    url = b.dbs.fresh("submit_teams")
    teams = [
        {"name": name, "weight": weight, "max_nodes": s.submit_nodes}
        for name, weight in PLACED_TEAMS
    ]
    dealt = [name for name, _ in PLACED_TEAMS] + ["default"]
    line = _beside_floor(
        b,
        url,
        name="submit-teams",
        shape=pool_shape(s),
        prefix="st",
        ok=(201,),
        params={"teams": dealt},
        extra={"MEDIATOR_TEAMS": json.dumps(teams)},
    )
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT team, count(*) FROM runs WHERE run_id LIKE 'st%' GROUP BY team"
        ).fetchall()
    by_team = {str(team): int(n) for team, n in rows}
    if set(by_team) != set(dealt):
        raise RuntimeError(f"submit-teams: the runs' teams are {by_team}, not {dealt}")
    say(f"  runs by team: {by_team}")
    return {"submit_teams": {**line, "teams": teams, "dealt_to": dealt, "runs_by_team": by_team}}


# ---------------------------------------------------------------- queued submits


def _hold_and_queue(b: Bench, shape: Shape) -> Callable[[Server, str], None]:
    """What a queued line prepares once the shape is advertised: a run holding every board (the
    holders of one requirement sent in order from one thread, so that none races another for a
    board and queues), then ``queued_before`` runs QUEUED, dealt evenly over the shape's
    requirements (docs/design.md#targets): one queued by a submit for each, copied by SQL as the
    Mediator wrote it (interleaved in arrival order), then ``VACUUM ANALYZE``."""
    clients = b.clients

    def prepare(srv: Server, url: str) -> None:
        keys = shape.requirements(clients)
        holders = [
            [two_steps(f"qh-{n}", **shape.attrs(n, clients)) for n in range(k, shape.nodes, keys)]
            for k in range(keys)
        ]
        say(f"  {shape.nodes} holders, then {b.sizes.queued_before} runs queued over {keys}")
        _post_all(srv.port, "/v1/runs", holders, 201, "holder")
        with connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM leases WHERE run_id LIKE 'qh-%'").fetchone()
        if not row or row[0] != shape.nodes:
            raise RuntimeError(f"{row[0] if row else 0} boards held, not {shape.nodes}")
        firsts = [[two_steps(f"qf{k:03d}-0", **shape.attrs(k, clients))] for k in range(keys)]
        _post_all(srv.port, "/v1/runs", firsts, 202, "queued")
        each = max(1, b.sizes.queued_before // keys)
        for k in range(keys):
            clone_run(url, f"qf{k:03d}-0", f"qf{k:03d}-", 1, each - 1, every_us=keys, offset_us=k)
        vacuum_analyze(url)

    return prepare


def _queued_count(url: str) -> int:
    with connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM runs WHERE state = 'QUEUED'").fetchone()
    return int(row[0]) if row else 0


def _queued_line(b: Bench, shape: Shape, name: str, prefix: str) -> dict[str, Any]:
    """Submits that all queue (202), every board held by a run, behind ``queued_before`` runs
    already QUEUED, beside the floor of the shape (the placed statements: the floor has no
    queue); each queued submit with its post-queue wake scan, which ends at its check when no
    wake mark was taken since the submit's read
    (docs/queue.md#on-submit-placed-queued-or-rejected)."""
    url = b.dbs.fresh(name.replace("-", "_"))
    line = _beside_floor(
        b, url, name=name, shape=shape, prefix=prefix, ok=(202,), prepare=_hold_and_queue(b, shape)
    )
    depth = _queued_count(url)
    say(f"  {depth} runs queued at the end")
    return {**line, "queue_depth_at_start": b.sizes.queued_before, "queue_depth_at_end": depth}


def queued_submits(b: Bench) -> dict[str, Any]:
    """Queued submits on the pool shape: each asks for a board of its thread's slot, all 125
    held."""
    return {"queued": _queued_line(b, pool_shape(b.sizes), "queued", "qd")}


def queued_pinned(b: Bench) -> dict[str, Any]:
    """Queued submits on the pinned shape: each names one of its thread's own boards, held."""
    return {"queued_pinned": _queued_line(b, pinned_shape(b.sizes), "queued-pinned", "qp")}


# ---------------------------------------------------------------- the fleet's size


def candidates(b: Bench) -> dict[str, Any]:
    """The fleet's size costs nothing per request (docs/design.md#targets): two fresh databases,
    each with N live nodes of one kind (``candidates_nodes``: the smaller N and the larger), every
    node a board that any submit of the line fits (attrs ``{"kind": "x", "n": "<i>"}``, the
    contract asking for ``kind: x``), both gunicorns up at once. One client thread (so that no
    two submits race for the first free node) sends dry-runs, then placed submits (the sweeper
    frees their leases), in rounds alternating the two fleets; the p50 at the larger N against the
    p50 at the smaller, for each."""
    s = b.sizes
    contract = {"attrs": {"kind": "x"}}
    fleets: list[tuple[int, Server, str]] = []
    advertised: dict[str, float] = {}
    with ExitStack() as stack:
        for n in s.candidates_nodes:
            url = b.dbs.fresh(f"candidates{n}")
            srv = stack.enter_context(b.server(url, f"candidates{n}", LIVE))
            t0 = time.monotonic()
            _advertise_all(
                srv.port, [advert(f"c-node-{i:05d}", kind="x", n=str(i)) for i in range(n)]
            )
            advertised[str(n)] = round(time.monotonic() - t0, 1)
            vacuum_analyze(url, SUBMIT_TABLES)
            say(f"candidates: {n} nodes advertised in {advertised[str(n)]} s")
            fleets.append((n, srv, url))
        kinds = (("dry-run", (200,), None), ("submit", (201,), OWN))
        windows = [
            Window(f"{what}@{n}", srv, url, what, contract, f"c{n}-", what, ok, sweep, (1, 1))
            for what, ok, sweep in kinds
            for n, srv, url in fleets
        ]
        say(
            f"candidates: dry-runs and placed submits, one client thread, "
            f"{s.candidates_rounds} rounds of {len(windows)} windows of {s.round_seconds:g} s"
        )
        res = _rounds(b, windows, s.candidates_rounds)
        for n, _, url in fleets:
            with connect(url) as conn:
                row = conn.execute("SELECT count(*) FROM nodes WHERE expires_at > now()").fetchone()
            if not row or row[0] != n:
                raise RuntimeError(f"candidates: {row[0] if row else 0} live nodes, not {n}")
    small, large = (str(n) for n in s.candidates_nodes)
    out: dict[str, Any] = {
        "nodes": list(s.candidates_nodes),
        "client": "1 process × 1 thread, closed loop",
        "advert_seconds": advertised,
        "rounds": res.rounds,
        "round_seconds": s.round_seconds,
        "cpu_cores": {w.label: res.mean_cores(w.label) for w in windows},
    }
    for what, ok, _ in kinds:
        by_n = {str(n): res.pooled(f"{what}@{n}", what, ok) for n, _, _ in fleets}
        ratio = _quotient(by_n[large]["p50_ms"], by_n[small]["p50_ms"], 2)
        out[what.replace("-", "_")] = {**by_n, "p50_ratio": ratio}
        say(
            f"  {what}: p50 {by_n[small]['p50_ms']} ms at {small} nodes, "
            f"{by_n[large]['p50_ms']} ms at {large}: {ratio} ×"
        )
    return {"candidates": out}


# ---------------------------------------------------------------- cancels


def cancel(b: Bench) -> dict[str, Any]:
    """Cancels on the pinned shape: rounds of a window of placed submits (the sweeper frees the
    boards) and a window of pairs, each client thread submitting a placed run naming one of its
    own boards and then cancelling it (the cancel frees the board), closed loop. A pair costs a
    placed submit and a cancel, so the rate of cancels alone is 1 ÷ (1 / pairs − 1 / placed):
    set against the placed rate, x ÷ (1 − x) with x = pairs ÷ placed of the same round (the
    median round's). Then one placed submit's statements and its cancel's, counted in this
    process."""
    s = b.sizes
    shape = pinned_shape(s)
    url = b.dbs.fresh("cancel")
    params = shape.params(b.clients)
    with b.server(url, "cancel", LIVE) as srv:
        _advertise_all(srv.port, shape.adverts(b.clients))
        say(
            f"cancel: {b.processes}×{b.client_threads} clients, the pinned shape "
            f"({shape.nodes} nodes), {s.submit_rounds} rounds of a placed window and a "
            f"submit-and-cancel window of {s.round_seconds:g} s"
        )
        windows = [
            Window("placed", srv, url, "submit", params, "cp", "submit", (201,)),
            Window("pairs", srv, url, "submit-cancel", params, "cc", "cancel", (200,), None),
        ]
        res = _rounds(b, windows, s.submit_rounds)
    for row in res.rounds:
        row["pairs_vs_placed"] = x = _quotient(row["pairs"], row["placed"], 3)
        row["ratio"] = _alone(x)
    xs = [row["pairs_vs_placed"] for row in res.rounds if row["pairs_vs_placed"] is not None]
    x = round(statistics.median(xs), 3) if xs else None
    placed = res.pooled("placed", "submit", (201,))
    cancels = res.pooled("pairs", "cancel", (200,))
    submits = res.pooled("pairs", "submit", (201,))
    ratio = _alone(x)
    statements = statement_counts(url, b.workdir / "cancel", board(0))
    out = {
        "cancels_per_s": cancels["per_s"],
        "cancel_p50_ms": cancels["p50_ms"],
        "cancel_p99_ms": cancels["p99_ms"],
        "cancel_statuses": cancels["statuses"],
        "pair_submit_p50_ms": submits["p50_ms"],
        "pair_submit_statuses": submits["statuses"],
        "placed_per_s": placed["per_s"],
        "placed_p50_ms": placed["p50_ms"],
        "placed_p99_ms": placed["p99_ms"],
        "placed_statuses": placed["statuses"],
        "pairs_vs_placed": x,
        "cancel_vs_placed": ratio,
        "cancel_alone_per_s": round(ratio * placed["per_s"], 1) if ratio is not None else None,
        # The same from the pairs' latencies alone: a request's share of a saturated server's
        # time, if it is shared evenly, is its p50's share.
        "cancel_vs_placed_by_latency": _quotient(submits["p50_ms"], cancels["p50_ms"], 3),
        "statements": statements,
        "shape": shape.name,
        "nodes": shape.nodes,
        "clients": f"{b.processes} processes × {b.client_threads} threads, keep-alive",
        "rounds": res.rounds,
        "round_seconds": s.round_seconds,
        "cpu_cores": res.mean_cores("pairs"),
        "placed_cpu_cores": res.mean_cores("placed"),
    }
    say(
        f"  cancel: {cancels['per_s']} pairs/s against {placed['per_s']} placed/s (median "
        f"round {x}): cancels alone at {ratio} × the placed rate; cancel p50 "
        f"{cancels['p50_ms']} ms, p99 {cancels['p99_ms']} ms; statements {statements}"
    )
    return {"cancel": out}


def _alone(x: float | None) -> float | None:
    """The rate of cancels alone over the placed rate, from x = pairs ÷ placed (None when a pair
    was measured as fast as a submit alone: no cost of the cancel's is left to see)."""
    return round(x / (1 - x), 3) if x is not None and x < 1 else None


def statement_counts(
    url: str, work: Path, name: str, *, advertise: bool = False, prefix: str = "cs"
) -> dict[str, int]:
    """The statements of one placed submit naming board ``name`` and of its cancel, counted in
    this process as tests/perf counts them (SQLAlchemy's ``before_cursor_execute`` on the app's
    engine, from this thread: the test client serves the request in it), after a warm pair.
    ``advertise``: the board is advertised first (from this process); the runs are named after
    ``prefix``."""
    from sqlalchemy import event

    records = work / f"{prefix}-records"
    records.mkdir(parents=True, exist_ok=True)
    seen: list[str] = []
    here = threading.get_ident()

    def on_execute(*args: Any) -> None:
        if threading.get_ident() == here:
            seen.append(args[2])  # (conn, cursor, statement, parameters, context, executemany)

    counts: dict[str, int] = {}
    with mediator_app(url, records) as app:
        c = client_of(app)
        engine = app.extensions["mediator"].db.engine
        event.listen(engine, "before_cursor_execute", on_execute)
        try:
            if advertise:
                resp = c.post("/v1/nodes", json=advert(name, board=name))
                if resp.status_code != 200:
                    raise RuntimeError(f"advert: {resp.status_code}: {resp.get_data()[:300]!r}")
            for run_id in (f"{prefix}-warm", f"{prefix}-counted"):
                sends = (
                    ("submit_placed", "/v1/runs", two_steps(run_id, board=name), 201),
                    ("cancel", f"/v1/runs/{run_id}/cancel", None, 200),
                )
                for key, path, doc, status in sends:
                    seen.clear()
                    resp = c.post(path, json=doc) if doc is not None else c.post(path)
                    if resp.status_code != status:
                        raise RuntimeError(f"{key}: {resp.status_code}: {resp.get_data()[:300]!r}")
                    counts[key] = len(seen)
        finally:
            event.remove(engine, "before_cursor_execute", on_execute)
    return counts


# ---------------------------------------------------------------- wake scan


def _wake_line(srv: Server, request_id: str, timeout: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        for line in srv.log_lines():
            if line.get("event") == "wake scan" and line.get("request_id") == request_id:
                return line
        if time.monotonic() > deadline:
            raise RuntimeError(f"no wake-scan log line for request {request_id}")
        time.sleep(0.05)


def wake_scan(b: Bench) -> dict[str, Any]:
    """``wake_shapes`` requirement shapes, each a board held by a run and a queue of runs
    waiting for it; the queue is grown by SQL (copies of each shape's first queued run). At each
    size, a cancel frees one board and its wake scan promotes the oldest run of that shape; the
    scan's time is the ``ms`` of its "wake scan" log line."""
    return _wake_scan(b, reserving=False)


# The reserving line: the server's ``queue.reserve_after_seconds``, and how far back the
# reserving runs' ``created_at`` is moved (far past the threshold, while every other run of the
# phase, created minutes ago at most, stays far short of it).
RESERVE_AFTER_SECONDS = 3600
AGED_BY_SECONDS = 2 * RESERVE_AFTER_SECONDS
RESERVING_PERCENT = 5


def wake_scan_reserving(b: Bench) -> dict[str, Any]:
    """The wake-scan line with ``RESERVING_PERCENT`` % of the queued runs reserving
    (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits): the same shapes, sizes,
    cancels and timing as :func:`wake_scan`, but at each size the oldest queued runs of every shape
    (5 % of the size, spread evenly over the shapes) are made older than
    ``queue.reserve_after_seconds``, so every scan runs its reservation step. Each shape's oldest
    run then holds its shape's board, and it is also the run the plain line's scan promotes when
    that board is freed: both lines promote the same run. Before each timed cancel an untimed scan
    (in this process) settles the reservations, so the timed scan finds one reservation per shape
    and keeps them all (no write) before its ordinary pass."""
    return _wake_scan(b, reserving=True)


def _quota(total: int, shapes: int) -> list[int]:
    """``total`` runs dealt over ``shapes``, the first ones getting one more."""
    return [total // shapes + (1 if k < total % shapes else 0) for k in range(shapes)]


def _age_oldest(url: str, shapes: int, total: int) -> int:
    """Move back the ``created_at`` of the oldest QUEUED runs of each shape (``total`` over all
    shapes) that are not aged yet, past ``RESERVE_AFTER_SECONDS``; they stay the oldest of
    their shape, in the same order. Returns the QUEUED runs aged now, checked against
    ``total``."""
    with connect(url) as conn:
        for k, n in enumerate(_quota(total, shapes)):
            conn.execute(
                "UPDATE runs SET created_at = created_at - make_interval(secs => %(by)s)"
                " WHERE run_id IN (SELECT run_id FROM runs WHERE state = 'QUEUED'"
                "   AND run_id LIKE %(prefix)s ORDER BY priority DESC, created_at, run_id"
                "   LIMIT %(n)s)"
                " AND created_at > now() - make_interval(secs => %(after)s)",
                {
                    "by": AGED_BY_SECONDS,
                    "prefix": f"wq{k:02d}-%",
                    "n": n,
                    "after": RESERVE_AFTER_SECONDS,
                },
            )
        aged = _aged_count(conn)
    if aged != total:
        raise RuntimeError(f"wake scan (reserving): {aged} aged queued runs, not {total}")
    return aged


def _aged_count(conn: Any) -> int:
    row = conn.execute(
        "SELECT count(*) FROM runs WHERE state = 'QUEUED'"
        " AND created_at <= now() - make_interval(secs => %s)",
        (RESERVE_AFTER_SECONDS,),
    ).fetchone()
    return int(row[0]) if row else 0


def _check_reservations(url: str, shapes: int) -> dict[str, str]:
    """node -> holder; fails unless every shape's board is reserved by the oldest QUEUED run of
    its shape (the run a freed board promotes in the plain line too)."""
    with connect(url) as conn:
        held = dict(conn.execute("SELECT node_id, run_id FROM reservations").fetchall())
        heads = dict(
            conn.execute(
                "SELECT DISTINCT ON (split_part(run_id, '-', 1)) split_part(run_id, '-', 1),"
                " run_id FROM runs WHERE state = 'QUEUED' AND run_id LIKE 'wq%'"
                " ORDER BY split_part(run_id, '-', 1), priority DESC, created_at, run_id"
            ).fetchall()
        )
    want = {f"w-node-{k:02d}": heads.get(f"wq{k:02d}") for k in range(shapes)}
    if held != want:
        raise RuntimeError(
            f"wake scan (reserving): the reservations table holds {len(held)} rows, not one "
            f"per shape held by its oldest queued run: {sorted(held.items())[:5]}… "
            f"want {sorted(want.items())[:5]}…"
        )
    return held


def _reservation_count(url: str) -> int:
    with connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM reservations").fetchone()
    return int(row[0]) if row else 0


def _state(url: str, run_id: str) -> str | None:
    with connect(url) as conn:
        row = conn.execute("SELECT state FROM runs WHERE run_id = %s", (run_id,)).fetchone()
    return str(row[0]) if row else None


def _wake_scan(b: Bench, *, reserving: bool) -> dict[str, Any]:
    s = b.sizes
    shapes = s.wake_shapes
    if len(s.wake_sizes) * s.wake_reps > shapes:
        raise ValueError("each freed node needs a shape of its own")
    name = "wake-reserving" if reserving else "wake"
    title = "wake scan (5 % reserving)" if reserving else "wake scan"
    url = b.dbs.fresh(name.replace("-", "_"))
    extra = {"MEDIATOR_QUEUE_RESERVE_AFTER_SECONDS": str(RESERVE_AFTER_SECONDS)}
    out: dict[str, Any] = {}
    detail: dict[str, Any] = {}
    with ExitStack() as stack:
        srv = stack.enter_context(b.server(url, name, extra if reserving else None))
        settle: Callable[[], float] | None = None
        if reserving:
            from app.services.queue import wake_queued

            records = b.workdir / name / "inprocess-records"
            records.mkdir(parents=True, exist_ok=True)
            overrides = {"queue.reserve_after_seconds": RESERVE_AFTER_SECONDS}
            app = stack.enter_context(mediator_app(url, records, overrides))
            ctx = app.extensions["mediator"]

            def settle_now() -> float:
                report = wake_queued(ctx, "bench: settle reservations")
                if report.skipped or report.errors or report.promoted:
                    raise RuntimeError(f"wake scan (reserving): the settling scan did {report}")
                return round(report.seconds * 1000, 1)

            settle = settle_now

        c = Client(srv.port)
        for k in range(shapes):
            soc = f"w{k:02d}"
            _ok(c.post("/v1/nodes", advert(f"w-node-{k:02d}", soc=soc)), 200, "advert")
            _ok(c.post("/v1/runs", two_steps(f"wh-{k:02d}", soc=soc)), 201, "holder")
            _ok(c.post("/v1/runs", two_steps(f"wq{k:02d}-0", soc=soc)), 202, "queued")
        per_shape_have = 1
        freed = 0
        for size in s.wake_sizes:
            per_shape = max(1, size // shapes)
            say(f"{title}: growing the queue to {per_shape * shapes} runs of {shapes} shapes")
            for k in range(shapes):
                # Copies of the shape's newest run: the oldest ones may have been promoted.
                clone_run(
                    url,
                    f"wq{k:02d}-{per_shape_have - 1}",
                    f"wq{k:02d}-",
                    per_shape_have,
                    per_shape - 1,
                    every_us=shapes,
                    offset_us=k,
                )
            per_shape_have = max(per_shape_have, per_shape)
            aged = 0
            if reserving:
                aged = _age_oldest(url, shapes, size * RESERVING_PERCENT // 100)
            vacuum_analyze(url)
            # Re-advertise: the nodes stay live however long the copying took.
            for k in range(shapes):
                c.post("/v1/nodes", advert(f"w-node-{k:02d}", soc=f"w{k:02d}"))
            ms: list[float] = []
            cancel_ms: list[float] = []
            settle_ms: list[float] = []
            after: list[int] = []
            lines = []
            for _ in range(s.wake_reps):
                k = freed
                freed += 1
                holder = None
                if settle is not None:
                    settle_ms.append(settle())
                    holder = _check_reservations(url, shapes)[f"w-node-{k:02d}"]
                rid = f"bench-{name}-{size}-{k}"
                t0 = time.monotonic()
                resp = c.request("POST", f"/v1/runs/wh-{k:02d}/cancel", b"", {"X-Request-Id": rid})
                cancel_ms.append((time.monotonic() - t0) * 1000)
                _ok(resp, 200, "cancel")
                line = _wake_line(srv, rid)
                ms.append(float(line["ms"]))
                keys = ("queued", "shapes", "looked", "promoted", "passes", "ms")
                lines.append({key: line.get(key) for key in keys})
                if holder is not None:
                    if line.get("promoted") != 1 or _state(url, holder) != "RUNNING":
                        raise RuntimeError(
                            f"{title}: the freed board did not promote its holder {holder} "
                            f"alone: {line}, {holder} is {_state(url, holder)}"
                        )
                    # shapes - 1: the scan kept every reservation, wrote none, and its
                    # promotion deleted the holder's.
                    after.append(_reservation_count(url))
            out[str(size)] = round(statistics.median(ms), 1)
            detail[str(size)] = {
                "scan_ms": ms,
                "cancel_ms": [round(x, 1) for x in cancel_ms],
                "scans": lines,
            }
            if reserving:
                detail[str(size)].update(
                    {
                        "reserving_runs": aged,
                        "reservations": shapes,
                        "reservations_after_scan": after,
                        "settle_scan_ms": settle_ms,
                    }
                )
            say(f"  {size}: scan {out[str(size)]} ms (median of {ms}), scans {lines}")
            if reserving:
                say(
                    f"  {aged} runs reserving, {shapes} reservations before each scan, "
                    f"{after} after; settling scans {settle_ms} ms"
                )
        c.close()
    if reserving:
        return {"wake_scan_reserving_ms": out, "wake_scan_reserving_detail": detail}
    return {"wake_scan_ms": out, "wake_scan_detail": detail}


# ---------------------------------------------------------------- release -> claim


def release_to_claim(b: Bench) -> dict[str, Any]:
    """One board; a run holds it and a second waits in the queue; a claim of the board waits in
    long poll on a connection of its own (any worker). The time from sending the cancel of the
    holder to the waiting claim's answer with the promoted run's step."""
    s = b.sizes
    url = b.dbs.fresh("release")
    lat: list[float] = []
    cancel: list[float] = []
    warm = 3
    with b.server(url, "release") as srv:
        c = Client(srv.port)
        _ok(c.post("/v1/nodes", advert("rc-node", soc="rc")), 200, "advert")
        _ok(c.post("/v1/runs", one_step("rc-0", soc="rc")), 201, "first run")
        _ok(c.post("/v1/nodes/rc-node/claim?wait=0"), 200, "first claim")
        say(f"release → claim: {s.release_reps} releases")
        for i in range(s.release_reps + warm):
            _ok(c.post("/v1/runs", one_step(f"rc-{i + 1}", soc="rc")), 202, "queued run")
            got: dict[str, Any] = {}

            def wait_claim(got: dict[str, Any] = got) -> None:
                w = Client(srv.port)
                try:
                    got["resp"] = w.post("/v1/nodes/rc-node/claim?wait=30")
                    got["at"] = time.monotonic()
                finally:
                    w.close()

            waiter = threading.Thread(target=wait_claim, daemon=True)
            waiter.start()
            time.sleep(0.05)  # the claim reaches its worker and waits (no event says so)
            t0 = time.monotonic()
            _ok(c.post(f"/v1/runs/rc-{i}/cancel"), 200, "cancel")
            t1 = time.monotonic()
            waiter.join(timeout=40)
            body = _ok(got["resp"], 200, "waiting claim")
            if body.get("run_id") != f"rc-{i + 1}":
                raise RuntimeError(f"the claim got {body.get('run_id')}, not rc-{i + 1}")
            if i >= warm:
                lat.append((got["at"] - t0) * 1000)
                cancel.append((t1 - t0) * 1000)
        c.close()
    out = {"p50": percentile(lat, 50), "p99": percentile(lat, 99), "max": percentile(lat, 100)}
    say(f"  release → claim p50 {out['p50']} ms, p99 {out['p99']} ms")
    return {
        "release_to_claim_ms": {
            **out,
            "releases": len(lat),
            "cancel_p50_ms": percentile(cancel, 50),
            "cancel_p99_ms": percentile(cancel, 99),
        }
    }


# ---------------------------------------------------------------- a fleet


def fleet(b: Bench) -> dict[str, Any]:
    """``fleet_nodes`` nodes heartbeating every ``fleet_advert_every`` s (paced), W claims
    waiting in long poll on idle nodes, and ``fleet_submits_per_s`` placed submits a second on
    the rest of the fleet (their boards freed by the :class:`Sweeper`, so the fleet never fills
    up)."""
    s = b.sizes
    runs: dict[str, Any] = {}
    n = s.fleet_nodes
    submit_threads = 32
    # The idle part (as many nodes as the most claims waiting: the targets have 900 of 1,000 nodes
    # waiting in claim) waits in long poll; the rest is the work part, dealt out in slots, one to
    # each submit thread (see load._submit).
    idle = max(s.fleet_claims)
    if n - idle < submit_threads:
        raise ValueError("the work part of the fleet needs a node for each submit thread")
    attrs = [
        {"pool": "idle"} if i < idle else {"pool": "work", "slot": f"s{i % submit_threads}"}
        for i in range(n)
    ]
    for waiting in s.fleet_claims:
        url = b.dbs.fresh(f"fleet{waiting}")
        work = b.workdir / f"fleet{waiting}"
        # The targets count the reaper's CPU with the server's: one beside it, as in production.
        with b.server(url, f"fleet{waiting}") as srv, Reaper(srv, work) as reaper:
            _advertise_all(srv.port, [advert(f"f-node-{i:05d}", **attrs[i]) for i in range(n)])
            rss0 = srv.rss_kib()
            # Enough threads that a paced request never waits for a free one: its latency
            # is then the server's, counted from the time it was due.
            advert_threads = 48
            lead = 4.0  # the claims are waiting before the window opens
            plans = [
                Plan(
                    srv.port,
                    "claim",
                    {"prefix": "f-node-", "wait": None},
                    threads=waiting,
                    duration=s.fleet_seconds,
                    warmup=lead,
                    grace=0.0,  # long polls: cut off when the window closes
                ),
                Plan(
                    srv.port,
                    "advert",
                    {
                        "prefix": "f-node-",
                        "nodes": n,
                        "threads_total": advert_threads,
                        "attrs_of": attrs,
                    },
                    threads=advert_threads,
                    duration=s.fleet_seconds,
                    warmup=1.0,
                    rate=n / s.fleet_advert_every,
                    start_delay=lead - 1.0,
                ),
                Plan(
                    srv.port,
                    "submit",
                    {"prefix": f"fs{waiting}", "attrs": {"pool": "work"}, "slots": submit_threads},
                    threads=submit_threads,
                    duration=s.fleet_seconds,
                    warmup=1.0,
                    rate=s.fleet_submits_per_s,
                    start_delay=lead - 1.0,
                ),
            ]
            rss: dict[str, int] = {}

            def sample(srv: Server = srv, rss: dict[str, int] = rss) -> None:
                rss["claims"] = srv.rss_kib()

            say(
                f"fleet: {n} nodes, {n / s.fleet_advert_every:g} adverts/s, {waiting} waiting "
                f"claims, {s.fleet_submits_per_s:g} submits/s, {s.fleet_seconds:g} s"
            )
            # The server's memory once the claims wait, before the other load starts.
            with Sweeper(url, f"fs{waiting}-"):
                result, cores = b.measure(
                    srv,
                    plans,
                    lead,
                    s.fleet_seconds,
                    probes=[(lead - 1.5, sample)],
                    also=[reaper.pid],
                )
        sub = summary(result.tally("submit"), s.fleet_seconds, (201,))
        adv = summary(result.tally("advert"), s.fleet_seconds, (200,))
        claims = result.tally("claim")
        per_claim = (rss.get("claims", rss0) - rss0) / waiting if waiting else 0
        runs[str(waiting)] = {
            "nodes": n,
            "waiting_claims": waiting,
            "submit_p50_ms": sub["p50_ms"],
            "submit_p99_ms": sub["p99_ms"],
            "advert_p50_ms": adv["p50_ms"],
            "advert_p99_ms": adv["p99_ms"],
            "submits_per_s": sub["per_s"],
            "submits_offered_per_s": s.fleet_submits_per_s,
            "adverts_per_s": adv["per_s"],
            "adverts_offered_per_s": round(n / s.fleet_advert_every, 1),
            "submit_statuses": sub["statuses"],
            "advert_statuses": adv["statuses"],
            "late_requests": result.tally("submit").late + result.tally("advert").late,
            "claims_answered": {str(k): v for k, v in sorted(claims.statuses.items())},
            "server_rss_mib": round(rss0 / 1024, 1),
            "rss_kib_per_waiting_claim": round(per_claim, 1),
            "seconds": s.fleet_seconds,
            "cpu_cores": cores,
        }
        say(
            f"  submit p99 {sub['p99_ms']} ms, advert p99 {adv['p99_ms']} ms, "
            f"{round(per_claim)} KiB a waiting claim, {cores}"
        )
    largest = runs[str(max(s.fleet_claims))]
    return {"fleet": dict(largest), "fleet_by_claims": runs}


def _post_all(
    port: int, path: str, lanes: Sequence[Sequence[dict[str, Any]]], status: int, what: str
) -> None:
    """POST every document of ``lanes`` from 8 threads of one connection each, a lane's documents
    in order from one thread (two holders of one requirement must not race for its boards), each
    answered ``status``."""

    def send(mine: Sequence[Sequence[dict[str, Any]]]) -> None:
        c = Client(port)
        try:
            for lane in mine:
                for doc in lane:
                    _ok(c.post(path, doc), status, what)
        finally:
            c.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(send, [lanes[i::8] for i in range(8)]))


def _advertise_all(port: int, adverts: list[dict[str, Any]]) -> None:
    _post_all(port, "/v1/nodes", [[doc] for doc in adverts], 200, "advert")


# ---------------------------------------------------------------- reaper


def _time_passes(reap: Callable[[], Any], passes: int) -> list[float]:
    reap()  # warm: connections, prepared statements
    out = []
    for _ in range(passes):
        t0 = time.monotonic()
        reap()
        out.append(round((time.monotonic() - t0) * 1000, 2))
    return out


def reaper(b: Bench) -> dict[str, Any]:
    """Reaper passes (in this process: the reaper is no HTTP route) on an empty database, then
    with ``reaper_steps`` finished steps of history: sealed two-step runs, and rejected submits
    (no steps, no Record) at one in twenty, copied by SQL from runs the Mediator finished."""
    from app.services.reaper import reap_pass

    s = b.sizes
    url = b.dbs.fresh("reaper")
    records = b.workdir / "reaper" / "records"
    records.mkdir(parents=True, exist_ok=True)
    with mediator_app(url, records) as app:
        ctx = app.extensions["mediator"]
        c = client_of(app)

        def reap() -> Any:
            report = reap_pass(ctx)
            if report.skipped:
                raise RuntimeError("another reaper holds the pass lock")
            return report

        empty = _time_passes(reap, s.reaper_passes)
        say(f"reaper: empty database, passes {empty} ms")
        assert c.post("/v1/nodes", json=advert("r-node", soc="reap")).status_code == 200
        assert c.post("/v1/runs", json=two_steps("rf-0", soc="reap")).status_code == 201
        for seq in (1, 2):
            step = c.post("/v1/nodes/r-node/claim?wait=0")
            assert step.status_code == 200, step.get_json()
            done = c.post(
                f"/v1/runs/rf-0/steps/{seq}/result",
                json={"node": "r-node", "exit_code": 0, "produced": []},
            )
            assert done.status_code == 200, done.get_json()
        view = c.get("/v1/runs/rf-0").get_json()
        if view["state"] != "SUCCEEDED":
            raise RuntimeError(f"the history's template run ended {view['state']}")
        assert c.post("/v1/runs", json=two_steps("rj-0", soc="no-such-board")).status_code == 422
        finished = max(1, s.reaper_steps // 2)
        rejected = max(1, finished // 20)
        say(f"reaper: writing {finished} finished runs ({2 * finished} steps), {rejected} rejects")
        chunk = 100_000
        # The steps of the history ran on a fleet of a thousand nodes, not all on one.
        spread = {("steps", "node_id"): "'hist-node-' || (g % 1000)::text"}
        for first in range(1, finished, chunk):
            last = min(finished - 1, first + chunk - 1)
            clone_run(url, "rf-0", "rf-", first, last, overrides=spread)
        clone_run(url, "rj-0", "rj-", 1, rejected - 1, tables=("runs", "run_events"))
        vacuum_analyze(url)
        with connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM steps").fetchone()
            steps = row[0] if row else 0
        history = _time_passes(reap, s.reaper_passes)
        say(f"reaper: {steps} steps of history, passes {history} ms")
    e, h = statistics.median(empty), statistics.median(history)
    return {
        "reaper_pass_ms": {
            "empty": round(e, 2),
            "1M_steps": round(h, 2),
            "ratio": round(h / e, 2) if e else None,
            "steps": steps,
            "finished_runs": finished,
            "rejected_runs": rejected,
            "passes_empty_ms": empty,
            "passes_history_ms": history,
        }
    }


PHASES: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "submit": placed_submits,
    "submit-pinned": placed_pinned,
    "submit-teams": placed_submits_teams,
    "queued": queued_submits,
    "queued-pinned": queued_pinned,
    "candidates": candidates,
    "cancel": cancel,
    "wake": wake_scan,
    "wake-reserving": wake_scan_reserving,
    "release": release_to_claim,
    "fleet": fleet,
    "reaper": reaper,
}
