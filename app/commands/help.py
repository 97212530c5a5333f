"""``mediator help`` and ``mediator completion``: what the command says about itself. Neither
reads any configuration, so both work in a shell whose configuration is broken or absent."""

from __future__ import annotations

import textwrap
from collections.abc import Callable

import click
from click.shell_completion import CompletionItem, get_completion_class

from app.client.commands import COMMANDS
from app.client.exits import EXIT_CODES

SHELLS = ("bash", "zsh", "fish")
WIDTH = 78  # the width of a topic's text, as click's help at its default width


def exit_codes() -> str:
    """The table of ``mediator help exit-codes``: each code and what it means."""
    names = ", ".join(sorted(str(c.name) for c in COMMANDS))
    lines = textwrap.wrap(f"The client commands ({names}) end with one of these codes:", WIDTH)
    lines.append("")
    for code, meaning in EXIT_CODES:
        wrapped = textwrap.wrap(meaning, WIDTH - 7, break_on_hyphens=False)
        lines.append(f"  {code:<5}{wrapped[0]}")
        lines += [f"{'':7}{more}" for more in wrapped[1:]]
    lines.append("")
    lines += textwrap.wrap(
        "The server's commands (mediator server ...) exit 2 for an invalid configuration; "
        "`mediator server db check --help` lists that command's own codes.",
        WIDTH,
    )
    return "\n".join(lines)


TOPICS: dict[str, Callable[[], str]] = {"exit-codes": exit_codes}


def _context_of(root: click.Context, words: tuple[str, ...]) -> click.Context | None:
    """The context of the command that ``words`` name below the root (``server db check``), as
    its ``--help`` would have it; None when they name none."""
    ctx = root
    for word in words:
        group = ctx.command
        found = group.get_command(ctx, word) if isinstance(group, click.Group) else None
        if found is None:
            return None
        ctx = click.Context(found, info_name=word, parent=ctx)
    return ctx


def complete_help(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """The topics, and the commands below the words already typed."""
    words = tuple(ctx.params.get("words") or ())
    below = _context_of(ctx.find_root(), words)
    names: list[str] = [] if words else list(TOPICS)
    if below is not None and isinstance(below.command, click.Group):
        group = below.command
        names += [
            name
            for name in group.list_commands(below)
            if not getattr(group.get_command(below, name), "hidden", False)
        ]
    return [CompletionItem(name) for name in names if name.startswith(incomplete)]


@click.command("help")
@click.argument("words", nargs=-1, metavar="[TOPIC | COMMAND...]", shell_complete=complete_help)
@click.pass_context
def help_command(ctx: click.Context, words: tuple[str, ...]) -> None:
    """Help on a topic, or on a command as its --help gives it. The topic: exit-codes, what
    each exit code of the client commands means.

    \b
    Examples:
      mediator help exit-codes
      mediator help server db check
    """
    root = ctx.find_root()
    if len(words) == 1 and words[0] in TOPICS:
        click.echo(TOPICS[words[0]]())
        return
    found = _context_of(root, words)
    if found is None:
        raise click.UsageError(
            f"no help topic or command {' '.join(words)!r} (topics: {', '.join(TOPICS)}; "
            "commands: mediator --help)"
        )
    click.echo(found.get_help())


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print SHELL's completion script for mediator: its commands and options, and the run and
    node ids asked of the Mediator as they are typed (docs/client.md). Reads no configuration.
    Save it where the shell looks for completions, as below (zsh: a directory of $fpath, such as
    ~/.zfunc with `fpath+=~/.zfunc` before `compinit` in ~/.zshrc), then start a new shell.

    \b
    Examples:
      mediator completion bash > /etc/bash_completion.d/mediator
      mediator completion zsh > ~/.zfunc/_mediator
      mediator completion fish > ~/.config/fish/completions/mediator.fish
    """
    root = ctx.find_root()
    prog_name = root.info_name or "mediator"
    # The variable the command itself reads when the script calls it (click's rule, Command.main).
    complete_var = f"_{prog_name.replace('-', '_').replace('.', '_')}_COMPLETE".upper()
    shell_class = get_completion_class(shell)
    assert shell_class is not None  # SHELLS are click's own
    script = shell_class(root.command, {}, prog_name, complete_var).source()
    click.echo(script, nl=False)
