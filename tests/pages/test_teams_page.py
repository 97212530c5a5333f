"""The teams page (docs/pages.md, "Teams"): the table of GET /v1/teams and the last day's usage of
GET /v1/teams/usage as stacked bars in an inline SVG drawn on the server, one ``<rect>`` with its
``<title>`` per team and hour charged, colours by the team's place in the sorted list; a line
saying so when nothing was charged; the same sign-in and roles as the API's route."""

from __future__ import annotations

import re
from datetime import UTC, timedelta
from html import unescape
from typing import Any

import pytest

from app.services.reaper import reap_pass
from app.teamchart import PALETTE
from app.wire import ts
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import client_of
from tests.support.contracts import contract
from tests.support.pages import PageUser
from tests.support.submitter import submit
from tests.support.tokens import ENTRIES, SECRETS

one_app_per_module = True

TEAMS = [
    {"name": "kernel", "weight": 2, "max_nodes": 4},
    {"name": "qa", "max_queued": 10},
]
SEGMENT = re.compile(r'<rect class="segment" ([^>]*)><title>([^<]*)</title></rect>')


@pytest.fixture(scope="module")
def module_config() -> dict[str, Any]:
    return {"tokens": ENTRIES, "teams": TEAMS}


def page(app: Any, who: str = "reader") -> str:
    return PageUser(app).signed_in(SECRETS[who]).page("/teams")


def chart_of(html: str) -> str:
    """The usage chart's ``<svg>`` element, whole."""
    found = re.search(r'<svg class="usage-chart".*?</svg>', html, re.S)
    assert found, "the page has no usage chart"
    return found.group(0)


def segments(chart: str) -> dict[tuple[str, str], dict[str, str]]:
    """The chart's bars by (team, hour): their attributes and their ``<title>``."""
    out = {}
    for attrs, title in SEGMENT.findall(chart):
        bar = dict(re.findall(r'([a-z-]+)="([^"]*)"', attrs)) | {"title": unescape(title)}
        out[(bar["data-team"], bar["data-hour"])] = bar
    return out


def team_rows(html: str) -> dict[str, list[str]]:
    """Each row of the teams table: its cells' text, by team."""
    out = {}
    for team, cells in re.findall(r'<tr class="team" data-team="([^"]+)">(.*?)</tr>', html, re.S):
        out[team] = [
            unescape(re.sub(r"<[^>]+>", "", c)).strip()
            for c in re.findall(r"<td>(.*?)</td>", cells, re.S)
        ]
    return out


def run_of(app: Any, run_id: str, team: str) -> None:
    """A run of ``team`` placed on a board (the legacy token is an operator: it names any team)."""
    submit(client_of(app), contract(run_id, queue={"team": team}), 201)


def test_the_teams_page_lists_the_teams_of_get_v1_teams(app) -> None:
    advertise(client_of(app), "n1", cap("board"))
    run_of(app, "k1", "kernel")
    user = PageUser(app).signed_in(SECRETS["reader"])
    resp = user.get("/teams")
    assert resp.status_code == 200
    assert "frame-ancestors 'none'" in resp.headers["Content-Security-Policy"]
    rows = team_rows(resp.text)
    assert list(rows) == ["default", "kernel", "qa"]
    # name, weight, share, usage, factor, running nodes, queued, max nodes, max queued
    kernel = rows["kernel"]
    assert kernel[:4] == ["kernel", "2", "100%", "0%"]
    assert float(kernel[4]) == pytest.approx(1.0 / 3600, rel=0.01)
    assert kernel[5:] == ["1", "0", "4", "-"]
    assert rows["qa"] == ["qa", "1", "-", "-", "-", "0", "0", "-", "10"]
    assert 'href="/teams"' in resp.text  # the navigation's link


def test_the_teams_page_draws_one_bar_per_team_and_hour_charged(app, ctx, sql) -> None:
    api = client_of(app)
    advertise(api, "n1", cap("board"))
    advertise(api, "n2", cap("board"))
    run_of(app, "k1", "kernel")
    run_of(app, "q1", "qa")
    sql.execute("update leases set charged_until = now() - interval '100 seconds'")
    reap_pass(ctx)
    sql.execute(
        "insert into team_usage_hours (team, hour, node_seconds) values"
        " ('qa', date_trunc('hour', now()) - interval '3 hours', 50)"
    )
    (now_hour,) = sql.execute("select date_trunc('hour', now())").fetchone()
    earlier = now_hour - timedelta(hours=3)

    html = page(app)

    chart = chart_of(html)
    bars = segments(chart)
    assert chart.count("<rect") == chart.count("<title>") == len(bars) == 3
    assert set(bars) == {("kernel", ts(now_hour)), ("qa", ts(now_hour)), ("qa", ts(earlier))}
    assert bars[("qa", ts(earlier))]["title"] == (
        f"qa, {earlier.astimezone(UTC):%Y-%m-%d %H}:00Z: 50.0 node-seconds"
    )
    for team in ("kernel", "qa"):
        title = bars[(team, ts(now_hour))]["title"]
        head, _, seconds = title.partition(": ")
        assert head == f"{team}, {now_hour.astimezone(UTC):%Y-%m-%d %H}:00Z"
        assert 100 <= float(seconds.removesuffix(" node-seconds")) < 200
    # Stacked in the team list's order: qa's part sits on kernel's in the same column.
    kernel, qa = bars[("kernel", ts(now_hour))], bars[("qa", ts(now_hour))]
    assert kernel["x"] == qa["x"]
    assert float(qa["y"]) + float(qa["height"]) == pytest.approx(float(kernel["y"]), abs=0.2)
    assert float(kernel["y"]) + float(kernel["height"]) == pytest.approx(100, abs=0.2)
    # Colours by the place in the sorted team list (default, kernel, qa), the legend's the same.
    assert {team: bar["fill"] for (team, _), bar in bars.items()} == {
        "kernel": PALETTE[1],
        "qa": PALETTE[2],
    }
    legend = dict(re.findall(r'<li data-team="([^"]+)">.*?fill="([^"]+)"', html))
    assert legend == {"default": PALETTE[0], "kernel": PALETTE[1], "qa": PALETTE[2]}
    assert "No usage in the last day." not in html


def test_the_teams_page_says_when_nothing_was_charged_in_the_last_day(app) -> None:
    html = page(app)
    chart = chart_of(html)
    assert 'width="480" height="120"' in chart
    assert "<rect" not in chart
    assert '<p class="empty" id="no-usage">No usage in the last day.</p>' in html


def test_the_teams_page_sends_a_browser_without_a_session_to_the_sign_in(app) -> None:
    resp = PageUser(app).get("/teams")
    assert resp.status_code == 303
    assert resp.headers["Location"] == "/signin?next=/teams"


def test_every_token_may_see_the_teams_page_as_it_may_call_get_v1_teams(app) -> None:
    for who in ("node-n1", "submitter", "answerer"):
        assert "<h1>Teams</h1>" in page(app, who), who
