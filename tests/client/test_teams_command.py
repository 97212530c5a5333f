"""``mediator teams`` against a real gunicorn (docs/client.md, docs/teams.md): one line per team
of GET /v1/teams, then each team's usage in each hour of the last day (GET /v1/teams/usage) as a
sparkline, one character an hour, the current hour last; ``--json`` for scripts. And the
sparkline's scale, as a pure rendering of the usage answer."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from app.client.render import SPARKS, sparklines
from app.config import to_libpq_url
from app.services.reaper import reap_pass
from tests.client.cli import mediator
from tests.support.actors import Submitter, cap
from tests.support.agent import advertise
from tests.support.apps import app_on
from tests.support.contracts import contract

one_server_per_module = True

TEAMS = [{"name": "kernel", "weight": 2, "max_nodes": 4}, {"name": "qa", "max_queued": 10}]
live_server_env = {"MEDIATOR_TEAMS": json.dumps(TEAMS)}


def charged(server: Any, tmp_path: Any, seconds: int) -> None:
    """The reaper's pass after the leases were last charged ``seconds`` ago."""
    url = server.env["MEDIATOR_DATABASE_URL"]
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
        conn.execute(
            "update leases set charged_until = now() - make_interval(secs => %s)", (seconds,)
        )
    with app_on(url, tmp_path / "records", teams=TEAMS) as app:
        reap_pass(app.extensions["mediator"])


@pytest.mark.slow
def test_teams_prints_a_line_per_team_and_a_sparkline_with_the_charged_hour_full(
    live_server, tmp_path
):
    advertise(live_server, "board-1", cap("board"))
    # The legacy token is an operator: it may name any team.
    Submitter(live_server).submitted(contract("k1", queue={"team": "kernel"}), 201)
    charged(live_server, tmp_path, 100)

    result = mediator(live_server, "teams")

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "TEAM", "WEIGHT", "SHARE", "USAGE", "FACTOR", "RUNNING", "QUEUED", "MAX", "NODES", "MAX",
        "QUEUED",
    ]  # fmt: skip
    rows = {line.split()[0]: line.split() for line in lines[1:4]}
    assert list(rows) == ["default", "kernel", "qa"]
    kernel = rows["kernel"]
    assert kernel[:4] == ["kernel", "2", "100%", "100%"]
    assert 0 < float(kernel[4]) < 1 / 3600  # its share over its usage and its running charge
    assert kernel[5:] == ["1", "0", "4", "-"]
    assert rows["qa"] == ["qa", "1", "-", "-", "-", "0", "0", "-", "10"]
    assert lines[4] == ""
    assert lines[5].startswith("usage by hour, ") and " node-seconds)" in lines[5]
    sparks = {}
    for line in lines[6:]:
        team, _, spark = line.partition("  |")
        sparks[team.strip()] = spark
    assert list(sparks) == ["default", "kernel", "qa"]
    assert sparks["kernel"] == " " * 23 + "█|"  # only the current hour, the largest
    assert sparks["qa"] == sparks["default"] == " " * 24 + "|"


@pytest.mark.slow
def test_teams_json_prints_the_teams_answer_with_the_usage_answer(live_server):
    result = mediator(live_server, "teams", "--json")

    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) == {"observed_at", "teams", "usage"}
    assert [t["name"] for t in doc["teams"]] == ["default", "kernel", "qa"]
    assert set(doc["usage"]) == {"observed_at", "hours"} and doc["usage"]["hours"] == []


# ------------------------------------------------------------------ the sparkline, pure

USAGE = {
    "observed_at": "2026-12-07T10:20:00Z",
    "hours": [
        {"hour": "2026-12-06T10:00:00Z", "node_seconds": {"qa": 90.0}},  # out of the day
        {"hour": "2026-12-06T11:00:00Z", "node_seconds": {"kernel": 800.0}},
        {"hour": "2026-12-07T09:00:00Z", "node_seconds": {"kernel": 100.0, "qa": 400.0}},
        {"hour": "2026-12-07T10:00:00Z", "node_seconds": {"qa": 1.0}},
    ],
}


def test_a_sparkline_has_an_hour_a_character_scaled_to_the_largest_hour_of_any_team():
    text = sparklines(USAGE, ["kernel", "qa"])

    head, kernel, qa = text.splitlines()
    assert head == "usage by hour, 2026-12-06 11:00 to 10:00 UTC (█ = 800 node-seconds)"
    assert kernel == "kernel  |█" + " " * 21 + "▁ |"
    # 400 of 800 is four eighths; 1 of 800 still shows as the lowest bar.
    assert qa == "qa      |" + " " * 22 + "▄▁|"
    assert SPARKS[0] == " " and SPARKS[8] == "█"


def test_a_sparkline_of_no_usage_is_blank_and_says_nothing_was_charged():
    text = sparklines({"observed_at": "2026-12-07T10:20:00Z", "hours": []}, ["kernel"])

    assert text.splitlines() == [
        "usage by hour, 2026-12-06 11:00 to 10:00 UTC: nothing charged",
        "kernel  |" + " " * 24 + "|",
    ]
