"""The client commands of ``mediator``: what each does, over :mod:`app.client.api`.

Exit codes, for every command: :mod:`app.client.exits` (``mediator help exit-codes``). Output is
for people (tables, lines); ``--json`` (after ``mediator`` or after the command) prints the
answer's own JSON for scripts instead.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from click.shell_completion import CompletionItem

from app.client import render
from app.client.api import Client, ClientError, Refused, quote
from app.client.exits import (
    EXIT_CREDENTIALS,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    EXIT_USAGE,
)
from app.client.settings import (
    DEFAULT_URL,
    Settings,
    SettingsError,
    TokenError,
    config_path,
    read_profiles,
    resolve,
)
from app.client.watch import WaitTimedOut, print_log, wait_for_verdict
from app.errors import BadRequest
from app.states import QUEUED, RUNNING, SUCCEEDED

F = TypeVar("F", bound=Callable[..., Any])

WAIT_INTERVAL = 0.5  # seconds between two looks at a watched run
# Looks closer together than this load the Mediator for nothing; farther apart, a watch that
# seems stuck. Outside it --interval is a usage error.
INTERVALS = click.FloatRange(0.1, 60.0)


# ------------------------------------------------------------------------- options and set-up


def _store(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Keep a client option in ``ctx.obj``: the server commands never see it. Given both after
    ``mediator`` and after the command, the command's wins; not given after the command, the
    group's stays."""
    ctx.ensure_object(dict)
    if param.name == "json_output":
        value = bool(value) or bool(ctx.obj.get("json_output"))
    if value is not None or param.name not in ctx.obj:
        ctx.obj[param.name] = value
    return value


def _client_option(name: str, help_text: str) -> Callable[[F], F]:
    return click.option(f"--{name}", expose_value=False, callback=_store, help=help_text)


PROFILE_HELP = (
    "The profile of the client configuration file to use [env MEDIATOR_CLIENT_PROFILE; default: "
    "the file's default]."
)


# ``--json``, after ``mediator`` or after any command that prints: machine-readable output. The
# one definition of it.
json_option = click.option(
    "--json",
    "json_output",
    is_flag=True,
    expose_value=False,
    callback=_store,
    help="Print the answer's JSON instead of tables (for scripts).",
)


def client_options(f: F) -> F:
    """The group options of the client commands: where the Mediator is, and who calls it.
    Each wins over the environment, which wins over the profile (``app.client.settings``)."""
    options = [
        _client_option(
            "url",
            "The Mediator the client commands talk to [env MEDIATOR_CLIENT_URL, MEDIATOR_URL; "
            f"else the profile's url; default {DEFAULT_URL}].",
        ),
        _client_option(
            "token",
            "The bearer token of the client commands [env MEDIATOR_CLIENT_TOKEN, MEDIATOR_TOKEN; "
            "else the profile's token or token_file].",
        ),
        _client_option(
            "principal",
            "Who is acting (X-Enode-Principal) [env MEDIATOR_CLIENT_PRINCIPAL, "
            "MEDIATOR_PRINCIPAL; else the profile's principal; default: git config user.email].",
        ),
        _client_option("profile", PROFILE_HELP),
        json_option,
    ]
    for option in reversed(options):
        f = option(f)
    return f


def profile_option(f: F) -> F:
    """``--profile`` after a command, like ``--profile`` after ``mediator``."""
    return _client_option("profile", PROFILE_HELP)(f)


def json_flag(f: F) -> F:
    """``--json`` after a command, like ``--json`` after ``mediator``; every client command also
    takes ``--profile`` there."""
    return profile_option(json_option(f))


def _git_email() -> str | None:
    try:
        found = subprocess.run(
            ["git", "config", "user.email"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if found.returncode != 0:
        return None
    return found.stdout.strip() or None


def settings_of(ctx: click.Context) -> Settings:
    """The client settings of this command (its options, the environment, the profile); a
    configuration the client cannot use ends the command with one line and exit 2, or 5 when it
    is the token that cannot be read or sent."""
    obj = ctx.obj or {}
    try:
        found = resolve(
            {name: obj.get(name) for name in ("url", "token", "principal")},
            os.environ,
            obj.get("profile"),
        )
    except SettingsError as exc:
        _fail(ctx, str(exc), EXIT_CREDENTIALS if isinstance(exc, TokenError) else EXIT_USAGE)
    for warning in found.warnings:
        click.echo(f"warning: {warning}", err=True)
    return found


def _client(ctx: click.Context) -> Client:
    found = settings_of(ctx)
    return Client(found.url, found.token, found.principal or _git_email())


def _json_wanted(ctx: click.Context) -> bool:
    return bool((ctx.obj or {}).get("json_output"))


def _print_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, ensure_ascii=False))


def _fail(ctx: click.Context, message: str, code: int, body: Any = None) -> NoReturn:
    if body is not None and _json_wanted(ctx):
        _print_json(body)
    click.echo(f"mediator: {message}", err=True)
    ctx.exit(code)


def handled(f: F) -> F:
    """A failed request ends the command with its exit code and its one line."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except ClientError as exc:
            _fail(click.get_current_context(), exc.message, exc.exit_code, exc.body)

    return wrapper  # type: ignore[return-value]


def _warn(warnings: object) -> None:
    for w in warnings if isinstance(warnings, list) else []:
        click.echo(f"warning: {w}", err=True)


COMPLETE_TIMEOUT = 2.0  # seconds: a shell waits for its completions
COMPLETE_RUNS = 200  # the newest runs offered


def _completion_client(ctx: click.Context) -> Client:
    """A client of the Mediator the command being completed would talk to, with the short
    timeout of a completion."""
    obj = ctx.find_root().obj or {}
    found = resolve(
        {name: obj.get(name) for name in ("url", "token", "principal")},
        os.environ,
        obj.get("profile"),
    )
    return Client(found.url, found.token, found.principal, timeout=COMPLETE_TIMEOUT)


def complete_runs(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Run ids for the shell's completion, the newest first, with their state: asked of the
    Mediator the command would talk to. Anything that goes wrong completes nothing, quietly:
    a completion never prints an error into the command line being typed."""
    try:
        page = _completion_client(ctx).get("/v1/runs", {"limit": COMPLETE_RUNS})
        return [
            CompletionItem(run["run_id"], help=str(run.get("state") or ""))
            for run in page.get("runs") or []
            if str(run.get("run_id", "")).startswith(incomplete)
        ]
    except Exception:  # any: see the docstring
        return []


# ---------------------------------------------------------------------------- contract files


def read_contract(path: str) -> tuple[Any, bytes]:
    """The contract of ``path`` (``-`` is stdin) and the bytes to send: a JSON file as it is
    written (the server reads it as curl would send it), YAML (``.yaml``, ``.yml``) as JSON."""
    from app.contract import parse_json  # imported here: only the commands that read files

    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise Refused(f"cannot read {path}: {exc.strerror}", exit_code=EXIT_REFUSED) from None
    if path.lower().endswith((".yaml", ".yml")):
        import yaml

        try:
            doc = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            first = str(exc).splitlines()[0] if str(exc) else "not YAML"
            raise Refused(f"{path} is not valid YAML: {first}", exit_code=EXIT_REFUSED) from None
        return doc, json.dumps(doc).encode("utf-8")
    try:
        return parse_json(raw, what=path), raw  # the server's own reading of a body
    except BadRequest as exc:
        try:
            json.loads(raw)
        except ValueError as why:  # say where, which the server's reason does not
            raise Refused(f"{path} is not valid JSON: {why}", exit_code=EXIT_REFUSED) from None
        raise Refused(exc.reason, exit_code=EXIT_REFUSED) from None


# ----------------------------------------------------------------------------------- commands


def wait_options(f: F) -> F:
    """``--wait``, ``--interval`` and ``--timeout`` of the commands that can follow a run."""
    options = [
        click.option("--wait", is_flag=True, help="Follow the run to its verdict (exit 0 or 1)."),
        click.option(
            "--interval",
            default=WAIT_INTERVAL,
            show_default=True,
            type=INTERVALS,
            help="Seconds between looks.",
        ),
        click.option(
            "--timeout",
            type=click.FloatRange(min=0, min_open=True),
            help="With --wait: stop watching after this many seconds (exit 4; the run goes on).",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _goes_on(run_id: object) -> str:
    return (
        f"run {run_id} goes on: follow it with `mediator status {run_id} --wait`, "
        f"stop it with `mediator cancel {run_id}`"
    )


def _wait(
    ctx: click.Context,
    client: Client,
    view: dict[str, Any],
    interval: float,
    timeout: float | None,
) -> NoReturn:
    """Watch the run to its verdict and exit 0 (SUCCEEDED) or 1 (FAILED); progress goes to
    stdout, or to stderr when stdout carries the JSON of the last view. Ctrl-C (130) and
    ``timeout`` (4) stop the watch, not the run, and say so."""
    as_json = _json_wanted(ctx)
    out = sys.stderr if as_json else sys.stdout
    run_id = view.get("run_id")
    try:
        last = wait_for_verdict(
            client, view, out, interval=interval, live=out.isatty(), timeout=timeout
        )
    except KeyboardInterrupt:
        client.close()
        click.echo(f"mediator: stopped watching; {_goes_on(run_id)}", err=True)
        ctx.exit(EXIT_INTERRUPTED)
    except WaitTimedOut as exc:
        if as_json:
            _print_json(exc.view)
        state = exc.view.get("state")
        click.echo(
            f"mediator: not finished within {timeout:g} s ({state}); {_goes_on(run_id)}",
            err=True,
        )
        ctx.exit(EXIT_TIMEOUT)
    if as_json:
        _print_json(last)
    ctx.exit(EXIT_OK if last.get("state") == SUCCEEDED else EXIT_FAILED)


def _check_timeout(wait: bool, timeout: float | None) -> None:
    if timeout is not None and not wait:
        raise click.UsageError("--timeout goes with --wait")


@click.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--dry-run", is_flag=True, help="Show where it would be placed; store nothing.")
@wait_options
@json_flag
@click.pass_context
@handled
def submit(
    ctx: click.Context,
    file: str,
    dry_run: bool,
    wait: bool,
    interval: float,
    timeout: float | None,
) -> None:
    """Submit the contract in FILE (JSON, or YAML by its extension; - reads stdin).

    \b
    Examples:
      mediator submit boot.yaml --wait
      mediator submit boot.json --dry-run
      mediator submit boot.json --wait --timeout 600 --json
    """
    _check_timeout(wait, timeout)
    client = _client(ctx)
    _, raw = read_contract(file)
    if dry_run:
        answer = client.post("/v1/runs/dry-run", body=raw).json()
        if _json_wanted(ctx):
            _print_json(answer)
        else:
            click.echo(render.dry_run(answer))
        return
    reply = client.post("/v1/runs", body=raw)
    view = reply.json()
    _warn(view.get("warnings"))
    if wait:
        _wait(ctx, client, view, interval, timeout)
    if _json_wanted(ctx):
        _print_json(view)
        return
    run_id, state = view.get("run_id"), view.get("state")
    if reply.status == 200:
        click.echo(f"{run_id}: already known, {state}")
    elif state == QUEUED:
        click.echo(f"{run_id}: QUEUED, {render.queue_line(view)}")
    elif state == RUNNING:
        click.echo(f"{run_id}: RUNNING on {render.assigned(view)}")
    else:
        click.echo(f"{run_id}: {state}")


@click.command()
@click.argument("run", shell_complete=complete_runs)
@wait_options
@json_flag
@click.pass_context
@handled
def status(
    ctx: click.Context, run: str, wait: bool, interval: float, timeout: float | None
) -> None:
    """A run: its state, what it waits for while QUEUED, its steps and its verdict.

    \b
    Examples:
      mediator status kernel-4711-boot
      mediator status kernel-4711-boot --wait
      mediator status kernel-4711-boot --json
    """
    _check_timeout(wait, timeout)
    client = _client(ctx)
    view = client.get(f"/v1/runs/{quote(run)}")
    if wait:
        _wait(ctx, client, view, interval, timeout)
    if _json_wanted(ctx):
        _print_json(view)
    else:
        click.echo(render.run_view(view))


PAGE_MAX = 1000  # the server's largest page (docs/api.md, GET /v1/runs)


@click.command()
@click.option("--state", help="Only runs in this state (QUEUED, RUNNING, SUCCEEDED, ...).")
@click.option("--work", help="Only runs of this work key (system:change_id).")
@click.option("--since", help="Only runs created at or after this RFC 3339 time.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="At most this many runs, over as many pages as it takes.",
)
@click.option("--all", "every", is_flag=True, help="Every run: follow the pages to the end.")
@click.option(
    "--page-size",
    type=click.IntRange(1, PAGE_MAX),
    default=PAGE_MAX,
    hidden=True,
    help="Runs asked for in one request.",
)
@json_flag
@click.pass_context
@handled
def runs(
    ctx: click.Context,
    state: str | None,
    work: str | None,
    since: str | None,
    limit: int,
    every: bool,
    page_size: int,
) -> None:
    """Runs, newest first, following the server's pages (``next``) until --limit or the end.

    \b
    Examples:
      mediator runs --state QUEUED
      mediator runs --work gerrit:4711 --all
      mediator runs --since 2026-12-01T00:00:00Z --limit 20 --json
    """
    client = _client(ctx)
    query: dict[str, str | int | None] = {"state": state, "work": work, "since": since}
    found: list[Any] = []
    first: dict[str, Any] | None = None
    cursor: str | None = None
    while True:
        want = page_size if every else min(page_size, limit - len(found))
        page = client.get("/v1/runs", query | {"limit": want, "before": cursor})
        first = first or page
        found += page.get("runs") or []
        cursor = page.get("next")
        if not cursor or (not every and len(found) >= limit):
            break
    if _json_wanted(ctx):
        # One document as if one page had held them all; next is where a later call goes on.
        doc = {k: v for k, v in (first or {}).items() if k != "next"} | {"runs": found}
        _print_json(doc | ({"next": cursor} if cursor else {}))
    else:
        click.echo(render.runs_table(found))


@click.command()
@json_flag
@click.pass_context
@handled
def nodes(ctx: click.Context) -> None:
    """The fleet: live nodes, their capabilities, leases and drains.

    \b
    Examples:
      mediator nodes
      mediator nodes --json
    """
    _fleet(ctx, render.nodes_table)


def _fleet(ctx: click.Context, table: Callable[[list[Any]], str]) -> None:
    """``GET /v1/nodes`` as its JSON or as ``table`` renders its nodes."""
    answer = _client(ctx).get("/v1/nodes")
    if _json_wanted(ctx):
        _print_json(answer)
    else:
        click.echo(table(answer.get("nodes") or []))


def complete_nodes(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Node ids for the shell's completion, as :func:`complete_runs` completes run ids (quietly
    nothing when anything goes wrong)."""
    try:
        listing = _completion_client(ctx).get("/v1/nodes")
        return [
            CompletionItem(n["node_id"], help="live" if n.get("live") else "not live")
            for n in listing.get("nodes") or []
            if str(n.get("node_id", "")).startswith(incomplete)
        ]
    except Exception:  # any: see complete_runs
        return []


@click.group()
def node() -> None:
    """The fleet with each node's hold and health; an operator holds (drains), resumes,
    quarantines and lifts a node.

    \b
    Examples:
      mediator node list
      mediator node drain board-1 --reason "rewiring rack 3"
      mediator node lift board-2
    """


def _node_change(
    ctx: click.Context, method: str, node_id: str, what: str, body: Any = None
) -> None:
    """``METHOD /v1/nodes/{node_id}/{what}`` (a hold or a quarantine, set or lifted), and the
    node's line the server answered with, as ``node list`` shows it (or its JSON)."""
    path = f"/v1/nodes/{quote(node_id)}/{what}"
    reply = _client(ctx).request(method, path, doc=body).json()
    if _json_wanted(ctx):
        _print_json(reply)
    else:
        click.echo(render.node_lines_table([reply] if isinstance(reply, dict) else []))


@node.command("list")
@json_flag
@click.pass_context
@handled
def node_list(ctx: click.Context) -> None:
    """The fleet: each node's lease, drain, an operator's hold and its health.

    \b
    Examples:
      mediator node list
      mediator node list --json
    """
    _fleet(ctx, render.node_lines_table)


REASON_HELP = "Why (1 byte to 1 KiB): kept with the change and shown with the node."


@node.command("drain")
@click.argument("node_id", metavar="NODE", shell_complete=complete_nodes)
@click.option("--reason", required=True, help=REASON_HELP)
@click.option(
    "--at-boundary",
    is_flag=True,
    help="Cancel the node's run at its next step boundary (default: graceful, the run goes on).",
)
@json_flag
@click.pass_context
@handled
def node_drain(ctx: click.Context, node_id: str, reason: str, at_boundary: bool) -> None:
    """Hold NODE: it takes no new run until `mediator node resume` (operators only).

    \b
    Examples:
      mediator node drain board-1 --reason "rewiring rack 3"
      mediator node drain board-1 --reason "new firmware" --at-boundary
    """
    body = {"mode": "at-boundary" if at_boundary else "graceful", "reason": reason}
    _node_change(ctx, "POST", node_id, "drain", body)


@node.command("resume")
@click.argument("node_id", metavar="NODE", shell_complete=complete_nodes)
@json_flag
@click.pass_context
@handled
def node_resume(ctx: click.Context, node_id: str) -> None:
    """Lift an operator's hold of NODE (nothing held: nothing changes).

    \b
    Examples:
      mediator node resume board-1
    """
    _node_change(ctx, "DELETE", node_id, "drain")


@node.command("quarantine")
@click.argument("node_id", metavar="NODE", shell_complete=complete_nodes)
@click.option("--reason", required=True, help=REASON_HELP)
@json_flag
@click.pass_context
@handled
def node_quarantine(ctx: click.Context, node_id: str, reason: str) -> None:
    """Quarantine NODE: no run but its health run until the quarantine is lifted.

    \b
    Examples:
      mediator node quarantine board-2 --reason "flaky USB hub"
    """
    _node_change(ctx, "POST", node_id, "quarantine", {"reason": reason})


@node.command("lift")
@click.argument("node_id", metavar="NODE", shell_complete=complete_nodes)
@json_flag
@click.pass_context
@handled
def node_lift(ctx: click.Context, node_id: str) -> None:
    """Lift NODE's quarantine, reset its strikes and cancel its open health run.

    \b
    Examples:
      mediator node lift board-2
    """
    _node_change(ctx, "DELETE", node_id, "quarantine")


@click.command()
@json_flag
@click.pass_context
@handled
def teams(ctx: click.Context) -> None:
    """The teams sharing the fleet: weight, share, usage, factor, what they hold and queue, their
    limits; then each team's usage in each hour of the last day.

    \b
    Examples:
      mediator teams
      mediator teams --json
    """
    client = _client(ctx)
    listing = client.get("/v1/teams")
    usage = client.get("/v1/teams/usage")
    if _json_wanted(ctx):
        # The teams' own answer, with the usage's answer as it came beside them.
        _print_json(listing | {"usage": usage})
        return
    lines = listing.get("teams") or []
    click.echo(render.teams_table(lines))
    chart = render.sparklines(usage, [str(t.get("name")) for t in lines])
    if chart:
        click.echo("")
        click.echo(chart)


@click.command()
@click.argument("run", shell_complete=complete_runs)
@json_flag
@click.pass_context
@handled
def cancel(ctx: click.Context, run: str) -> None:
    """Cancel a run (queued or running); a finished run keeps its state.

    \b
    Examples:
      mediator cancel kernel-4711-boot
    """
    client = _client(ctx)
    answer = client.post(f"/v1/runs/{quote(run)}/cancel").json()
    if _json_wanted(ctx):
        _print_json(answer)
        return
    view = client.get(f"/v1/runs/{quote(run)}")
    checks = (view.get("verdict") or {}).get("checks") or []
    if any(c.get("what") == "cancelled" for c in checks):
        click.echo(f"{answer.get('run_id')}: cancelled, {answer.get('state')}")
    else:
        click.echo(f"{answer.get('run_id')}: had already finished, {answer.get('state')}")


@click.command()
@json_flag
@click.pass_context
@handled
def asks(ctx: click.Context) -> None:
    """Open asks: questions that running steps wait on, and whether you may answer them.

    \b
    Examples:
      mediator asks
      mediator --principal qa@lab.example asks --json
    """
    answer = _client(ctx).get("/v1/asks")
    if _json_wanted(ctx):
        _print_json(answer)
    else:
        click.echo(render.asks_table(answer.get("asks") or []))


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _typed(name: str, text: str, prop: object) -> Any:
    """``--set name=text`` as the value the ask's schema wants for ``name`` (a flat object
    of primitive or enum properties, docs/contract.md#ask); text when the schema does not say."""
    prop = prop if isinstance(prop, dict) else {}
    enum = prop.get("enum")
    if isinstance(enum, list):
        if text in enum:
            return text
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        if value in enum:
            return value
        choices = ", ".join(json.dumps(v) for v in enum)
        raise Refused(f"{name} must be one of {choices}, got {text!r}", exit_code=EXIT_REFUSED)
    kinds = prop.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "boolean" in kinds and text.lower() in _TRUE + _FALSE:
        return text.lower() in _TRUE
    if "integer" in kinds:
        try:
            return int(text)
        except ValueError:
            pass
    if "number" in kinds:
        try:
            number = float(text)
            return int(number) if number.is_integer() and "." not in text else number
        except ValueError:
            pass
    if "null" in kinds and text == "null":
        return None
    if None in kinds or "string" in kinds:
        return text
    wanted = " or ".join(str(k) for k in kinds)
    raise Refused(f"{name} must be {wanted}, got {text!r}", exit_code=EXIT_REFUSED)


def _answer_from_sets(client: Client, run: str, seq: int, pairs: tuple[str, ...]) -> dict[str, Any]:
    """The answer of ``--set NAME=VALUE ...``, each value typed by the ask's schema; a pair
    without ``=`` is a usage error, found before anything is asked of the Mediator."""
    fields = [pair.partition("=") for pair in pairs]
    for pair, (name, sep, _) in zip(pairs, fields):
        if not sep or not name:
            raise click.UsageError(f"--set takes NAME=VALUE, got {pair!r}")
    schema: dict[str, Any] = {}
    for ask in client.get("/v1/asks").get("asks") or []:
        if ask.get("run_id") == run and ask.get("seq") == seq:
            schema = ask.get("schema") or {}
    props = schema.get("properties") or {}
    return {name: _typed(name, text, props.get(name)) for name, _, text in fields}


def _read_answer(source: str) -> Any:
    """The answer document of ``--input``: ``@FILE``, ``-`` (stdin) or the JSON itself."""
    if source == "-":
        text, what = sys.stdin.read(), "stdin"
    elif source.startswith("@"):
        try:
            text, what = Path(source[1:]).read_text(encoding="utf-8"), source[1:]
        except OSError as exc:
            raise Refused(
                f"cannot read {source[1:]}: {exc.strerror}", exit_code=EXIT_REFUSED
            ) from None
    else:
        text, what = source, "--input"
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Refused(f"{what} is not valid JSON: {exc}", exit_code=EXIT_REFUSED) from None


@click.command()
@click.argument("run", shell_complete=complete_runs)
@click.argument("seq", type=click.IntRange(min=1))
@click.option(
    "--set", "pairs", multiple=True, metavar="NAME=VALUE", help="One field of the answer."
)
@click.option(
    "--input",
    "source",
    metavar="@FILE|-|DOC",
    help="The whole answer as JSON: @FILE reads a file, - reads stdin.",
)
@json_flag
@click.pass_context
@handled
def answer(
    ctx: click.Context,
    run: str,
    seq: int,
    pairs: tuple[str, ...],
    source: str | None,
) -> None:
    """Answer the ask of step SEQ of RUN, field by field (--set) or whole (--input).

    \b
    Examples:
      mediator answer kernel-4711-boot 3 --set verdict=approve --set ok=true
      mediator answer kernel-4711-boot 3 --input @answer.json
      mediator answer kernel-4711-boot 3 --input '{"verdict": "approve"}'
    """
    if bool(pairs) == (source is not None):
        raise click.UsageError("give the answer with --set NAME=VALUE ... or with --input @FILE|-")
    client = _client(ctx)
    doc = _read_answer(source) if source is not None else _answer_from_sets(client, run, seq, pairs)
    reply = client.post(f"/v1/runs/{quote(run)}/steps/{seq}/answer", doc).json()
    if _json_wanted(ctx):
        _print_json(reply)
    else:
        # An empty run_state is a run that goes on (the original's reply,
        # docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl).
        click.echo(f"{run}: step {seq} answered, run {reply.get('run_state') or 'RUNNING'}")


@click.command()
@click.argument("run", shell_complete=complete_runs)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Where to write the tar (- for stdout).",
)
@profile_option
@click.pass_context
@handled
def record(ctx: click.Context, run: str, output: str) -> None:
    """Download the sealed Record of RUN (a tar of run-<id>/...).

    \b
    Examples:
      mediator record kernel-4711-boot -o kernel-4711-boot.tar
      mediator record kernel-4711-boot -o - | tar -tvf -
    """
    chunks = _client(ctx).stream(f"/v1/runs/{quote(run)}/record")
    if output == "-":
        for chunk in chunks:
            sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
        return
    target = Path(output)
    partial = target.with_name(f".{target.name}.part")
    size = 0
    try:
        with open(partial, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
                size += len(chunk)
        os.replace(partial, target)
    except OSError as exc:
        _fail(ctx, f"cannot write {output}: {exc.strerror}", EXIT_REFUSED)
    finally:
        partial.unlink(missing_ok=True)
    click.echo(f"{run}: Record written to {output} ({size} bytes)")


@click.command()
@click.argument("run", shell_complete=complete_runs)
@click.argument("seq", type=click.IntRange(min=1))
@click.option("--follow", "-f", is_flag=True, help="Go on printing while the step runs.")
@click.option("--name", default="step", show_default=True, help="Which log of the step.")
@click.option(
    "--interval",
    default=WAIT_INTERVAL,
    show_default=True,
    type=INTERVALS,
    help="Seconds between looks.",
)
@profile_option
@click.pass_context
@handled
def logs(ctx: click.Context, run: str, seq: int, follow: bool, name: str, interval: float) -> None:
    """Print the log of step SEQ of RUN (Ctrl-C stops --follow with exit 130; the step goes
    on).

    \b
    Examples:
      mediator logs kernel-4711-boot 1
      mediator logs kernel-4711-boot 1 --follow
    """
    client = _client(ctx)
    out = sys.stdout.buffer
    try:
        print_log(client, run, seq, out, sys.stderr, name=name, follow=follow, interval=interval)
    except KeyboardInterrupt:
        client.close()
        click.echo(f"mediator: stopped following; {_goes_on(run)}", err=True)
        ctx.exit(EXIT_INTERRUPTED)


@click.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@json_flag
@click.pass_context
def validate(ctx: click.Context, file: str) -> None:
    """Check the contract in FILE offline, by the server's own rules (with the configured
    contract.capabilities, when a configuration names them).

    \b
    Examples:
      mediator validate boot.yaml
      mediator validate boot.json --json
    """
    from app.config import load_config
    from app.contract import validate_contract
    from app.errors import ConfigError, MediatorError

    try:
        doc, raw = read_contract(file)
    except ClientError as exc:
        _fail(ctx, exc.message, exc.exit_code)
    try:
        cfg = load_config(
            (ctx.obj or {}).get("config_path"), only=("max_body_bytes", "contract.capabilities")
        )
    except ConfigError as exc:
        _fail(ctx, f"invalid configuration: {exc}", EXIT_USAGE)
    try:
        if len(raw) > cfg["max_body_bytes"]:
            raise MediatorError(f"{len(raw)} bytes, over max_body_bytes ({cfg['max_body_bytes']})")
        contract = validate_contract(doc, capabilities=cfg["contract.capabilities"])
    except MediatorError as exc:
        if _json_wanted(ctx):
            _print_json({"valid": False, "reason": exc.reason})
        _fail(ctx, f"{file}: {exc.reason}", EXIT_REFUSED)
    warnings = list(contract.warnings)
    if _json_wanted(ctx):
        _print_json({"valid": True, "run_id": contract.run_id, "warnings": warnings})
        return
    _warn(warnings)
    roles, steps = len(contract.requires), len(contract.steps)
    click.echo(f"{file}: valid, run {contract.run_id}, {roles} roles, {steps} steps")


@click.command()
@json_flag
@click.pass_context
def profiles(ctx: click.Context) -> None:
    """The client configuration file's profiles, and the url, token and principal the client
    commands would use here, with where each comes from (the token itself is never shown).

    \b
    Examples:
      mediator profiles
      mediator --profile lab profiles --json
    """
    found = settings_of(ctx)
    path = config_path(os.environ)
    try:
        named, default = read_profiles(path)
    except SettingsError as exc:  # settings_of read no file: everything was given elsewhere
        _fail(ctx, str(exc), EXIT_USAGE)
    principal, principal_from = found.principal, found.sources.get("principal")
    if principal is None:
        principal, principal_from = _git_email(), "git config user.email"
    using: dict[str, dict[str, Any]] = {
        "url": {"value": found.url, "from": found.sources["url"]},
        "token": {"set": found.token is not None, "from": found.sources.get("token")},
        "principal": {"value": principal, "from": principal_from if principal else None},
    }
    if _json_wanted(ctx):
        shown = {
            name: {k: ("set" if k == "token" else v) for k, v in profile.items()}
            for name, profile in named.items()
        }
        _print_json(
            {"file": str(path), "default": default, "profiles": shown}
            | {"profile": found.profile, "using": using}
        )
        return
    click.echo(render.profiles(path, named, default, found.profile, using))


COMMANDS = (
    submit,
    status,
    runs,
    nodes,
    node,
    teams,
    cancel,
    asks,
    answer,
    record,
    logs,
    validate,
    profiles,
)


def register_client_commands(group: click.Group) -> None:
    for command in COMMANDS:
        group.add_command(command)
