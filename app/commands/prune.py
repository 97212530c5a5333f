"""``mediator server prune --before DATE [--dry-run]``: retention on demand
(docs/retention.md#what-is-pruned-and-what-is-kept). The work is ``app.services.retention.prune``,
the same the reaper does with ``retention.days``."""

from __future__ import annotations

import re
import sys
from datetime import UTC, date, datetime

import click

from app.wire import parse_ts, ts

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def parse_before(text: str) -> datetime:
    """An RFC 3339 time (with ``Z`` or an offset), or a date ``YYYY-MM-DD`` (its midnight, UTC).
    Raises ValueError."""
    text = text.strip()
    if _DATE.fullmatch(text):
        return datetime.combine(date.fromisoformat(text), datetime.min.time(), tzinfo=UTC)
    return parse_ts(text)


@click.command("prune")
@click.option(
    "--before",
    "before_text",
    required=True,
    metavar="DATE",
    help="Prune runs that ended before this: RFC 3339 (2026-11-01T00:00:00Z) or YYYY-MM-DD (UTC).",
)
@click.option("--dry-run", is_flag=True, help="List what would be pruned; delete nothing.")
@click.option("-v", "--verbose", is_flag=True, help="Also list the ids of the runs pruned.")
@click.pass_context
def prune_command(ctx: click.Context, before_text: str, dry_run: bool, verbose: bool) -> None:
    """Delete finished runs that ended before DATE, with their steps, events, artifacts and
    Records: sealed runs and rejected submits. Runs not finished, or finished but not sealed yet,
    are kept. A pruned run's id cannot be submitted again.

    \b
    Examples:
      mediator server prune --before 2026-01-01 --dry-run
      mediator server prune --before 2026-01-01
      mediator server prune --before 2026-01-01T12:00:00Z -v
    """
    try:
        before = parse_before(before_text)
    except ValueError:
        click.echo(
            f"{ctx.command_path}: --before must be an RFC 3339 time or a date YYYY-MM-DD, "
            f"got {before_text!r}",
            err=True,
        )
        sys.exit(2)

    from app.config import load_config
    from app.context import Context
    from app.errors import ConfigError
    from app.logs import configure_logging
    from app.migrate import database_problem
    from app.services.retention import prune

    try:
        cfg = load_config((ctx.obj or {}).get("config_path"))
        url = cfg.database_url
    except ConfigError as exc:
        click.echo(f"mediator: invalid configuration: {exc}", err=True)
        sys.exit(2)
    configure_logging(cfg["log.format"], cfg["log.level"])
    problem = database_problem(url)
    if problem:
        click.echo(f"{ctx.command_path}: {problem}", err=True)
        sys.exit(1)
    try:
        context = Context(cfg)
    # a records.root that ignores case (docs/configuration.md#where-records-are-kept)
    except ConfigError as exc:
        click.echo(f"mediator: invalid configuration: {exc}", err=True)
        sys.exit(2)
    try:
        report = prune(context, before, dry_run=dry_run)
    finally:
        context.close()
    verb = "would prune" if dry_run else "pruned"
    click.echo(
        f"{verb} {report.runs} run{'' if report.runs == 1 else 's'} that ended before "
        f"{ts(before)}: {report.steps} steps, {report.events} events, {report.blobs} blobs, "
        f"{report.leases} leases, {report.records} Records"
    )
    if report.swept:
        click.echo(f"removed {report.swept} Records left behind by an earlier prune")
    if dry_run or verbose:
        for run_id in report.run_ids:
            click.echo(run_id)
