"""GET /v1/teams/usage (docs/teams.md, "Where the team shows"): the node-seconds the reaper
charged to each team in each hour of the last day, oldest hour first, hours with nothing charged
absent; any token, no query parameters."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from app.services.reaper import reap_pass
from app.wire import parse_ts
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.contracts import contract
from tests.support.tokens import sha256_entry, token_client

one_app_per_module = True

SECRETS = {"kern": "s3cret-kern", "qa": "s3cret-qa", "reader": "s3cret-reader"}
ENTRIES = [
    sha256_entry("kern", SECRETS["kern"], "submitter", team="kernel"),
    sha256_entry("qa", SECRETS["qa"], "submitter", team="qa"),
    sha256_entry("reader", SECRETS["reader"], "reader"),
]
TEAMS = [{"name": "kernel", "weight": 2}, {"name": "qa"}]


@pytest.fixture(scope="module")
def module_config() -> dict[str, Any]:
    return {"tokens": ENTRIES, "teams": TEAMS}


def usage(app: Any) -> dict[str, Any]:
    resp = token_client(app, SECRETS["reader"]).get("/v1/teams/usage")
    assert resp.status_code == 200, resp.get_json()
    body: dict[str, Any] = resp.get_json()
    return body


def placed(app: Any, token: str, run_id: str) -> None:
    resp = token_client(app, SECRETS[token]).post("/v1/runs", json=contract(run_id))
    assert resp.status_code == 201, resp.get_json()


def test_teams_usage_has_no_hour_before_anything_is_charged(app):
    body = usage(app)
    assert set(body) == {"observed_at", "hours"}
    assert body["hours"] == []
    parse_ts(body["observed_at"])  # an RFC 3339 time


def test_teams_usage_shows_the_node_seconds_the_reaper_charged_in_the_current_hour(
    app, ctx, client, sql
):
    advertise(client, "n1", cap("board"))
    placed(app, "kern", "k1")
    sql.execute("update leases set charged_until = now() - interval '100 seconds'")
    reap_pass(ctx)

    body = usage(app)

    [only] = body["hours"]
    assert set(only) == {"hour", "node_seconds"}
    assert list(only["node_seconds"]) == ["kernel"]
    assert 100 <= only["node_seconds"]["kernel"] < 200
    (stored,) = sql.execute("select hour from team_usage_hours").fetchone()
    assert parse_ts(only["hour"]) == stored
    current = parse_ts(body["observed_at"]).replace(minute=0, second=0, microsecond=0)
    assert parse_ts(only["hour"]) == current


def test_teams_usage_lists_the_hours_of_the_last_day_oldest_first_by_team(app, ctx, client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    placed(app, "kern", "k1")
    placed(app, "qa", "q1")
    sql.execute("update leases set charged_until = now() - interval '100 seconds'")
    reap_pass(ctx)
    # Earlier hours as the reaper leaves them; the one of two days ago is out of the day.
    sql.execute(
        "insert into team_usage_hours (team, hour, node_seconds) values"
        " ('qa', date_trunc('hour', now()) - interval '23 hours', 50),"
        " ('kernel', date_trunc('hour', now()) - interval '5 hours', 70),"
        " ('kernel', date_trunc('hour', now()) - interval '24 hours', 90)"
    )

    body = usage(app)

    current = parse_ts(body["observed_at"]).replace(minute=0, second=0, microsecond=0)
    hours = [(parse_ts(h["hour"]), h["node_seconds"]) for h in body["hours"]]
    assert [at for at, _ in hours] == [
        current - timedelta(hours=23),
        current - timedelta(hours=5),
        current,
    ]
    assert hours[0][1] == {"qa": 50.0}
    assert hours[1][1] == {"kernel": 70.0}
    assert set(hours[2][1]) == {"kernel", "qa"}
    assert all(100 <= v < 200 for v in hours[2][1].values())


def test_teams_usage_takes_no_query_parameters(app):
    resp = token_client(app, SECRETS["reader"]).get("/v1/teams/usage?team=kernel")
    assert resp.status_code == 400
    assert resp.get_json() == {
        "error": {
            "code": 400,
            "reason": "GET /v1/teams/usage takes no query parameters, got 'team'",
        }
    }


def test_teams_usage_without_a_token_is_401(app):
    resp = token_client(app, None).get("/v1/teams/usage")
    assert resp.status_code == 401
    assert resp.get_json() == {"error": {"code": 401, "reason": "missing or invalid token"}}


def test_teams_usage_is_documented_in_the_openapi_document(app):
    doc = token_client(app, None).get("/v1/openapi.json").get_json()
    op = doc["paths"]["/v1/teams/usage"]["get"]
    assert op["security"] == [{"bearer": []}]
    schema = op["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/TeamUsage"}
    assert {"400", "401", "403", "503"} <= set(op["responses"])
