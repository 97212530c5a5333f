"""The client commands of ``mediator``: what each does, over :mod:`app.client.http`.

Exit codes, for every command: 0 done (with ``--wait``: the run SUCCEEDED), 1 the run FAILED,
2 refused (any 4xx, or input that the server would refuse: the reason is printed), 3 the
Mediator could not be reached or failed (5xx). Output is for people (tables, lines); ``--json``
(after ``mediator`` or after the command) prints the answer's own JSON for scripts instead.
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

from app.client import render
from app.client.http import (
    DEFAULT_URL,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    Client,
    ClientError,
    Refused,
    quote,
)
from app.client.watch import print_log, wait_for_verdict
from app.errors import BadRequest

F = TypeVar("F", bound=Callable[..., Any])

WAIT_INTERVAL = 0.5  # seconds between two looks at a watched run


# ------------------------------------------------------------------------- options and set-up


def _store(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Keep a group option in ``ctx.obj``: the server commands never see it."""
    ctx.ensure_object(dict)
    if param.name == "json_output":
        value = bool(value) or bool(ctx.obj.get("json_output"))
    ctx.obj[param.name] = value
    return value


def client_options(f: F) -> F:
    """The group options of the client commands: where the Mediator is, and who calls it."""
    options = [
        click.option(
            "--url",
            envvar="MEDIATOR_URL",
            default=DEFAULT_URL,
            show_default=True,
            show_envvar=True,
            expose_value=False,
            callback=_store,
            help="The Mediator the client commands talk to.",
        ),
        click.option(
            "--token",
            envvar="MEDIATOR_TOKEN",
            show_envvar=True,
            expose_value=False,
            callback=_store,
            help="The bearer token of the client commands.",
        ),
        click.option(
            "--principal",
            envvar="MEDIATOR_PRINCIPAL",
            show_envvar=True,
            expose_value=False,
            callback=_store,
            help="Who is acting (X-Enode-Principal); default: git config user.email.",
        ),
        click.option(
            "--json",
            "json_output",
            is_flag=True,
            expose_value=False,
            callback=_store,
            help="Client commands print the answer's JSON instead of tables.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def json_flag(f: F) -> F:
    """``--json`` after a command, like ``--json`` after ``mediator``."""
    return click.option(
        "--json",
        "json_output",
        is_flag=True,
        expose_value=False,
        callback=_store,
        help="Print the answer's JSON instead of tables.",
    )(f)


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


def _client(ctx: click.Context) -> Client:
    obj = ctx.obj or {}
    principal = obj.get("principal") or _git_email()
    return Client(obj.get("url") or DEFAULT_URL, obj.get("token") or None, principal)


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


def _wait(ctx: click.Context, client: Client, view: dict[str, Any], interval: float) -> NoReturn:
    """Watch the run to its verdict and exit 0 (SUCCEEDED) or 1 (FAILED); progress goes to
    stdout, or to stderr when stdout carries the JSON of the last view."""
    as_json = _json_wanted(ctx)
    out = sys.stderr if as_json else sys.stdout
    last = wait_for_verdict(client, view, out, interval=interval, live=out.isatty())
    if as_json:
        _print_json(last)
    ctx.exit(EXIT_OK if last.get("state") == "SUCCEEDED" else EXIT_FAILED)


@click.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--dry-run", is_flag=True, help="Show where it would be placed; store nothing.")
@click.option("--wait", is_flag=True, help="Follow the run to its verdict (exit 0 or 1).")
@click.option("--interval", default=WAIT_INTERVAL, show_default=True, help="Seconds between looks.")
@json_flag
@click.pass_context
@handled
def submit(ctx: click.Context, file: str, dry_run: bool, wait: bool, interval: float) -> None:
    """Submit the contract in FILE (JSON, or YAML by its extension; - reads stdin)."""
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
        _wait(ctx, client, view, interval)
    if _json_wanted(ctx):
        _print_json(view)
        return
    run_id, state = view.get("run_id"), view.get("state")
    if reply.status == 200:
        click.echo(f"{run_id}: already known, {state}")
    elif state == "QUEUED":
        click.echo(f"{run_id}: QUEUED, {render.queue_line(view)}")
    elif state == "RUNNING":
        click.echo(f"{run_id}: RUNNING on {render.assigned(view)}")
    else:
        click.echo(f"{run_id}: {state}")


@click.command()
@click.argument("run")
@click.option("--wait", is_flag=True, help="Follow the run to its verdict (exit 0 or 1).")
@click.option("--interval", default=WAIT_INTERVAL, show_default=True, help="Seconds between looks.")
@json_flag
@click.pass_context
@handled
def status(ctx: click.Context, run: str, wait: bool, interval: float) -> None:
    """A run: its state, what it waits for while QUEUED, its steps and its verdict."""
    client = _client(ctx)
    view = client.get(f"/v1/runs/{quote(run)}")
    if wait:
        _wait(ctx, client, view, interval)
    if _json_wanted(ctx):
        _print_json(view)
    else:
        click.echo(render.run_view(view))


@click.command()
@click.option("--state", help="Only runs in this state (QUEUED, RUNNING, SUCCEEDED, ...).")
@click.option("--work", help="Only runs of this work key (system:change_id).")
@click.option("--since", help="Only runs created at or after this RFC 3339 time.")
@click.option("--limit", type=int, help="At most this many (the server's default is 100).")
@json_flag
@click.pass_context
@handled
def runs(
    ctx: click.Context, state: str | None, work: str | None, since: str | None, limit: int | None
) -> None:
    """Runs, newest first."""
    query: dict[str, str | int | None] = {
        "state": state,
        "work": work,
        "since": since,
        "limit": limit,
    }
    answer = _client(ctx).get("/v1/runs", query)
    if _json_wanted(ctx):
        _print_json(answer)
    else:
        click.echo(render.runs_table(answer.get("runs") or []))


@click.command()
@json_flag
@click.pass_context
@handled
def nodes(ctx: click.Context) -> None:
    """The fleet: live nodes, their capabilities, leases and drains."""
    answer = _client(ctx).get("/v1/nodes")
    if _json_wanted(ctx):
        _print_json(answer)
    else:
        click.echo(render.nodes_table(answer.get("nodes") or []))


@click.command()
@click.argument("run")
@json_flag
@click.pass_context
@handled
def cancel(ctx: click.Context, run: str) -> None:
    """Cancel a run (queued or running); a finished run keeps its state."""
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
    """Open asks: questions that running steps wait on, and whether you may answer them."""
    answer = _client(ctx).get("/v1/asks")
    if _json_wanted(ctx):
        _print_json(answer)
    else:
        click.echo(render.asks_table(answer.get("asks") or []))


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _typed(name: str, text: str, prop: object) -> Any:
    """``--set name=text`` as the value the ask's schema wants for ``name`` (SPEC §10: a flat
    object of primitive or enum properties); text when the schema does not say."""
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
    schema: dict[str, Any] = {}
    for ask in client.get("/v1/asks").get("asks") or []:
        if ask.get("run_id") == run and ask.get("seq") == seq:
            schema = ask.get("schema") or {}
    props = schema.get("properties") or {}
    doc: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise Refused(f"--set takes name=value, got {pair!r}", exit_code=EXIT_REFUSED)
        doc[name] = _typed(name, text, props.get(name))
    return doc


@click.command()
@click.argument("run")
@click.argument("seq", type=click.IntRange(min=1))
@click.option(
    "--set", "pairs", multiple=True, metavar="NAME=VALUE", help="One field of the answer."
)
@click.option(
    "--json", "document", metavar="DOC", help="The whole answer as JSON (@FILE reads it)."
)
@click.pass_context
@handled
def answer(
    ctx: click.Context, run: str, seq: int, pairs: tuple[str, ...], document: str | None
) -> None:
    """Answer the ask of step SEQ of RUN, field by field (--set) or whole (--json)."""
    if bool(pairs) == (document is not None):
        raise click.UsageError("give the answer with --set NAME=VALUE ... or with --json DOC")
    client = _client(ctx)
    if document is not None:
        if document.startswith("@"):
            try:
                document = Path(document[1:]).read_text(encoding="utf-8")
            except OSError as exc:
                _fail(ctx, f"cannot read {document[1:]}: {exc.strerror}", EXIT_REFUSED)
        try:
            doc = json.loads(document)
        except ValueError as exc:
            _fail(ctx, f"--json is not valid JSON: {exc}", EXIT_REFUSED)
    else:
        doc = _answer_from_sets(client, run, seq, pairs)
    reply = client.post(f"/v1/runs/{quote(run)}/steps/{seq}/answer", doc).json()
    if _json_wanted(ctx):
        _print_json(reply)
    else:
        # An empty run_state is a run that goes on (SPEC §19: the original's reply).
        click.echo(f"{run}: step {seq} answered, run {reply.get('run_state') or 'RUNNING'}")


@click.command()
@click.argument("run")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Where to write the tar (- for stdout).",
)
@click.pass_context
@handled
def record(ctx: click.Context, run: str, output: str) -> None:
    """Download the sealed Record of RUN (a tar of run-<id>/...)."""
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
@click.argument("run")
@click.argument("seq", type=click.IntRange(min=1))
@click.option("--follow", "-f", is_flag=True, help="Go on printing while the step runs.")
@click.option("--name", default="step", show_default=True, help="Which log of the step.")
@click.option("--interval", default=WAIT_INTERVAL, show_default=True, help="Seconds between looks.")
@click.pass_context
@handled
def logs(ctx: click.Context, run: str, seq: int, follow: bool, name: str, interval: float) -> None:
    """Print the log of step SEQ of RUN."""
    out = sys.stdout.buffer
    print_log(_client(ctx), run, seq, out, sys.stderr, name=name, follow=follow, interval=interval)


@click.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@json_flag
@click.pass_context
def validate(ctx: click.Context, file: str) -> None:
    """Check the contract in FILE offline, by the server's own rules (with the configured
    contract.capabilities, when a configuration names them)."""
    from app.config import load_config
    from app.contract import validate_contract
    from app.errors import ConfigError, MediatorError

    try:
        doc, raw = read_contract(file)
    except ClientError as exc:
        _fail(ctx, exc.message, exc.exit_code)
    try:
        cfg = load_config((ctx.obj or {}).get("config_path"))
    except ConfigError as exc:
        _fail(ctx, f"invalid configuration: {exc}", EXIT_REFUSED)
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


COMMANDS = (submit, status, runs, nodes, cancel, asks, answer, record, logs, validate)


def register_client_commands(group: click.Group) -> None:
    for command in COMMANDS:
        group.add_command(command)
