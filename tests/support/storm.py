"""The storm itself: gunicorn with 4 workers, driver processes and two reapers on one database,
the invariant checker sampled throughout and run in full once everything is quiet."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg.rows import dict_row

from app.config import KEYS_BY_NAME
from app.services.reaper import reap_pass
from tests.support.apps import ROOT, TOKEN, LiveServer, app_on, gunicorn_on
from tests.support.concurrency import connect, deadlocks
from tests.support.invariants import check, check_settled

RENEW_SECONDS = 2  # lease window 6 s: a silent node's leases expire within a storm
SAMPLE_EVERY = 0.25


@dataclass(frozen=True)
class Plan:
    """How many of each driver, and how much each does: ``ops`` operations each, or for
    ``seconds`` (a soak) when that is set."""

    submitters: int = 2
    cancellers: int = 1
    node_processes: int = 2
    nodes_each: int = 4
    reapers: int = 2
    submitter_ops: int = 90
    canceller_ops: int = 60
    node_ops: int = 230
    seconds: float = 0.0
    deadline: float = 0.0  # a guard: every driver stops after this, whatever is left
    priorities: bool = False  # submitters ask for several queue priorities
    reserve_after: int = 900  # queue.reserve_after_seconds of the server and the reapers

    def drivers(self) -> list[tuple[str, int, list[str]]]:
        """(role, index, extra arguments) of every driver process."""
        out: list[tuple[str, int, list[str]]] = []
        for i in range(self.submitters):
            extra = ["--ops", str(self.submitter_ops), "--pause", "0.15"]
            out.append(("submitter", i, extra + (["--priorities"] if self.priorities else [])))
        for i in range(self.cancellers):
            out.append(("canceller", i, ["--ops", str(self.canceller_ops), "--pause", "0.3"]))
        for i in range(self.node_processes):
            out.append(("nodes", i, ["--ops", str(self.node_ops), "--nodes", str(self.nodes_each)]))
        for i in range(self.reapers):
            # Until told to stop (a huge count): reapers outlive the storm's other drivers.
            out.append(("reaper", i, ["--ops", "1000000", "--pause", "0.2"]))
        return out


@dataclass
class StormReport:
    seed: int
    seconds: float = 0.0
    requests: int = 0
    tally: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    no_answer: list[str] = field(default_factory=list)
    driver_errors: list[str] = field(default_factory=list)
    notes: Counter[str] = field(default_factory=Counter)
    samples: int = 0
    sampled_violations: dict[str, int] = field(default_factory=dict)  # line -> first sample
    final_violations: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    latency: dict[str, list[float]] = field(default_factory=dict)  # route -> seconds
    # pg_stat_database.deadlocks of the storm's database before it and once every process of it
    # has ended (one lock order, docs/queue.md: a storm adds none).
    deadlocks_before: int = 0
    deadlocks_after: int = 0

    @property
    def overloaded(self) -> int:
        return sum(n for k, n in self.tally.items() if k.endswith(" 503"))

    def failures(self) -> list[str]:
        """Everything that makes the storm fail, one line each."""
        out = [f"undocumented answer: {u}" for u in self.unexpected]
        out += [f"no answer: {u}" for u in self.no_answer]
        out += [f"driver error: {e}" for e in self.driver_errors]
        out += [f"sampled violation: {v}" for v in self.sampled_violations]
        out += [f"final violation: {v}" for v in self.final_violations]
        if self.deadlocks_after != self.deadlocks_before:
            out.append(
                f"deadlocks: pg_stat_database.deadlocks went from {self.deadlocks_before}"
                f" to {self.deadlocks_after}"
            )
        return out

    def describe(self) -> str:
        by_route: Counter[str] = Counter()
        for key, n in self.tally.items():
            by_route[key] += n
        lines = [
            f"storm seed {self.seed} (STORM_SEED={self.seed} replays its random stream):"
            f" {self.requests} requests in {self.seconds:.1f} s, {self.overloaded} answered 503,"
            f" checker sampled {self.samples} times,"
            f" deadlocks {self.deadlocks_before} -> {self.deadlocks_after}",
            "answers: " + ", ".join(f"{k}: {n}" for k, n in sorted(by_route.items())),
            "events: " + ", ".join(f"{k}: {n}" for k, n in sorted(self.notes.items())),
            "rows: " + ", ".join(f"{k}: {n}" for k, n in sorted(self.rows.items())),
            "latency ms (median / 95% / max): "
            + ", ".join(
                f"{route} {_ms(s, 0.5)}/{_ms(s, 0.95)}/{_ms(s, 1.0)}"
                for route, s in sorted(self.latency.items())
            ),
        ]
        return "\n".join(lines)


def _ms(seconds: list[float], q: float) -> int:
    ordered = sorted(seconds)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def _sampler(url: str, report: StormReport, stop: threading.Event) -> None:
    with connect(url) as sql:
        while not stop.wait(SAMPLE_EVERY):
            report.samples += 1
            for line in check(sql):
                report.sampled_violations.setdefault(line, report.samples)


def _rows(url: str) -> dict[str, int]:
    """What the storm left in the tables, for its report."""
    with connect(url) as sql:
        cur = sql.cursor(row_factory=dict_row)
        out = {
            f"runs {r['state']}": r["n"]
            for r in cur.execute("select state, count(*) as n from runs group by state")
        }
        row = cur.execute(
            "select (select count(*) from run_events where cause like 'promoted:%') as promotions,"
            " (select count(*) from run_events where cause like 'reserving:%') as reservings,"
            " (select count(distinct priority) from runs) as priorities,"
            " (select count(*) from steps) as steps,"
            " (select count(*) from nodes where expires_at > now()) as live_nodes,"
            " (select count(*) from steps where kind = 'acquire' and state = 'DONE')"
            "  as acquire_steps_done,"
            " (select count(*) from steps a join steps t on t.run_id = a.run_id"
            "  and t.step_id = a.spec->'acquire'->>'acquired'"
            "  where a.kind = 'acquire' and a.state = 'DONE' and t.state <> 'SKIPPED')"
            "  as acquires_that_got_a_node,"
            " (select count(*) from run_events where cause = 'node restarted')"
            "  as runs_failed_by_a_restart,"
            " (select count(*) from run_events where cause like 'cancelled by %')"
            "  as cancels,"
            " (select count(*) from nodes where expires_at > now() and drain = ''"
            "  and node_id not in (select node_id from leases)) as free_live_nodes"
        ).fetchone()
        assert row is not None
        out.update({k.replace("_", " "): v for k, v in row.items()})
        return out


def run_storm(
    url: str,
    workdir: Path,
    seed: int,
    plan: Plan | None = None,
    *,
    hosts: int = 1,
    store: dict[str, str] | None = None,
) -> StormReport:
    """Start the server, the drivers and the sampler on the database ``url``; wait for the
    drivers, stop the reapers, run one last reaper pass and every check. Never raises on what
    the storm finds: the report says it.

    ``hosts`` > 1: that many gunicorns on the one database, each with a directory of its own,
    the 4 workers shared among them; every driver sends each request to one of them, and the
    reapers take turns at the hosts' configurations. ``store``: the Record store's keys
    (``records.backend`` and ``records.s3.*``), which several hosts need to share Records."""
    plan = plan or Plan()
    store = store or {}
    report = StormReport(seed)
    started = time.monotonic()
    host_dirs = [workdir] if hosts == 1 else [workdir / f"host-{i}" for i in range(hosts)]
    env = {
        "MEDIATOR_WORKERS": str(max(1, 4 // hosts)),
        "MEDIATOR_THREADS": "16",
        "MEDIATOR_DATABASE_POOL_SIZE": "4",
        "MEDIATOR_LEASE_RENEW_SECONDS": str(RENEW_SECONDS),
        "MEDIATOR_CLAIM_RECHECK_SECONDS": "1",
        "MEDIATOR_QUEUE_RESERVE_AFTER_SECONDS": str(plan.reserve_after),
        **{KEYS_BY_NAME[k].env: v for k, v in store.items()},
    }
    report.deadlocks_before = deadlocks(url)
    with contextlib.ExitStack() as servers:
        for d in host_dirs:
            d.mkdir(parents=True, exist_ok=True)
        live = [servers.enter_context(gunicorn_on(url, d, **env)) for d in host_dirs]
        _storm(url, workdir, host_dirs, live, seed, plan, store, report)
    report.deadlocks_after = deadlocks(url)
    report.seconds = time.monotonic() - started
    return report


def _storm(
    url: str,
    workdir: Path,
    host_dirs: list[Path],
    live: list[LiveServer],
    seed: int,
    plan: Plan,
    store: dict[str, str],
    report: StormReport,
) -> None:
    stop = threading.Event()
    sampler = threading.Thread(target=_sampler, args=(url, report, stop), daemon=True)
    sampler.start()
    procs: list[tuple[str, Path, subprocess.Popen[bytes]]] = []
    child_env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        for role, index, extra in plan.drivers():
            out = workdir / f"{role}-{index}.json"
            records = host_dirs[index % len(host_dirs)] / "records"
            args = [
                sys.executable,
                "-m",
                "tests.storm.driver",
                role,
                f"--index={index}",
                f"--seed={seed}",
                f"--url={','.join(s.url for s in live)}",
                f"--token={TOKEN}",
                f"--db={url}",
                f"--records={records}",
                f"--out={out}",
                f"--renew={RENEW_SECONDS}",
                f"--store={json.dumps(store)}",
                f"--reserve-after={plan.reserve_after}",
                *extra,
            ]
            if plan.seconds and role != "reaper":
                args.append(f"--seconds={plan.seconds}")
            if plan.deadline and role != "reaper":
                args.append(f"--deadline={plan.deadline}")
            with open(workdir / f"{role}-{index}.log", "wb") as log:
                proc = subprocess.Popen(args, cwd=ROOT, env=child_env, stderr=log)
            procs.append((role, out, proc))
        limit = (plan.seconds or plan.deadline or 600) + 60
        for role, _, proc in procs:
            if role != "reaper":
                proc.wait(limit)
        for role, _, proc in procs:
            if role == "reaper":
                proc.send_signal(signal.SIGTERM)
        for _, _, proc in procs:
            proc.wait(30)
    finally:
        for _, _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stop.set()
        sampler.join(10)
    for role, out, proc in procs:
        if not out.exists():
            report.driver_errors.append(f"{role} {out.name}: no summary (exit {proc.returncode})")
            continue
        summary: dict[str, Any] = json.loads(out.read_text())
        report.requests += summary["requests"]
        report.tally.update(summary["tally"])
        for route, seconds in summary["latency"].items():
            report.latency.setdefault(route, []).extend(seconds)
        report.unexpected += summary["unexpected"]
        report.no_answer += summary["no_answer"]
        report.driver_errors += [f"{role}-{summary['index']}: {e}" for e in summary["errors"]]
        report.notes.update({f"{role} {k}": v for k, v in summary["notes"].items()})
        report.notes[f"{role} seconds"] = max(
            report.notes[f"{role} seconds"], round(summary["seconds"])
        )
    # Quiet now: two reaper passes (the second pays the marks the first read), then every check.
    records = host_dirs[0] / "records"
    keys = {"lease.renew_seconds": RENEW_SECONDS, "queue.reserve_after_seconds": plan.reserve_after}
    with app_on(url, records, **keys, **store) as app:
        reap_pass(app.extensions["mediator"])
        reap_pass(app.extensions["mediator"])
    with connect(url) as sql:
        report.final_violations = check_settled(sql)
    report.rows = _rows(url)
    for server in live:
        server.proc.send_signal(signal.SIGINT)  # quick shutdown: nothing is left to serve
    for server in live:
        server.proc.wait(20)


def storm_seed() -> int:
    return int(os.environ.get("STORM_SEED") or random.SystemRandom().randrange(1_000_000))
