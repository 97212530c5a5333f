"""The command: parse the options, make the databases, run the measurements, write the results,
drop the databases (also on Ctrl-C or SIGTERM)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import runpy
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import report
from bench.database import Databases, admin_url
from bench.labday import labday
from bench.machine import ROOT, describe
from bench.phases import FULL, PHASES, QUICK, Bench, say
from bench.switch import switch

# The lines in the order a full run runs them: the targets' (docs/design.md#targets), the lab day
# of teams sharing a fleet (bench/labday.py), then a switch to the database's standby
# (bench/switch.py).
LINES = {**PHASES, "labday": labday, "switch": switch}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Measure the Mediator over HTTP against gunicorn on a local PostgreSQL, "
        "in rounds beside the floors replaying the submit's frozen statements for each shape of "
        "fleet (and pgbench, for context); write results.json and results.md.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes and short windows (about a minute), for development; "
        "writes to a temporary directory unless --out is given",
    )
    p.add_argument(
        "--only",
        action="append",
        choices=sorted(LINES),
        help="run only this measurement (repeatable); wake runs both wake-scan lines, "
        "wake-reserving only the one with 5 %% of the queued runs reserving",
    )
    p.add_argument("--out", type=Path, help="where results.json and results.md go (bench/)")
    p.add_argument("--workers", type=int, default=4, help="gunicorn workers (4)")
    p.add_argument(
        "--threads", type=int, help="gunicorn threads a worker (gunicorn.conf.py's default)"
    )
    p.add_argument(
        "--submit-nodes",
        type=int,
        help="boards advertised for the placed-submit line (2000: the fleet of the targets)",
    )
    p.add_argument("--processes", type=int, default=2, help="client processes (2)")
    p.add_argument("--client-threads", type=int, default=8, help="threads a client process (8)")
    p.add_argument(
        "--log-level",
        default="info",
        choices=("info", "warning"),
        help="the Mediator's log level (info, production's default; the wake scan is read "
        "from its info lines)",
    )
    p.add_argument(
        "--record-before",
        action="store_true",
        help="also record this run as bench/before.json, the 'before' column of results.md",
    )
    return p


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that drop databases


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.submit_nodes:
        sizes = dataclasses.replace(sizes, submit_nodes=args.submit_nodes)
    wakes = {"wake", "wake-reserving"}
    if args.log_level != "info" and (not args.only or wakes & set(args.only)):
        raise SystemExit("bench: the wake scan is read from info lines: use --log-level info")
    out = args.out
    if out is None:
        out = Path(tempfile.gettempdir()) / "mediator-bench-quick" if args.quick else report.HERE
    signal.signal(signal.SIGTERM, _terminate)
    load = os.getloadavg()
    admin = admin_url()
    dbs = Databases(admin)
    workdir = Path(tempfile.mkdtemp(prefix="mediator-bench-"))
    started = time.monotonic()
    doc: dict[str, Any] = {"mode": sizes.mode}
    try:
        say(f"bench ({sizes.mode}): template database {dbs.template}, work in {workdir}")
        dbs.prepare()
        bench = Bench(
            dbs=dbs,
            workdir=workdir,
            sizes=sizes,
            workers=args.workers,
            threads=args.threads,
            log_level=args.log_level,
            processes=args.processes,
            client_threads=args.client_threads,
        )
        names = args.only or list(LINES)
        if "wake" in names:
            names = [*names, "wake-reserving"]  # the wake-scan line and the one beside it
        for name in LINES:
            if name in names:
                doc.update(LINES[name](bench))
        server = {
            "workers": args.workers,
            "threads": args.threads or _conf_threads(),
            "clients": f"{args.processes} processes × {args.client_threads} threads",
            "log_level": args.log_level,
        }
        machine = describe(dbs.admin, server)
        machine["load_average"] = [round(x, 2) for x in load]
        doc = {"machine": machine, **doc, "seconds": round(time.monotonic() - started)}
        report.write(doc, out, record_before=args.record_before)
        say(f"wrote {out / 'results.json'} and {out / 'results.md'} in {doc['seconds']} s")
    finally:
        dbs.drop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    sys.stdout.write((out / "results.md").read_text())


def _conf_threads() -> int:
    """The threads a worker gets from gunicorn.conf.py when --threads is not given."""
    return int(runpy.run_path(str(ROOT / "gunicorn.conf.py"))["threads"])
