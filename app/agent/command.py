"""``mediator agent``: the click command of the reference node agent."""

from __future__ import annotations

import sys
from typing import Any

import click
from click.core import ParameterSource

from app.agent.config import AgentConfigError, load_agent_config


def _given_to_mediator(ctx: click.Context, name: str) -> Any:
    """``mediator --url … agent``: a group option written on the command line counts as this
    command's own flag (from the environment or its default it does not: the file may say)."""
    parent = ctx.parent
    if parent is None or parent.get_parameter_source(name) is not ParameterSource.COMMANDLINE:
        return None
    return (parent.obj or {}).get(name)


@click.command("agent")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="YAML: node_id, label, capabilities [{capability, attrs}], and the agent's settings.",
)
@click.option("--node-id", help="This node's id (node_id).")
@click.option("--label", help="A label people read in the node list.")
@click.option(
    "--capability",
    "capabilities",
    multiple=True,
    metavar="NAME[:k=v,...]",
    help="A capability to advertise, repeatable; replaces the file's list.",
)
@click.option(
    "--url",
    help="The Mediator [env MEDIATOR_AGENT_URL, MEDIATOR_URL; default http://127.0.0.1:8080].",
)
@click.option(
    "--token", help="A token with the node role [env MEDIATOR_AGENT_TOKEN, MEDIATOR_TOKEN]."
)
@click.option(
    "--principal",
    help="Who runs this node (X-Enode-Principal) [env MEDIATOR_AGENT_PRINCIPAL, "
    "MEDIATOR_PRINCIPAL].",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False),
    help="Where each step gets a fresh directory [default: the system's temporary directory].",
)
@click.option(
    "--drain-file",
    type=click.Path(dir_okay=False),
    help="While this file exists the node advertises drain and takes no new work.",
)
@click.option(
    "--claim-wait",
    "claim_wait_seconds",
    type=click.FloatRange(min=0),
    help="Seconds one claim long-polls [default 10]; SIGTERM while idle exits within it.",
)
@click.option("--log-format", type=click.Choice(["console", "json"]), help="[default console]")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]))
@click.pass_context
def agent(ctx: click.Context, config_file: str | None, **flags: Any) -> None:
    """The reference node agent: advertises this node's capabilities, claims steps, runs them
    as subprocesses with $IN and $OUT, uploads their logs and outputs and reports their results.
    SIGTERM drains: the running step finishes, then the agent exits 0.

    \b
    Examples:
      mediator agent --config agent.yaml
      mediator agent --node-id board-1 --capability board:soc=imx8mp,rev=b
      mediator agent --url http://mediator.lab:8080 --node-id host-1 --capability build
    """
    for name in ("url", "token", "principal"):
        if flags.get(name) is None:
            flags[name] = _given_to_mediator(ctx, name)
    try:
        cfg = load_agent_config(config_file, flags)
    except AgentConfigError as exc:
        click.echo(f"mediator agent: invalid configuration: {exc}", err=True)
        sys.exit(2)

    from app.agent.loop import Agent
    from app.logs import configure_logging

    configure_logging(cfg.log_format, cfg.log_level)
    sys.exit(Agent(cfg).run())
