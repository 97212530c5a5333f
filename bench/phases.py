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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.client import Client
from bench.contracts import advert, one_step, two_steps
from bench.database import (
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
    submit_seconds: float
    submit_rounds: int  # alternating windows of the placed line and of the floor
    submit_nodes: int
    pgbench_seconds: float
    floor_seconds: float
    queued_seconds: float
    queued_before: int  # runs QUEUED before the queued-submit line starts (10,000)
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
    submit_seconds=20.0,
    submit_rounds=4,
    submit_nodes=2000,
    pgbench_seconds=20.0,
    floor_seconds=20.0,
    queued_seconds=15.0,
    queued_before=10_000,
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
    submit_seconds=4.0,
    submit_rounds=2,
    submit_nodes=2000,
    pgbench_seconds=3.0,
    floor_seconds=4.0,
    queued_seconds=3.0,
    queued_before=10_000,
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
    costs the database one small DELETE per tick, beside thousands of submits."""

    def __init__(self, db_url: str, run_prefix: str, every: float = 0.02) -> None:
        self.db_url, self.prefix, self.every = db_url, run_prefix, every
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.deleted = 0

    def _run(self) -> None:
        with connect(self.db_url) as conn:
            while not self.stop.wait(self.every):
                cur = conn.execute(
                    "DELETE FROM leases WHERE run_id LIKE %s"
                    " AND created_at < now() - interval '5 milliseconds'",
                    (self.prefix + "%",),
                )
                self.deleted += cur.rowcount

    def __enter__(self) -> Sweeper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


# ---------------------------------------------------------------- placed submits and pgbench


# Vacuumed and analysed before each of the three windows on the one database (ours, pgbench's,
# the floor's), so none starts on the dead rows and stale statistics the one before it left.
SUBMIT_TABLES = ("nodes", "leases", "reservations", "runs", "steps", "queue_counts")


def _opening(probe: dict[str, float]) -> str:
    return (
        f"p50 {probe['p50_us']} us, p99 {probe['p99_us']} us, {probe['system_us']} us of system CPU"
    )


def placed_submits(b: Bench) -> dict[str, Any]:
    """Closed loop of placed two-step submits on a fleet of ``submit_nodes`` boards, and the
    floor app running the statements frozen in ``bench/floor.sql``, both up at once on one
    database and measured in alternating windows (``submit_rounds`` each, the order swapped
    every round), so that a drift of the machine's speed moves both alike; then pgbench
    replaying the same statements."""
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
    placed = _alternating(b, url, work, name="submit", prefix="sp", params={})
    opening["after"] = record_opening(work / "record-probe", "after")
    say(f"  opening a Record here after the rounds: {_opening(opening['after'])}")
    app, fl = placed["app"], placed["floor"]

    say(f"pgbench: bench/floor.sql ({len(statements)} statements), {slots} clients")
    vacuum_analyze(url, SUBMIT_TABLES)
    pg = run_pgbench(url, script, clients=slots, threads=2, seconds=s.pgbench_seconds)
    say(f"  {pg['tps']} TPS")
    return {
        "submit": {
            "app_per_s": app["per_s"],
            "pgbench_per_s": pg["tps"],
            "ratio": round(app["per_s"] / pg["tps"], 3) if pg["tps"] else None,
            "p50_ms": app["p50_ms"],
            "p99_ms": app["p99_ms"],
            "max_ms": app["max_ms"],
            "statuses": app["statuses"],
            "errors": app["errors"],
            "clients": f"{b.processes} processes × {b.client_threads} threads, keep-alive",
            "nodes": s.submit_nodes,
            "seconds": s.submit_seconds,
            "rounds": placed["rounds"],
            "cpu_cores": placed["cpu_cores"],
            "record_opening": opening,
        },
        "pgbench": {**pg, "statements": len(statements), "script": script.read_text()},
        "floor": {
            "per_s": fl["per_s"],
            "p50_ms": fl["p50_ms"],
            "p99_ms": fl["p99_ms"],
            "statuses": fl["statuses"],
            "cpu_cores": placed["floor_cpu_cores"],
        },
    }


def _alternating(
    b: Bench,
    url: str,
    work: Path,
    *,
    name: str,
    prefix: str,
    params: dict[str, Any],
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The placed line's rounds: the Mediator (``extra`` in its environment) and the floor up
    at once on ``url``, ``submit_rounds`` alternating windows of each, the order swapped every
    round; the closed loop's submits carry ``params`` (see load._submit)."""
    s = b.sizes
    slots = b.clients
    fl_work = work / "floor"
    fl_work.mkdir(exist_ok=True)
    threads = b.threads or 1000  # gunicorn.conf.py's default: the same settings as the Mediator
    window = s.submit_seconds / s.submit_rounds
    fl_window = s.floor_seconds / s.submit_rounds
    say(
        f"{name}: placed submits and the floor: {b.processes}×{b.client_threads} clients, "
        f"{s.submit_nodes} nodes, {s.submit_rounds} alternating windows of {window:g} s "
        f"and {fl_window:g} s"
    )
    tallies = {"app": Tally(), "floor": Tally()}
    cores_of: dict[str, list[dict[str, float]]] = {"app": [], "floor": []}
    rounds: list[dict[str, float]] = []
    with (
        b.server(url, name, extra) as srv,
        floor(url, fl_work, workers=b.workers, threads=threads) as fsrv,
    ):
        _advertise_all(
            srv.port,
            [advert(f"sp-node-{n:05d}", slot=f"s{n % slots}") for n in range(s.submit_nodes)],
        )
        for r in range(s.submit_rounds):
            rates: dict[str, float] = {}
            for which in ("app", "floor") if r % 2 == 0 else ("floor", "app"):
                # Vacuumed and analysed before each window, so that none starts on the dead
                # lease rows and stale statistics the one before it left.
                vacuum_analyze(url, SUBMIT_TABLES)
                server, seconds = (srv, window) if which == "app" else (fsrv, fl_window)
                run_prefix = f"{prefix}{r}" if which == "app" else f"fl{r}"
                plans = closed_loop(
                    server.port,
                    "submit",
                    {**params, "prefix": run_prefix, "slots": slots},
                    processes=b.processes,
                    threads=b.client_threads,
                    duration=seconds,
                    warmup=s.warmup,
                )
                # The floor's runs (``pgb-…``, bench/floor.sql) take leases of nodes that do not
                # exist; they are swept like the placed line's, so that both windows read a
                # leases table of the same size.
                with Sweeper(url, run_prefix + "-" if which == "app" else "pgb-"):
                    result, cores = b.measure(server, plans, s.warmup, seconds)
                tally = result.tally("submit")
                tallies[which].merge(tally)
                cores_of[which].append(cores)
                rates[which] = summary(tally, seconds, (201,))["per_s"]
            rounds.append(
                {**rates, "ratio": round(rates["app"] / rates["floor"], 3) if rates["floor"] else 0}
            )
            say(f"  round {r + 1}: {rates['app']}/s placed, floor {rates['floor']}/s")
    app = summary(tallies["app"], s.submit_seconds, (201,))
    fl = summary(tallies["floor"], s.floor_seconds, (201,))
    cores, fcores = _mean_cores(cores_of["app"]), _mean_cores(cores_of["floor"])
    say(f"  {app['per_s']}/s placed, p50 {app['p50_ms']} ms, p99 {app['p99_ms']} ms, {cores}")
    say(f"  floor {fl['per_s']}/s, p99 {fl['p99_ms']} ms, {fcores}")
    return {
        "app": app,
        "floor": fl,
        "rounds": rounds,
        "cpu_cores": cores,
        "floor_cpu_cores": fcores,
    }


# The teams of the placed line with teams: each with a max_nodes it never reaches (the sweeper
# frees the boards within milliseconds), so that every placement of theirs locks its team's
# row and counts its leases (docs/teams.md, "Quotas") without ever being refused.
PLACED_TEAMS = (("kernel", 3), ("qa", 1), ("release", 2))


def placed_submits_teams(b: Bench) -> dict[str, Any]:
    """The placed line (same fleet, clients, sweeper and alternating rounds with the floor),
    with ``MEDIATOR_TEAMS`` configuring three teams with ``max_nodes`` and the submits dealt in
    turn to those three and to ``default`` (no quota) by ``queue.team``."""
    s = b.sizes
    url = b.dbs.fresh("submit_teams")
    work = b.workdir / "submit-teams"
    work.mkdir(parents=True, exist_ok=True)
    teams = [
        {"name": name, "weight": weight, "max_nodes": s.submit_nodes}
        for name, weight in PLACED_TEAMS
    ]
    dealt = [name for name, _ in PLACED_TEAMS] + ["default"]
    placed = _alternating(
        b,
        url,
        work,
        name="submit-teams",
        prefix="st",
        params={"teams": dealt},
        extra={"MEDIATOR_TEAMS": json.dumps(teams)},
    )
    app, fl = placed["app"], placed["floor"]
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT team, count(*) FROM runs WHERE run_id LIKE 'st%' GROUP BY team"
        ).fetchall()
    by_team = {str(team): int(n) for team, n in rows}
    if set(by_team) != set(dealt):
        raise RuntimeError(f"submit-teams: the runs' teams are {by_team}, not {dealt}")
    say(f"  runs by team: {by_team}")
    return {
        "submit_teams": {
            "app_per_s": app["per_s"],
            "floor_per_s": fl["per_s"],
            "ratio": round(app["per_s"] / fl["per_s"], 3) if fl["per_s"] else None,
            "p50_ms": app["p50_ms"],
            "p99_ms": app["p99_ms"],
            "max_ms": app["max_ms"],
            "statuses": app["statuses"],
            "errors": app["errors"],
            "floor_p99_ms": fl["p99_ms"],
            "teams": teams,
            "dealt_to": dealt,
            "runs_by_team": by_team,
            "nodes": s.submit_nodes,
            "seconds": s.submit_seconds,
            "rounds": placed["rounds"],
            "cpu_cores": placed["cpu_cores"],
            "floor_cpu_cores": placed["floor_cpu_cores"],
        }
    }


def _mean_cores(windows: list[dict[str, float]]) -> dict[str, float]:
    """The cores of equally long windows, averaged."""
    keys = windows[0].keys() if windows else ()
    return {k: round(sum(w[k] for w in windows) / len(windows), 2) for k in keys}


# ---------------------------------------------------------------- queued submits


def queued_submits(b: Bench) -> dict[str, Any]:
    """Closed loop of submits that all wait for the one board, which a run holds, behind
    ``queued_before`` runs already QUEUED: each is queued (202), with its post-queue scan when a
    freeing commit was marked since its read (docs/queue.md#on-submit-placed-queued-or-rejected)."""
    s = b.sizes
    url = b.dbs.fresh("queued")
    with b.server(url, "queued") as srv:
        c = Client(srv.port)
        _ok(c.post("/v1/nodes", advert("q-node", soc="queue")), 200, "advert")
        _ok(c.post("/v1/runs", two_steps("q-holder", soc="queue")), 201, "holder")
        # The line runs with 10,000 runs already QUEUED (docs/design.md#targets) (copies of one
        # queued run, as the Mediator wrote it, one microsecond apart), so that what a queued submit
        # costs beside a long queue is what is measured.
        _ok(c.post("/v1/runs", two_steps("qf-0", soc="queue")), 202, "queued")
        clone_run(url, "qf-0", "qf-", 1, s.queued_before - 1)
        vacuum_analyze(url)
        c.close()
        say(f"queued submits: {b.processes}×{b.client_threads} clients, {s.queued_seconds:g} s")
        plans = closed_loop(
            srv.port,
            "submit",
            {"prefix": "qd", "attrs": {"soc": "queue"}},
            processes=b.processes,
            threads=b.client_threads,
            duration=s.queued_seconds,
            warmup=s.warmup,
        )
        result, cores = b.measure(srv, plans, s.warmup, s.queued_seconds)
    with connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM runs WHERE state = 'QUEUED'").fetchone()
        depth = row[0] if row else 0
    out = summary(result.tally("submit"), s.queued_seconds, (202,))
    say(f"  {out['per_s']}/s queued, p99 {out['p99_ms']} ms, {depth} queued at the end, {cores}")
    return {
        "queued": {
            **out,
            "queue_depth_at_start": s.queued_before,
            "queue_depth_at_end": depth,
            "cpu_cores": cores,
        }
    }


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


def _advertise_all(port: int, adverts: list[dict[str, Any]]) -> None:
    def send(chunk: list[dict[str, Any]]) -> None:
        c = Client(port)
        for doc in chunk:
            _ok(c.post("/v1/nodes", doc), 200, "advert")
        c.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(send, [adverts[i::8] for i in range(8)]))


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
    "submit-teams": placed_submits_teams,
    "queued": queued_submits,
    "wake": wake_scan,
    "wake-reserving": wake_scan_reserving,
    "release": release_to_claim,
    "fleet": fleet,
    "reaper": reaper,
}
