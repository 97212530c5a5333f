"""The client configuration file against a real gunicorn: a profile gives the Mediator's URL, a
token (from a file: it never has to be on the command line) and a principal; ``--profile`` picks
one before or after any command; the command line wins over the variables, which win over the
profile. What the server recorded (the run's principal) and what it accepted (the token) show
which value was used."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.client.cli import mediator
from tests.support.actors import Node, cap
from tests.support.apps import TOKEN
from tests.support.contracts import contract
from tests.support.processes import free_port

one_server_per_module = True

pytestmark = pytest.mark.slow  # processes of the client

# No client variable at all: the file alone says where and who.
FILE_ONLY = {
    "MEDIATOR_CLIENT_URL": "",
    "MEDIATOR_CLIENT_TOKEN": "",
    "MEDIATOR_CLIENT_PRINCIPAL": "",
    "MEDIATOR_CLIENT_CONFIG": "",
}


def closed_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def write_profiles(
    home: Path, server: Any, *, default: str = "lab", away: str | None = None
) -> Path:
    """``$XDG_CONFIG_HOME/mediator/client.toml`` with ``lab`` (the live server, its token in a
    file of mode 600) and ``away`` (a Mediator that is not there)."""
    token_file = home / "lab.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    path = home / "mediator" / "client.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'default = "{default}"\n\n'
        f'[profiles.lab]\nurl = "{server.url}"\ntoken_file = "{token_file}"\n'
        'principal = "profile@lab.test"\n\n'
        f'[profiles.away]\nurl = "{away or closed_url()}"\ntoken = "away-token"\n'
    )
    path.chmod(0o600)
    return path


def advertise(server: Any, node: str = "board-1") -> None:
    Node(server, node, f"{node}-1").advertise(cap())


def principal_of(server: Any, run_id: str) -> str:
    resp = server.get(f"/v1/runs/{run_id}")
    assert resp.status_code == 200, resp.text
    return str(resp.json()["principal"])


def test_the_default_profile_of_xdg_config_home_is_the_url_the_token_and_the_principal(
    tmp_path, live_server
):
    advertise(live_server)
    write_profiles(tmp_path, live_server)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(contract("prof-1")))

    result = mediator(None, "submit", str(path), XDG_CONFIG_HOME=str(tmp_path), **FILE_ONLY)

    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "prof-1: RUNNING on dut=board-1\n"
    assert principal_of(live_server, "prof-1") == "profile@lab.test"


def test_profile_picks_a_profile_before_or_after_the_command(tmp_path, live_server):
    write_profiles(tmp_path, live_server, default="away")
    env = {"XDG_CONFIG_HOME": str(tmp_path), **FILE_ONLY}

    by_default = mediator(None, "runs", **env)
    after = mediator(None, "runs", "--profile", "lab", **env)
    before = mediator(None, "--profile", "lab", "runs", **env)
    by_variable = mediator(None, "runs", MEDIATOR_CLIENT_PROFILE="lab", **env)
    unknown = mediator(None, "runs", "--profile", "work", **env)

    assert by_default.returncode == 3 and "cannot reach the Mediator" in by_default.stderr
    assert (after.returncode, after.stdout) == (0, "no runs\n")
    assert (before.returncode, before.stdout) == (0, "no runs\n")
    assert (by_variable.returncode, by_variable.stdout) == (0, "no runs\n")
    config = tmp_path / "mediator" / "client.toml"
    assert (unknown.returncode, unknown.stderr) == (
        2,
        f"mediator: --profile: no profile 'work' in {config} (its profiles: away, lab)\n",
    )


def test_the_command_line_wins_over_the_variables_which_win_over_the_profile(tmp_path, live_server):
    advertise(live_server)
    write_profiles(tmp_path, live_server)
    env = {"XDG_CONFIG_HOME": str(tmp_path), **FILE_ONLY}
    runs = {}
    for run_id, extra, args in [
        ("by-profile", {}, ()),
        ("by-shared", {"MEDIATOR_PRINCIPAL": "shared@lab.test"}, ()),
        (
            "by-client",
            {"MEDIATOR_PRINCIPAL": "shared@lab.test", "MEDIATOR_CLIENT_PRINCIPAL": "env@lab.test"},
            (),
        ),
        (
            "by-option",
            {"MEDIATOR_CLIENT_PRINCIPAL": "env@lab.test"},
            ("--principal", "cli@lab.test"),
        ),
    ]:
        path = tmp_path / f"{run_id}.json"
        path.write_text(json.dumps(contract(run_id)))
        result = mediator(None, *args, "submit", str(path), **(env | extra))
        assert result.returncode == 0, result.stderr
        runs[run_id] = principal_of(live_server, run_id)
    # A wrong token in the environment wins over the profile's right one, and an option's over
    # the environment's.
    wrong_env = mediator(None, "runs", **(env | {"MEDIATOR_CLIENT_TOKEN": "wrong-token"}))
    right_option = mediator(
        None, "--token", TOKEN, "runs", **(env | {"MEDIATOR_CLIENT_TOKEN": "wrong-token"})
    )

    assert runs == {
        "by-profile": "profile@lab.test",
        "by-shared": "shared@lab.test",
        "by-client": "env@lab.test",
        "by-option": "cli@lab.test",
    }
    assert wrong_env.returncode == 5 and "missing or invalid token" in wrong_env.stderr
    assert right_option.returncode == 0, right_option.stderr


def test_the_shared_variables_of_earlier_versions_still_work(tmp_path, live_server):
    advertise(live_server)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(contract("shared-1")))

    result = mediator(
        None,
        "submit",
        str(path),
        MEDIATOR_URL=live_server.url,
        MEDIATOR_TOKEN=TOKEN,
        MEDIATOR_PRINCIPAL="old@lab.test",
        **FILE_ONLY,
    )

    assert (result.returncode, result.stdout) == (0, "shared-1: RUNNING on dut=board-1\n")
    assert principal_of(live_server, "shared-1") == "old@lab.test"


def test_a_broken_file_stops_the_command_with_one_line_naming_the_key(tmp_path):
    config = tmp_path / "mediator" / "client.toml"
    config.parent.mkdir()
    config.write_text('[profiles.lab]\nurl = "http://x.test"\ntokn = "t"\n')

    result = mediator(None, "runs", XDG_CONFIG_HOME=str(tmp_path), **FILE_ONLY)

    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"mediator: {config}: profiles.lab.tokn: unknown key (principal, token, token_file, url)\n"
    )


def test_a_token_other_users_may_read_is_used_with_a_warning(tmp_path, live_server):
    config = write_profiles(tmp_path, live_server)
    (tmp_path / "lab.token").chmod(0o644)

    result = mediator(None, "runs", XDG_CONFIG_HOME=str(tmp_path), **FILE_ONLY)

    token_file = tmp_path / "lab.token"
    assert (result.returncode, result.stdout) == (0, "no runs\n")
    assert result.stderr == (
        f"warning: {token_file} holds a token and other users may read it "
        f"(chmod 600 {token_file})\n"
    )
    assert config.exists()


def test_profiles_shows_the_profiles_and_where_each_setting_comes_from(tmp_path, live_server):
    away = closed_url()
    config = write_profiles(tmp_path, live_server, away=away)
    env = {"XDG_CONFIG_HOME": str(tmp_path), **FILE_ONLY}

    shown = mediator(None, "profiles", **(env | {"MEDIATOR_CLIENT_URL": "http://env.test:1"}))
    as_json = mediator(None, "profiles", "--profile", "away", "--json", **env)

    lines = shown.stdout.splitlines()
    assert shown.returncode == 0, shown.stderr
    assert lines[0] == f"file       {config}"
    assert lines[2].split() == ["PROFILE", "URL", "TOKEN", "PRINCIPAL"]
    assert lines[3].split() == ["away", away, "set", "-"]
    assert lines[4].split() == ["*lab", "(default)", live_server.url, "file", "profile@lab.test"]
    assert lines[6:] == [
        "url        http://env.test:1  (from MEDIATOR_CLIENT_URL)",
        f"token      set  (from {config}: profiles.lab.token_file ({tmp_path / 'lab.token'}))",
        f"principal  profile@lab.test  (from {config}: profiles.lab.principal)",
    ]
    doc = json.loads(as_json.stdout)
    assert doc["profile"] == "away"
    assert doc["profiles"]["away"]["token"] == "set"  # never the token itself
    assert TOKEN not in as_json.stdout and "away-token" not in as_json.stdout
    assert doc["using"]["token"] == {"set": True, "from": f"{config}: profiles.away.token"}
