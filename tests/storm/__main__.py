"""``python -m tests.storm --soak SECONDS [--seed N] [--hosts N]``: a long storm outside CI, on a
database of its own, migrated here and dropped afterwards (see tests/storm/__init__.py).
``--hosts 2`` runs it across two Mediator hosts sharing their Records in a bucket of moto's S3
server, started here on 127.0.0.1."""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import uuid
from pathlib import Path

from app.dev.embedded import create_database, drop_database, resolve_admin_url
from app.migrate import upgrade
from tests.support.storm import Plan, run_storm


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.storm")
    p.add_argument("--soak", type=float, default=0.0, help="seconds (0: the bounded CI storm)")
    p.add_argument("--seed", type=int, default=None, help="replay a storm's choices")
    p.add_argument("--hosts", type=int, default=1, help="Mediator hosts (2+: Records in S3)")
    args = p.parse_args(argv)
    store: dict[str, str] = {}
    if args.hosts > 1:
        from tests.support.s3 import new_bucket, shared_server

        s3 = shared_server()
        store = {
            "records.backend": "s3",
            "records.s3.bucket": new_bucket(s3.url),
            "records.s3.endpoint_url": s3.url,
        }
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    print(f"storm seed {seed}", flush=True)
    plan = Plan(seconds=args.soak) if args.soak else Plan(deadline=22)
    admin, embedded = resolve_admin_url()
    name = f"mediator_storm_{uuid.uuid4().hex[:8]}"
    try:
        url = create_database(admin, name)
        try:
            upgrade(url)
            with tempfile.TemporaryDirectory(prefix="mediator-storm-") as work:
                report = run_storm(url, Path(work), seed, plan, hosts=args.hosts, store=store)
        finally:
            drop_database(admin, name)
    finally:
        if embedded is not None:
            embedded.stop()
    print(report.describe())
    for line in report.failures():
        print(line)
    return 1 if report.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
