"""Where the client commands take the Mediator's URL, their token and their principal from: the
command line, then the client's own variables, then the older shared ones, then the profile of the
client configuration file, then the defaults; every mistake in the file one line naming the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.client.settings import DEFAULT_URL, SettingsError, config_path, read_profiles, resolve

PROFILES = """
default = "lab"

[profiles.lab]
url = "http://lab.test:8080"
token_file = "{token_file}"
principal = "profile@lab.test"

[profiles.home]
url = "http://home.test:8080"
token = "home-token"
"""


@pytest.fixture
def config(tmp_path: Path) -> dict[str, str]:
    token_file = tmp_path / "lab.token"
    token_file.write_text("lab-token\n")
    token_file.chmod(0o600)
    path = tmp_path / "client.toml"
    path.write_text(PROFILES.format(token_file=token_file))
    path.chmod(0o600)
    return {"MEDIATOR_CLIENT_CONFIG": str(path)}


NONE = {"url": None, "token": None, "principal": None}


def test_the_default_profile_gives_what_nothing_else_gives(config):
    found = resolve(NONE, config)

    assert (found.url, found.token, found.principal) == (
        "http://lab.test:8080",
        "lab-token",
        "profile@lab.test",
    )
    assert found.profile == "lab" and found.warnings == ()


def test_the_command_line_wins_over_the_variables_which_win_over_the_profile(config):
    env = config | {
        "MEDIATOR_CLIENT_URL": "http://client-env.test",
        "MEDIATOR_URL": "http://shared-env.test",
        "MEDIATOR_TOKEN": "shared-token",
        "MEDIATOR_PRINCIPAL": "shared@lab.test",
    }

    found = resolve({"url": None, "token": None, "principal": "cli@lab.test"}, env)

    assert (found.url, found.token, found.principal) == (
        "http://client-env.test",
        "shared-token",
        "cli@lab.test",
    )
    assert dict(found.sources) == {
        "url": "MEDIATOR_CLIENT_URL",
        "token": "MEDIATOR_TOKEN",
        "principal": "--principal",
    }


def test_profile_chosen_by_option_then_by_variable_then_by_default(config):
    assert resolve(NONE, config, "home").url == "http://home.test:8080"
    by_variable = config | {"MEDIATOR_CLIENT_PROFILE": "home"}
    assert resolve(NONE, by_variable).token == "home-token"
    assert resolve(NONE, by_variable, "lab").token == "lab-token"


def test_no_file_and_nothing_given_is_the_defaults(tmp_path):
    found = resolve(NONE, {"XDG_CONFIG_HOME": str(tmp_path)})

    assert (found.url, found.token, found.principal, found.profile) == (
        DEFAULT_URL,
        None,
        None,
        None,
    )


def test_the_file_is_under_xdg_config_home_else_under_home(tmp_path):
    assert config_path({"XDG_CONFIG_HOME": "/x", "HOME": "/h"}) == Path("/x/mediator/client.toml")
    # A relative XDG_CONFIG_HOME is invalid by the XDG specification and ignored.
    assert config_path({"XDG_CONFIG_HOME": "rel", "HOME": "/h"}) == Path(
        "/h/.config/mediator/client.toml"
    )
    assert config_path({"MEDIATOR_CLIENT_CONFIG": "/etc/c.toml", "XDG_CONFIG_HOME": "/x"}) == Path(
        "/etc/c.toml"
    )


def test_a_token_file_other_users_may_read_is_a_warning(config, tmp_path):
    (tmp_path / "lab.token").chmod(0o644)

    found = resolve(NONE, config)

    assert found.token == "lab-token"
    assert found.warnings == (
        f"{tmp_path / 'lab.token'} holds a token and other users may read it "
        f"(chmod 600 {tmp_path / 'lab.token'})",
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('[profiles.lab]\nurl = "x:1"\n', "profiles.lab.url: must be an http:// or https:// URL"),
        ('[profiles.lab]\ntokn = "t"\n', "profiles.lab.tokn: unknown key"),
        (
            '[profiles.lab]\ntoken = "t"\ntoken_file = "f"\n',
            "profiles.lab: token and token_file: give one of them",
        ),
        ('default = "nope"\n[profiles.lab]\n', "default: no profile 'nope'"),
        ("[profiles.lab\n", "not valid TOML"),
        ('profile = "lab"\n', "profile: unknown key (default, profiles)"),
        ("[profiles.lab]\nprincipal = 7\n", "profiles.lab.principal: must be a non-empty string"),
        ('[profiles.lab]\ntoken_file = "/nonexistent/t"\n', "profiles.lab.token_file: cannot"),
    ],
)
def test_a_mistake_in_the_file_is_one_line_naming_the_file_and_the_key(tmp_path, text, reason):
    path = tmp_path / "client.toml"
    path.write_text(text)

    with pytest.raises(SettingsError) as err:
        resolve(NONE, {"MEDIATOR_CLIENT_CONFIG": str(path)}, "lab")

    assert str(err.value).startswith(f"{path}: ") and reason in str(err.value)
    assert "\n" not in str(err.value)


def test_an_unknown_profile_names_the_ones_there_are(config):
    with pytest.raises(SettingsError) as err:
        resolve(NONE, config, "work")

    assert str(err.value) == (
        f"--profile: no profile 'work' in {config['MEDIATOR_CLIENT_CONFIG']} "
        "(its profiles: home, lab)"
    )


def test_everything_given_elsewhere_reads_no_file(tmp_path):
    path = tmp_path / "client.toml"
    path.write_text("not toml [")
    env = {"MEDIATOR_CLIENT_CONFIG": str(path), "MEDIATOR_CLIENT_TOKEN": "t"}

    found = resolve({"url": "http://a.test", "token": None, "principal": "p@a.test"}, env)

    assert (found.url, found.token, found.principal) == ("http://a.test", "t", "p@a.test")


@pytest.mark.parametrize("page", ["docs/client.md", "README.md"])
def test_the_documented_client_files_are_valid(tmp_path, page):
    text = (Path(__file__).resolve().parents[2] / page).read_text(encoding="utf-8")
    blocks = re.findall(r"^```toml\n(.*?)^```", text, re.S | re.M)
    assert blocks, f"{page} shows no client.toml"
    for n, block in enumerate(blocks):
        path = tmp_path / f"client-{n}.toml"
        path.write_text(block)
        profiles, default = read_profiles(path)
        assert default in profiles
