"""``mediator server token new`` and ``upgrade``: a new secret, shown once, and the configuration
entry with its hash."""

from __future__ import annotations

import click

from app.config import load_config
from app.errors import ConfigError
from app.tokens import PRIORITY_RANGE, ROLES, NewToken, new_token, reissued


@click.group()
def token() -> None:
    """Bearer tokens of the Mediator's API: a new one, or a configured one reissued with an id.

    \b
    Examples:
      mediator server token new --name ci-bot --role submitter
      mediator server token upgrade --name ci-bot
    """


@token.command("new")
@click.option("--name", required=True, help="The token's name (on its runs and in the logs).")
@click.option(
    "--role",
    "roles",
    multiple=True,
    required=True,
    type=click.Choice(ROLES),
    help="A role of the token; repeat for several.",
)
@click.option(
    "--node",
    "nodes",
    multiple=True,
    help="A node id the token may act for (node role); repeat for several. Default: any node.",
)
@click.option("--principal", help="The principal the token acts as, whatever the caller says.")
@click.option(
    "--max-priority",
    type=click.IntRange(*PRIORITY_RANGE),
    help="The highest queue priority it may ask for (default 0, operators 100).",
)
def token_new(
    name: str,
    roles: tuple[str, ...],
    nodes: tuple[str, ...],
    principal: str | None,
    max_priority: int | None,
) -> None:
    """Print a new secret (shown this once: only its argon2 hash is kept) and the entry to add
    to the configuration's ``tokens`` list, as YAML for the file and as JSON for
    MEDIATOR_TOKENS.

    \b
    Examples:
      mediator server token new --name ci-bot --role submitter
      mediator server token new --name board-1 --role node --node board-1
      mediator server token new --name ops --role operator --role reader --max-priority 100
    """
    try:
        made = new_token(
            name,
            list(dict.fromkeys(roles)),
            nodes=list(dict.fromkeys(nodes)),
            principal=principal,
            max_priority=max_priority,
        )
    except ConfigError as exc:
        raise click.UsageError(str(exc).removeprefix("token.")) from None
    _print(made, "Add this entry to the `tokens:` list of the configuration file:")


@token.command("upgrade")
@click.option("--name", required=True, help="The name of the configured token to reissue.")
@click.pass_context
def token_upgrade(ctx: click.Context, name: str) -> None:
    """Reissue the configured token NAME with an id: a new ``med_<id>_…`` secret (shown this once)
    and the entry that replaces the old one, with the same roles, nodes, principal, priority and
    expiry. Its secret is then checked against its own entry only: unknown secrets no longer
    cost an argon2 verification for it. The old secret stops working once the old entry is
    replaced and the workers reloaded.

    \b
    Examples:
      mediator server token upgrade --name ci-bot
      mediator --config /etc/mediator/mediator.yaml server token upgrade --name ci-bot
    """
    config_path = (ctx.obj or {}).get("config_path")
    try:
        tokens = load_config(config_path)["tokens"]
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from None
    found = next((t for t in tokens if t.name == name), None)
    if found is None:
        known = ", ".join(t.name for t in tokens) or "none"
        raise click.UsageError(f"no configured token is named {name!r} (configured: {known})")
    _print(reissued(found), f"Replace the entry named {name} of the configuration with this one:")


def _print(made: NewToken, where: str) -> None:
    click.echo("# The secret, shown this once: give it to the token's holder.")
    click.echo(made.secret)
    click.echo(f"# {where}")
    click.echo(made.yaml_entry, nl=False)
    click.echo("# or this one to the JSON list of MEDIATOR_TOKENS:")
    click.echo(made.json_entry)
