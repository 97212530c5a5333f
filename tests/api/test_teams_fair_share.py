"""Fair share among teams and their quotas (docs/teams.md, "Fair share", "Quotas"): the order a
release hands a board to, usage charged by the reaper alone, work conservation, max_nodes at
submit, promotion, acquire and dry-run, and what a queued run's view shows of its team."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from app.estimate import duration_key
from app.services.queue import wake_queued
from app.services.reaper import reap_pass
from tests.support.actors import cap
from tests.support.agent import advertise, claimed
from tests.support.concurrency import states
from tests.support.contracts import contract, probing_run, role
from tests.support.tokens import sha256_entry, token_client

one_app_per_module = True

SECRETS = {
    "kern": "s3cret-kern",
    "qa": "s3cret-qa",
    "cap": "s3cret-cap",
    "reader": "s3cret-reader",
}
ENTRIES = [
    sha256_entry("kern", SECRETS["kern"], "submitter", team="kernel"),
    sha256_entry("qa", SECRETS["qa"], "submitter", team="qa"),
    sha256_entry("cap", SECRETS["cap"], "submitter", team="capped"),
    sha256_entry("reader", SECRETS["reader"], "reader"),
]
TEAMS = [
    {"name": "kernel", "weight": 1},
    {"name": "qa", "weight": 1},
    {"name": "capped", "max_nodes": 1},
]


@pytest.fixture(scope="module")
def module_config() -> dict[str, Any]:
    # No reservations: the order of the ordinary pass alone is under test.
    return {"tokens": ENTRIES, "teams": TEAMS, "queue.reserve_after_seconds": 0}


def as_token(app: Any, name: str) -> Any:
    return token_client(app, SECRETS[name])


def post(app: Any, token: str, doc: dict[str, Any], expected: int) -> dict[str, Any]:
    resp = as_token(app, token).post("/v1/runs", json=doc)
    assert resp.status_code == expected, resp.get_json()
    body: dict[str, Any] = resp.get_json()
    return body


def cancel(app: Any, token: str, run_id: str) -> None:
    resp = as_token(app, token).post(f"/v1/runs/{run_id}/cancel", json={})
    assert resp.status_code == 200, resp.get_json()


def leases_of(sql: Any, team: str) -> int:
    return sql.execute("select count(*) from leases where team = %s", (team,)).fetchone()[0]


# ---------------------------------------------------------------- the order of a release


def test_a_freed_board_goes_to_the_team_furthest_below_its_share(app, client, sql):
    """kernel holds both boards and has three older runs queued; qa's one run arrived last. A
    release goes to qa (kernel holds a node, so its factor is finite; qa has spent nothing), and
    the next release to kernel's oldest."""
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    post(app, "kern", contract("h1"), 201)
    post(app, "kern", contract("h2"), 201)
    for run_id in ("k1", "k2", "k3"):
        post(app, "kern", contract(run_id), 202)
    queued = post(app, "qa", contract("q1"), 202)
    assert queued["team"] == "qa"
    # Its place is in scan order: qa (nothing spent) before kernel (holding both boards).
    assert queued["queue"] == {"position": 1, "ahead": 0}
    reader = as_token(app, "reader")
    assert reader.get("/v1/runs/k1").get_json()["queue"] == {"position": 2, "ahead": 1}
    assert reader.get("/v1/runs/k3").get_json()["queue"] == {"position": 4, "ahead": 3}
    assert reader.get("/v1/runs/k1").get_json()["share"]["factor"] == pytest.approx(
        0.5 / (2 * 3600)
    )
    # Queue order alone would place k1 first; qa's share says q1.
    cancel(app, "kern", "h1")
    assert states(sql, ["k1", "q1"]) == {"k1": "QUEUED", "q1": "RUNNING"}
    assert leases_of(sql, "qa") == 1
    # Now each team holds one board: equal weights, equal holdings, equal (zero) usage: age.
    cancel(app, "kern", "h2")
    assert states(sql, ["k1", "k2", "k3"]) == {"k1": "RUNNING", "k2": "QUEUED", "k3": "QUEUED"}


def test_without_a_fitting_run_of_the_favoured_team_the_board_is_not_left_idle(app, client, sql):
    """Work-conserving: qa is below its share but its queued run needs a scope; kernel's run
    that fits the freed board takes it."""
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    post(app, "kern", contract("h1"), 201)
    post(app, "qa", contract("hs", role("s", "scope")), 201)
    post(app, "qa", contract("q1", role("s", "scope")), 202)
    post(app, "kern", contract("k1"), 202)
    cancel(app, "kern", "h1")
    assert states(sql, ["k1", "q1"]) == {"k1": "RUNNING", "q1": "QUEUED"}


# ---------------------------------------------------------------- usage, by the reaper alone


def test_usage_is_charged_by_the_reaper_and_by_the_end_of_a_lease(app, ctx, client, sql):
    advertise(client, "n1", cap("board"))
    post(app, "kern", contract("h1"), 201)
    sql.execute("update leases set charged_until = now() - interval '100 seconds'")
    assert sql.execute("select count(*) from team_usage").fetchone() == (0,)
    reap_pass(ctx)
    (charged,) = sql.execute(
        "select sum(node_seconds) from team_usage where team = 'kernel'"
    ).fetchone()
    assert 100 <= charged < 200
    (moved,) = sql.execute(
        "select charged_until > now() - interval '50 seconds' from leases"
    ).fetchone()
    assert moved is True
    # The lease's end leaves its uncharged time as a usage_ended row, which the next pass folds.
    sql.execute("update leases set charged_until = now() - interval '30 seconds'")
    cancel(app, "kern", "h1")
    ended = sql.execute("select team, node_seconds from usage_ended").fetchall()
    assert [team for team, _ in ended] == ["kernel"] and 30 <= ended[0][1] < 100
    reap_pass(ctx)
    assert sql.execute("select count(*) from usage_ended").fetchone() == (0,)
    (after,) = sql.execute(
        "select sum(node_seconds) from team_usage where team = 'kernel'"
    ).fetchone()
    assert after >= charged + 30
    hours = sql.execute("select team, node_seconds from team_usage_hours").fetchall()
    assert [team for team, _ in hours] == ["kernel"] and hours[0][1] >= 130


def test_a_team_with_usage_comes_after_a_team_without(app, ctx, client, sql):
    """Usage, not only holdings: kernel spent board time earlier (charged by the reaper); with
    nothing held by either team, a freed board goes to qa although kernel's run is older."""
    advertise(client, "n1", cap("board"))
    post(app, "kern", contract("h1"), 201)
    sql.execute("update leases set charged_until = now() - interval '600 seconds'")
    reap_pass(ctx)
    post(app, "kern", contract("k1"), 202)
    post(app, "qa", contract("q1"), 202)
    cancel(app, "kern", "h1")
    assert states(sql, ["k1", "q1"]) == {"k1": "QUEUED", "q1": "RUNNING"}
    teams = {t["name"]: t for t in as_token(app, "reader").get("/v1/teams").get_json()["teams"]}
    assert teams["kernel"]["usage"] == pytest.approx(1.0)
    assert teams["qa"]["usage"] == pytest.approx(0.0)
    assert teams["kernel"]["factor"] == pytest.approx(0.5 / teams_usage(sql, "kernel"), rel=0.01)


def teams_usage(sql: Any, team: str) -> float:
    (value,) = sql.execute(
        "select sum(node_seconds * power(0.5, extract(epoch from now() - at) / 86400))"
        " from team_usage where team = %s",
        (team,),
    ).fetchone()
    return float(value)


def test_the_scan_reads_the_shapes_and_teams_not_the_queue(app, ctx, client, sql):
    """A scan looks at the first run of each (shape, team) and at the runs it places, however
    many runs wait behind them."""
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    post(app, "kern", contract("h1"), 201)
    post(app, "qa", contract("hs", role("s", "scope")), 201)
    looked = []
    for n in (3, 30):
        sql.execute("delete from runs where state = 'QUEUED'")
        for i in range(n):
            post(app, "kern", contract(f"k{n}-{i}"), 202)
            post(app, "qa", contract(f"q{n}-{i}", role("s", "scope")), 202)
        looked.append(wake_queued(ctx, "test").looked)
    assert looked == [2, 2]


# ---------------------------------------------------------------- quotas


def test_a_team_at_max_nodes_queues_and_the_board_goes_to_another_team(app, client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    post(app, "cap", contract("c1"), 201)
    queued = post(app, "cap", contract("c2"), 202)
    assert queued["share"] == {
        "team": "capped",
        "weight": 1,
        "share": 1.0,
        "usage": 0.0,
        "factor": pytest.approx(1.0 / 3600),
        "running_nodes": 1,
        "max_nodes": 1,
        "at_quota": True,
        "reason": "team capped at its quota of 1 nodes (holding 1)",
    }
    assert leases_of(sql, "capped") == 1
    # n2 stays free for anyone else: a kernel run takes it at once.
    post(app, "kern", contract("k1"), 201)
    # The capped team's release is its own wake: c2 takes the board c1 left.
    cancel(app, "cap", "c1")
    assert states(sql, ["c2"]) == {"c2": "RUNNING"}
    assert leases_of(sql, "capped") == 1


def test_a_queued_run_of_a_team_at_max_nodes_is_not_promoted_when_a_board_frees(app, client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    post(app, "cap", contract("c1"), 201)
    post(app, "kern", contract("h1"), 201)
    post(app, "cap", contract("c2"), 202)
    post(app, "kern", contract("k1"), 202)
    cancel(app, "kern", "h1")
    # c2 is older, and its team has spent nothing more, but it is held to max_nodes 1.
    assert states(sql, ["c2", "k1"]) == {"c2": "QUEUED", "k1": "RUNNING"}
    assert leases_of(sql, "capped") == 1


def test_a_run_wider_than_its_teams_quota_is_422(app, client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    reason = "requires exceeds team capped's quota: 2 nodes, max_nodes 1"
    body = post(app, "cap", contract("w1", role("dut", count=2)), 422)
    assert body["error"]["reason"] == reason
    assert states(sql, ["w1"]) == {"w1": "FAILED"}
    # Two roles one board can fill share it: one node, within the quota.
    post(app, "cap", contract("w2", role("a"), role("b")), 201)
    assert leases_of(sql, "capped") == 1
    post(app, "cap", contract("w2", role("a"), role("b")), 200)
    # A board and a scope are two nodes whatever the choice: refused once matched.
    advertise(client, "s1", cap("scope"))
    body = post(app, "cap", contract("w4", role("a"), role("s", "scope")), 422)
    assert body["error"]["reason"] == reason
    assert states(sql, ["w4"]) == {"w4": "FAILED"}
    resp = as_token(app, "cap").post("/v1/runs/dry-run", json=contract("w3", role("dut", count=2)))
    assert resp.status_code == 422 and resp.get_json()["error"]["reason"] == reason
    assert states(sql, ["w3"]) == {}


def branch_states(sql: Any, run_id: str) -> dict[str, str]:
    rows = sql.execute(
        "select step_id, state from steps where run_id = %s and step_id like 'with%%'", (run_id,)
    ).fetchall()
    return dict(rows)


def test_an_acquire_of_a_team_at_max_nodes_answers_unavailable(app, client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    advertise(client, "s1", cap("scope"))
    post(app, "cap", probing_run("a1"), 201)
    # The run holds n1, its team's one node: the scope is unavailable, though free.
    assert branch_states(sql, "a1") == {"with-scope": "SKIPPED", "without-scope": "PENDING"}
    assert sql.execute("select count(*) from leases where node_id = 's1'").fetchone() == (0,)
    assert leases_of(sql, "capped") == 1
    # A team without a quota gets it.
    post(app, "kern", probing_run("a2"), 201)
    assert branch_states(sql, "a2") == {"with-scope": "PENDING", "without-scope": "SKIPPED"}
    assert sql.execute("select run_id from leases where node_id = 's1'").fetchone() == ("a2",)


# ---------------------------------------------------------------- the expected start with teams

SUITE = duration_key("suite", "run", {"run": ["suite"]}, {"capability": "board", "attrs": {}})


def suite(run_id: str) -> dict[str, Any]:
    return contract(run_id, steps=[{"id": "suite", "uses": "dut", "run": ["suite"]}])


def test_a_queued_runs_expected_start_counts_the_other_team_asking_again_for_its_share(
    app, client, sql
):
    """kernel's h1 holds n1 for 30 s more, qa's q1 holds n2 for 100 s (the suite's recorded
    median is 100 s); kernel has k1 queued, then k2. In queue order alone k1 takes n1 at 30 and
    k2 takes n2 at 100. With teams, qa, which has the same share and has spent less by then,
    asks again for n2 when q1 ends, as a team using its share goes on doing: k2 waits for n1,
    free again when k1 ends at 130."""
    sql.execute(
        "insert into step_durations (key, seconds, ended_at) values (%s, 100, now())", (SUITE,)
    )
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    post(app, "kern", suite("h1"), 201)
    post(app, "qa", suite("q1"), 201)
    for node in ("n1", "n2"):
        claimed(client, node)
    sql.execute("update steps set started_at = now() - interval '70 seconds' where run_id = 'h1'")
    post(app, "kern", suite("k1"), 202)
    view = post(app, "kern", suite("k2"), 202)

    assert view["expected_basis"] == "history"
    start = datetime.fromisoformat(view["expected_start"].replace("Z", "+00:00"))
    at = datetime.fromisoformat(view["candidates_at"].replace("Z", "+00:00"))
    assert (start - at).total_seconds() == pytest.approx(130, abs=1)
    # k1, first of kernel's, takes n1 when h1 ends, before qa asks again.
    first = as_token(app, "reader").get("/v1/runs/k1").get_json()
    assert first["expected_basis"] == "history"
    start = datetime.fromisoformat(first["expected_start"].replace("Z", "+00:00"))
    at = datetime.fromisoformat(first["candidates_at"].replace("Z", "+00:00"))
    assert (start - at).total_seconds() == pytest.approx(30, abs=1)
