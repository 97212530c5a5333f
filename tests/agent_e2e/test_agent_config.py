"""The node agent's configuration and argv expansion, without a server: flags over the
environment over the file, one line naming the key for every mistake."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from app.agent.config import AgentConfigError, Capability, load_agent_config
from app.agent.step import expand
from app.commands.main import main


def write(tmp_path, text: str):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return path


def test_a_capability_flag_carries_its_attributes():
    cfg = load_agent_config(
        None, {"node_id": "b1", "capabilities": ("board:soc=imx8mp,rev=b", "usb")}, env={}
    )
    assert cfg.capabilities == (
        Capability("board", {"soc": "imx8mp", "rev": "b"}),
        Capability("usb"),
    )
    assert cfg.advert("i1", "")["capabilities"] == [
        {"capability": "board", "attrs": {"soc": "imx8mp", "rev": "b"}},
        {"capability": "usb", "attrs": {}},
    ]


def test_flags_win_over_the_environment_which_wins_over_the_file(tmp_path):
    path = write(
        tmp_path,
        "node_id: from-file\nurl: http://file:1\ntoken: file-token\n"
        "capabilities: [{capability: board, attrs: {soc: imx8mp}}]\n",
    )
    env = {"MEDIATOR_URL": "http://env:2", "MEDIATOR_TOKEN": "env-token"}
    cfg = load_agent_config(path, {"node_id": None, "url": None, "capabilities": ()}, env=env)
    assert (cfg.node_id, cfg.url, cfg.token) == ("from-file", "http://env:2", "env-token")
    assert cfg.capabilities == (Capability("board", {"soc": "imx8mp"}),)
    cfg = load_agent_config(
        path, {"node_id": "flag", "url": "http://flag:3", "capabilities": ("usb",)}, env=env
    )
    assert (cfg.node_id, cfg.url, cfg.capabilities) == (
        "flag",
        "http://flag:3",
        (Capability("usb"),),
    )


def test_the_agents_own_variables_win_over_the_shared_ones(tmp_path):
    """MEDIATOR_AGENT_* keep a node's token out of a server started from the same shell; the
    shared MEDIATOR_URL / MEDIATOR_TOKEN / MEDIATOR_PRINCIPAL still work where they are set."""
    shared = {
        "MEDIATOR_URL": "http://shared:1",
        "MEDIATOR_TOKEN": "shared-token",
        "MEDIATOR_PRINCIPAL": "shared@lab.test",
    }
    own = {
        "MEDIATOR_AGENT_URL": "http://agent:2",
        "MEDIATOR_AGENT_TOKEN": "agent-token",
        "MEDIATOR_AGENT_PRINCIPAL": "agent@lab.test",
    }
    flags = {"node_id": "b1"}

    by_shared = load_agent_config(None, flags, env=shared)
    by_own = load_agent_config(None, flags, env=shared | own)
    by_flag = load_agent_config(None, flags | {"token": "flag-token"}, env=shared | own)

    assert (by_shared.url, by_shared.token, by_shared.principal) == (
        "http://shared:1",
        "shared-token",
        "shared@lab.test",
    )
    assert (by_own.url, by_own.token, by_own.principal) == (
        "http://agent:2",
        "agent-token",
        "agent@lab.test",
    )
    assert by_flag.token == "flag-token"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("label: x\n", "node_id: missing"),
        ("node_id: a/b\n", "node_id: must be 1-200 characters"),
        ("node_id: n\nnodes: 2\n", "nodes: unknown key"),
        (
            "node_id: n\ncapabilities: [{capability: board, attrs: {rev: 1.10}}]\n",
            "capabilities[0].attrs.rev: must be a string (quote it in YAML), got 1.1",
        ),
        ("node_id: n\ncapabilities: [{capability: Board}]\n", "capabilities[0].capability"),
        ("node_id: n\nharness: {command: []}\n", "harness.command: must be a non-empty list"),
        ("node_id: n\nurl: mediator:8080\n", "url: must be an http:// or https:// URL"),
        ("node_id: [\n", "--config: cannot parse"),
    ],
)
def test_a_mistake_is_one_line_naming_the_key(tmp_path, text, reason):
    with pytest.raises(AgentConfigError) as err:
        load_agent_config(write(tmp_path, text), {}, env={})
    assert reason in str(err.value) and "\n" not in str(err.value)


def test_the_command_refuses_a_bad_configuration_with_exit_2_and_one_line():
    result = CliRunner().invoke(main, ["agent", "--capability", "board"], env={})
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "mediator agent: invalid configuration: node_id: missing "
        "(--node-id ID or node_id: in --config)"
    ]


def test_only_in_and_out_are_expanded_in_argv_and_only_as_whole_names():
    paths = {"IN": "/w/in", "OUT": "/w/out"}
    assert expand(["cp", "$IN/a", "${OUT}/b", "DESTDIR=$OUT", "$OUTPUT", "$HOME"], paths) == [
        "cp",
        "/w/in/a",
        "/w/out/b",
        "DESTDIR=/w/out",
        "$OUTPUT",
        "$HOME",
    ]
