"""The conventions of the ``mediator`` command as a whole (docs/client.md): every command's help
ends with examples that name that very command and parse; ``mediator help exit-codes`` prints the
exit codes' one table, the table docs/client.md shows; the exit codes tell a usage error (2),
refused credentials (5) and another refusal (6) apart; ``mediator completion SHELL`` prints
click's own script; the operator's commands are under ``mediator server`` and still answer at
the top under their earlier names, hidden; ``--help``, ``help`` and ``completion`` work whatever
the server's configuration in the environment holds. No Mediator is needed: a command that would
reach one talks to a closed port."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from app.client.exits import EXIT_CODES
from app.commands.main import main, server
from tests.client.cli import mediator
from tests.support.apps import ROOT

pytestmark = pytest.mark.slow  # processes of the client

SERVER_COMMANDS = ("db", "example", "prune", "reaper", "serve", "token")
CLIENT_COMMANDS = (
    "answer",
    "asks",
    "cancel",
    "logs",
    "node",
    "nodes",
    "profiles",
    "record",
    "runs",
    "status",
    "submit",
    "teams",
    "validate",
)

# A server's configuration nothing could serve with: a database Mediator does not speak, tokens
# that are not JSON, a configuration file that is not there.
BROKEN_SERVER = {
    "MEDIATOR_DATABASE_URL": "mysql://x",
    "MEDIATOR_TOKENS": "garbage",
    "MEDIATOR_TOKEN": "short",
    "MEDIATOR_CONFIG": "/nonexistent/mediator.yaml",
    "MEDIATOR_LEASE_TTL_SECONDS": "soon",
}
SHELL_OPERATORS = {"|", ">", ">>", "<", "&&", ";"}


# ------------------------------------------------------------------------- the command tree


def commands(
    command: click.Command = main, path: tuple[str, ...] = (), hidden: bool = False
) -> Iterator[tuple[tuple[str, ...], click.Command, bool]]:
    """Every command below ``command`` (itself first) with its path of names and whether it is
    only reached through a hidden one (an earlier name)."""
    hidden = hidden or command.hidden
    yield path, command, hidden
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from commands(sub, (*path, name), hidden)


def help_of(path: tuple[str, ...]) -> str:
    """What ``mediator PATH --help`` prints."""
    ctx = click.Context(main, info_name="mediator")
    for name in path:
        group = ctx.command
        assert isinstance(group, click.Group)
        found = group.get_command(ctx, name)
        assert found is not None, path
        ctx = click.Context(found, info_name=name, parent=ctx)
    return ctx.get_help()


def examples_of(text: str) -> list[str]:
    """The lines of the help's "Examples:" block."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == "Examples:"]
    assert len(starts) == 1, text
    found = []
    for line in lines[starts[0] + 1 :]:
        if not line.strip():
            break
        found.append(line.strip())
    return found


def _rest(ctx: click.Context) -> list[str]:
    """The words a group's context left for its subcommand (click keeps the first apart)."""
    first = ctx.__dict__.get("_protected_args", ctx.__dict__.get("protected_args", []))
    return [*first, *ctx.args]


def path_of(example: str) -> tuple[str, ...]:
    """The command an example runs, its words parsed by the commands themselves as a shell would
    hand them over (a pipe or a redirection ends them; a variable's assignment goes before)."""
    words = shlex.split(example)
    words = words[: next((i for i, w in enumerate(words) if w in SHELL_OPERATORS), len(words))]
    while re.fullmatch(r"[A-Z_]+=.*", words[0]):
        words.pop(0)
    assert words[0] == "mediator", example
    ctx = main.make_context("mediator", words[1:])
    path: list[str] = []
    while isinstance(ctx.command, click.Group):
        name, sub, args = ctx.command.resolve_command(ctx, _rest(ctx))
        assert name is not None and sub is not None, example
        path.append(name)
        ctx = sub.make_context(name, args, parent=ctx)
    return tuple(path)


TREE = list(commands())


@pytest.mark.parametrize(
    ("path", "command", "hidden"), TREE, ids=[" ".join(p) or "mediator" for p, _, _ in TREE]
)
def test_every_command_ends_its_help_with_examples_of_itself_that_parse(
    path: tuple[str, ...], command: click.Command, hidden: bool
) -> None:
    text = help_of(path)
    examples = examples_of(text)

    assert 1 <= len(examples) <= 3, examples
    # The block ends the help's text: the options (and a group's commands) come after it.
    tail = text.split("Examples:", 1)[1].split("\nOptions:", 1)[0]
    assert [line.strip() for line in tail.strip().splitlines()] == examples, text
    if hidden:
        return  # an earlier name: its examples show the name it has now
    for example in examples:
        ran = path_of(example)
        if isinstance(command, click.Group) and path:
            assert ran[: len(path)] == path, (example, path)
        elif path:
            assert ran == path, (example, path)


def test_the_tree_has_what_the_test_above_walks() -> None:
    shown = {p for p, _, hidden in TREE if not hidden}
    assert {(name,) for name in CLIENT_COMMANDS} <= shown
    assert {("server", name) for name in SERVER_COMMANDS} <= shown
    assert {("server", "db", "check"), ("server", "token", "new"), ("node", "drain")} <= shown
    assert {("help",), ("completion",), ("agent",), ("demo",)} <= shown
    assert {("db", "check"), ("reaper",)} <= {p for p, _, hidden in TREE if hidden}


# ------------------------------------------------------------------------ the server group


def test_the_server_commands_are_under_server_and_answer_at_the_top_hidden() -> None:
    top = mediator(None, "--help")
    grouped = mediator(None, "server", "--help")
    old = mediator(None, "db", "check", "--help")
    new = mediator(None, "server", "db", "check", "--help")
    old_prune = mediator(None, "prune", "--before", "soon")

    listed = re.findall(r"^  (\S+)  ", top.stdout.split("Commands:", 1)[1], flags=re.M)
    assert (top.returncode, top.stderr) == (0, "")
    assert set(listed) == {*CLIENT_COMMANDS, "agent", "completion", "demo", "help", "server"}
    in_server = re.findall(r"^  (\S+)  ", grouped.stdout.split("Commands:", 1)[1], flags=re.M)
    assert (grouped.returncode, set(in_server)) == (0, set(SERVER_COMMANDS))
    assert (old.returncode, new.returncode) == (0, 0)
    assert old.stdout.startswith("Usage: mediator db check [OPTIONS]\n")
    assert new.stdout.startswith("Usage: mediator server db check [OPTIONS]\n")
    assert old.stdout.split("\n", 1)[1] == new.stdout.split("\n", 1)[1]
    # The earlier name runs the same command, and says so by the name it was called by.
    assert old_prune.returncode == 2
    assert old_prune.stderr.startswith("mediator prune: --before must be an RFC 3339 time")


def test_an_earlier_name_is_the_same_command_hidden() -> None:
    for name in SERVER_COMMANDS:
        alias, command = main.commands[name], server.commands[name]
        assert alias is not command and alias.hidden and not command.hidden
        assert (alias.callback, alias.params) == (command.callback, command.params)
        if isinstance(command, click.Group):
            assert isinstance(alias, click.Group) and alias.commands is command.commands


# --------------------------------------------------------------------------------- help


def test_help_exit_codes_prints_the_table_that_docs_client_md_shows() -> None:
    done = mediator(None, "help", "exit-codes")

    assert (done.returncode, done.stderr) == (0, "")
    text = " ".join(done.stdout.split())
    for code, meaning in EXIT_CODES:
        assert f" {code} {meaning}" in text
    assert [code for code, _ in EXIT_CODES] == [0, 1, 2, 3, 4, 5, 6, 130]
    page = (ROOT / "docs" / "client.md").read_text()
    section = page.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| (.*) \|$", section, flags=re.M)
    assert [(int(code), meaning.replace("`", "")) for code, meaning in rows] == list(EXIT_CODES)


def test_help_of_a_command_is_its_help_and_an_unknown_topic_a_usage_error() -> None:
    by_help = mediator(None, "help", "server", "db", "check")
    by_option = mediator(None, "server", "db", "check", "--help")
    top = mediator(None, "help")
    unknown = mediator(None, "help", "exit-code")

    assert (by_help.returncode, by_help.stdout) == (0, by_option.stdout)
    assert top.returncode == 0 and top.stdout.startswith("Usage: mediator [OPTIONS] COMMAND")
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert "no help topic or command 'exit-code' (topics: exit-codes;" in unknown.stderr


# ---------------------------------------------------------------------------- exit codes


def test_usage_errors_and_an_unusable_client_configuration_exit_2(tmp_path: Path) -> None:
    unknown = mediator(None, "stauts", "run-1")
    no_pair = mediator(None, "answer", "run-1", "2", "--set", "verdict")
    wrong_url = mediator(None, "--url", "ftp://mediator.lab", "runs")
    (tmp_path / "client.toml").write_text('default = "nowhere"\n')
    no_profile = mediator(  # the file is read for what the variables leave out
        None, "runs", MEDIATOR_CLIENT_CONFIG=str(tmp_path / "client.toml"), MEDIATOR_CLIENT_TOKEN=""
    )

    assert unknown.returncode == 2 and "No such command 'stauts'" in unknown.stderr
    # Before anything is sent: the closed port of the environment would be exit 3.
    assert no_pair.returncode == 2 and "--set takes NAME=VALUE, got 'verdict'" in no_pair.stderr
    assert (wrong_url.returncode, wrong_url.stderr) == (
        2,
        "mediator: the Mediator's URL must be http://HOST[:PORT] or https://..., got "
        "'ftp://mediator.lab'\n",
    )
    assert (no_profile.returncode, no_profile.stderr) == (
        2,
        f"mediator: {tmp_path / 'client.toml'}: default: no profile 'nowhere'\n",
    )


def test_a_token_the_client_cannot_read_or_send_is_exit_5(tmp_path: Path) -> None:
    config = tmp_path / "client.toml"
    config.write_text(f'[profiles.lab]\ntoken_file = "{tmp_path / "gone.token"}"\n')
    unreadable = mediator(
        None,
        "--profile",
        "lab",
        "runs",
        MEDIATOR_CLIENT_CONFIG=str(config),
        MEDIATOR_CLIENT_TOKEN="",
    )
    broken = mediator(None, "runs", MEDIATOR_CLIENT_TOKEN="secret-part\nother-part")
    beyond = mediator(None, "runs", MEDIATOR_CLIENT_TOKEN="t\u00f6ken-2")

    assert (unreadable.returncode, unreadable.stdout) == (5, "")
    assert unreadable.stderr == (
        f"mediator: {config}: profiles.lab.token_file: cannot read {tmp_path / 'gone.token'}: "
        "No such file or directory\n"
    )
    for refused in (broken, beyond):
        assert refused.returncode == 5
        assert refused.stderr == (
            "mediator: MEDIATOR_CLIENT_TOKEN: the token holds a character an HTTP header cannot "
            "carry (a control character or line break, or one beyond ASCII)\n"
        )
    assert "secret-part" not in broken.stderr


def test_the_closed_port_of_these_tests_is_exit_3_not_a_refusal() -> None:
    """What the tests above would have met had they sent anything."""
    reached = mediator(None, "runs")

    assert reached.returncode == 3 and "cannot reach the Mediator" in reached.stderr


# ------------------------------------------------------------------ completion, configuration


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_clicks_own_script_whatever_the_configuration(shell: str) -> None:
    broken = {**BROKEN_SERVER, "MEDIATOR_CLIENT_CONFIG": "/nonexistent/client.toml"}
    script = mediator(None, "completion", shell, **broken)
    source = mediator(None, _MEDIATOR_COMPLETE=f"{shell}_source")

    assert (script.returncode, script.stderr) == (0, "")
    assert script.stdout == source.stdout
    assert f"_MEDIATOR_COMPLETE={shell}_complete" in script.stdout


def test_completion_help_says_where_each_shell_keeps_it() -> None:
    done = mediator(None, "completion", "--help")
    wrong = mediator(None, "completion", "tcsh")

    assert done.returncode == 0
    for where in (
        "mediator completion bash > /etc/bash_completion.d/mediator",
        "mediator completion zsh > ~/.zfunc/_mediator",
        "mediator completion fish > ~/.config/fish/completions/mediator.fish",
    ):
        assert where in done.stdout
    assert wrong.returncode == 2 and "'tcsh' is not one of 'bash', 'zsh', 'fish'" in wrong.stderr


@pytest.mark.parametrize("config", ["/nonexistent/mediator.yaml", "/"])
def test_help_and_completion_read_no_server_configuration(config: str) -> None:
    """A broken configuration (a file that is not there, or a directory) in the environment:
    every command's --help, ``help``, ``completion`` and the shell's completion of command names
    work; a command that loads the configuration still names what is wrong."""
    broken = {**BROKEN_SERVER, "MEDIATOR_CONFIG": config}
    top = mediator(None, "--help", **broken)
    nested = mediator(None, "server", "reaper", "--help", **broken)
    topic = mediator(None, "help", "exit-codes", **broken)
    script = mediator(None, "completion", "bash", **broken)
    words = "mediator server d"
    completed = mediator(
        None,
        _MEDIATOR_COMPLETE="bash_complete",
        COMP_WORDS=words,
        COMP_CWORD=str(len(words.split(" ")) - 1),
        **broken,
    )
    loads = mediator(None, "server", "db", "check", **broken)

    for done in (top, nested, topic, script, completed):
        assert (done.returncode, done.stderr) == (0, ""), done.args
    assert nested.stdout.startswith("Usage: mediator server reaper [OPTIONS]")
    assert completed.stdout.splitlines() == ["plain,db"]
    assert loads.returncode == 2
    assert loads.stderr.startswith(f"mediator: invalid configuration: config: cannot read {config}")
    runner = CliRunner()
    for path, _, _ in TREE:
        result = runner.invoke(main, [*path, "--help"], env=broken, prog_name="mediator")
        assert result.exit_code == 0, (path, result.output)
        assert result.output.startswith(f"Usage: {' '.join(('mediator', *path))} ")


def test_validate_reads_only_its_two_keys_of_a_broken_configuration(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        "run_id: off-2\nrequires: [{as: dut, capability: board}]\n"
        "steps: [{id: boot, uses: dut, run: [boot-test]}]\n"
    )
    broken = {k: v for k, v in BROKEN_SERVER.items() if k != "MEDIATOR_CONFIG"}

    done = mediator(None, "validate", str(path), **broken)

    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"{path}: valid, run off-2, 1 roles, 1 steps\n"
