"""Teams in the configuration (docs/teams.md): validated at start-up, ``default`` always there,
``health`` refused, tokens naming only configured teams; and who belongs to which."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.config import load_config
from app.context import Caller
from app.errors import BadRequest, ConfigError, Forbidden
from app.services.teams import choose_team
from app.teams import Team, Teams, parse_teams
from tests.support.tokens import sha256_entry


def teams_of(*entries: dict[str, Any]) -> Teams:
    return Teams(parse_teams("teams", list(entries)))


def caller(
    name: str = "t",
    *,
    roles: tuple[str, ...] = ("submitter",),
    principal: str | None = None,
    declared: bool = True,
    vouches: bool = False,
    team: str | None = None,
    teams: tuple[str, ...] = (),
) -> Caller:
    return Caller(
        token_name=name,
        roles=frozenset(roles),
        principal=principal,
        principal_declared=declared,
        vouches=vouches,
        team=team,
        teams=frozenset(teams),
    )


def test_without_teams_there_is_default_alone_with_weight_one_and_no_limits():
    teams = Teams.from_config(load_config(env={}))
    assert teams.names == ["default"]
    assert teams.get("default") == Team("default", 1, None, None, ())


def test_a_configured_default_replaces_the_one_that_always_exists():
    teams = teams_of({"name": "default", "weight": 3, "max_nodes": 2})
    assert teams.get("default") == Team("default", 3, 2, None, ())


def test_teams_come_from_mediator_teams_as_json():
    cfg = load_config(env={"MEDIATOR_TEAMS": json.dumps([{"name": "kernel", "weight": 2}])})
    assert Teams.from_config(cfg).names == ["default", "kernel"]
    assert Teams.from_config(cfg).get("kernel") == Team("kernel", 2)


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ({"name": "health"}, "teams[0].name: 'health' is the Mediator's own team"),
        ({"name": ""}, "teams[0].name: must be 1-63 characters of [A-Za-z0-9._-]"),
        ({"name": "-x"}, "teams[0].name: must be 1-63 characters"),
        ({"name": "a b"}, "teams[0].name: must be 1-63 characters"),
        ({"name": "x" * 64}, "teams[0].name: must be 1-63 characters"),
        ({"name": "k", "weight": 0}, "teams[0].weight: must be a number greater than 0"),
        ({"name": "k", "weight": -1}, "teams[0].weight: must be a number greater than 0"),
        ({"name": "k", "weight": True}, "teams[0].weight: must be a number greater than 0"),
        ({"name": "k", "weight": "2"}, "teams[0].weight: must be a number greater than 0"),
        ({"name": "k", "max_nodes": 0}, "teams[0].max_nodes: must be an integer of at least 1"),
        ({"name": "k", "max_nodes": 1.5}, "teams[0].max_nodes: must be an integer of at least 1"),
        ({"name": "k", "max_queued": 0}, "teams[0].max_queued: must be an integer of at least 1"),
        ({"name": "k", "members": "qa-bot"}, "teams[0].members: must be a list"),
        ({"name": "k", "members": [""]}, "teams[0].members: each entry is a text of 1-200"),
        ({"name": "k", "quota": 1}, "teams[0].quota: unknown field"),
    ],
)
def test_a_wrong_team_entry_stops_the_start_naming_its_field(entry, reason):
    with pytest.raises(ConfigError) as err:
        load_config(env={}, overrides={"teams": [entry]})
    assert str(err.value).startswith(reason), str(err.value)


def test_two_teams_of_one_name_stop_the_start():
    with pytest.raises(ConfigError, match=r"teams\[1\].name: 'qa' is the name of an earlier team"):
        load_config(env={}, overrides={"teams": [{"name": "qa"}, {"name": "qa"}]})


def test_health_is_refused_from_mediator_teams_too():
    with pytest.raises(ConfigError, match="'health' is the Mediator's own team"):
        load_config(env={"MEDIATOR_TEAMS": '[{"name": "health"}]'})


@pytest.mark.parametrize(
    "fields",
    [{"team": "kernel"}, {"teams": ["qa", "kernel"]}, {"team": "health"}],
)
def test_start_up_refuses_a_token_naming_an_unconfigured_team(fields):
    token = sha256_entry("kern", "s3cret-kern", "submitter", **fields)
    with pytest.raises(ConfigError, match="token 'kern' names team '(kernel|health)'"):
        load_config(env={}, overrides={"tokens": [token], "teams": [{"name": "qa"}]})


def test_a_token_may_name_configured_teams_and_default():
    token = sha256_entry("kern", "s3cret-kern", "submitter", team="kernel", teams=["default"])
    cfg = load_config(env={}, overrides={"tokens": [token], "teams": [{"name": "kernel"}]})
    [parsed] = cfg["tokens"]
    assert (parsed.team, parsed.teams) == ("kernel", frozenset({"default"}))


def test_a_token_team_that_is_not_a_team_name_is_refused_naming_its_field():
    token = sha256_entry("kern", "s3cret-kern", "submitter", team="a b")
    with pytest.raises(ConfigError, match=r"tokens\[0\].team: a team name is"):
        load_config(env={}, overrides={"tokens": [token]})


TEAMS = teams_of(
    {"name": "kernel", "weight": 2},
    {"name": "release"},
    {"name": "qa", "members": ["qa-bot"]},
    {"name": "ai", "members": ["*@ai.example.com"]},
)


def test_queue_team_that_is_not_configured_is_400_and_health_is_unknown():
    for name in ("nope", "health"):
        with pytest.raises(BadRequest) as err:
            choose_team(TEAMS, caller(team="kernel"), name)
        assert err.value.reason == f'unknown team: "{name}"'


def test_queue_team_the_token_may_not_name_is_403():
    with pytest.raises(Forbidden) as err:
        choose_team(TEAMS, caller(team="kernel", teams=("release",)), "qa")
    assert err.value.reason == 'this token may not name team "qa"'


def test_queue_team_is_the_token_team_or_one_of_its_teams_or_any_for_an_operator():
    kern = caller(team="kernel", teams=("release",))
    assert choose_team(TEAMS, kern, "kernel") == "kernel"
    assert choose_team(TEAMS, kern, "release") == "release"
    assert choose_team(TEAMS, caller(roles=("operator",)), "qa") == "qa"


def test_without_queue_team_the_token_team_wins_over_membership():
    assert choose_team(TEAMS, caller("qa-bot", team="kernel"), None) == "kernel"


def test_members_by_token_name_select_the_first_such_team():
    assert choose_team(TEAMS, caller("qa-bot"), None) == "qa"


def test_a_glob_selects_a_vouched_principal_but_never_a_self_declared_one():
    bound = caller(principal="Bob@AI.example.com", declared=False)
    bridged = caller(principal="bob@ai.example.com", vouches=True)
    declared = caller(principal="bob@ai.example.com")
    assert choose_team(TEAMS, bound, None) == "ai"
    assert choose_team(TEAMS, bridged, None) == "ai"
    assert choose_team(TEAMS, declared, None) == "default"


def test_otherwise_a_run_is_default():
    assert choose_team(TEAMS, caller("someone", principal="x@else.example.com"), None) == "default"


def test_a_member_with_a_glob_character_is_never_a_token_name():
    teams = teams_of({"name": "qa", "members": ["qa@bot"]})
    assert choose_team(teams, caller("qa@bot"), None) == "default"


def test_metric_labels_are_bounded_by_the_configured_names_default_health_and_other():
    assert [TEAMS.label(n) for n in ("kernel", "default", "health", "gone")] == [
        "kernel",
        "default",
        "health",
        "other",
    ]
