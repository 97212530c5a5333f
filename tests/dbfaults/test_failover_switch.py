"""A failover as a lab has one (docs/deploy.md#11-a-database-with-a-standby): a primary and its
synchronous streaming standby, servers of the test's own, and ``database.url`` naming both, the
standby first. Every connection goes to the primary; the primary is killed (``kill -9``) and the
standby promoted; requests meanwhile are 503 with ``Retry-After: 1``, never 500; the first
request after the promotion is answered by the new primary; every run the clients were told
about is there; the claim listener reopens its session there; and the reaper's next pass sees
the switch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from app.dev.embedded import create_database
from app.migrate import upgrade
from app.services.reaper import reap_pass
from tests.dbfaults.replica import PrimaryAndStandby
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import app_on, client_of
from tests.support.concurrency import await_condition
from tests.support.contracts import one_step


def _sessions(url: str, name: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "select count(*) from pg_stat_activity where application_name = %s", (name,)
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_switch_to_the_standby_loses_no_acknowledged_run_and_answers_no_500(
    servers: PrimaryAndStandby, tmp_path: Path
) -> None:
    primary_db = create_database(servers.primary.admin_url, "mediator_switch")
    upgrade(primary_db)
    servers.start_standby()
    dbname = "mediator_switch"
    url = (
        f"postgresql://postgres@127.0.0.1:{servers.standby_port},"
        f"127.0.0.1:{servers.primary_port}/{dbname}"
    )
    told: dict[str, int] = {}
    statuses: list[int] = []
    with app_on(url, tmp_path / "records", **{"database.pool_size": 2}) as app:
        client = client_of(app)
        ctx = app.extensions["mediator"]
        advertise(client, "n1", cap("board"))
        for run_id in ("run-1", "run-2"):
            resp = client.post("/v1/runs", json=one_step(run_id))
            told[run_id] = resp.status_code
        assert told == {"run-1": 201, "run-2": 202}
        assert client.post("/v1/nodes/n1/claim?wait=0").status_code == 200
        # Every connection went to the primary, none to the standby listed first.
        assert _sessions(servers.standby_url(), "mediator") == 0
        assert _sessions(servers.primary.admin_url, "mediator") >= 1
        await_condition(
            lambda: _sessions(servers.primary.admin_url, "mediator-listener") == 1,
            "the claim listener's session on the primary",
            30,
            interval=0.05,
        )
        assert reap_pass(ctx).restarted is False  # the reaper's first look at this server

        servers.kill_primary()
        # While no server takes writes: 503 with Retry-After, never 500 (bounded by count).
        for _ in range(3):
            resp = client.post("/v1/nodes", json={"node_id": "n2", "capabilities": [cap("board")]})
            statuses.append(resp.status_code)
            assert resp.status_code == 503, resp.get_json()
            assert resp.headers["Retry-After"] == "1"
        servers.promote()

        resp = client.post("/v1/runs", json=one_step("run-3"))
        statuses.append(resp.status_code)
        assert resp.status_code in (201, 202), resp.get_json()
        told["run-3"] = resp.status_code
        assert 500 not in statuses
        # The listener follows: its session is on the new primary.
        await_condition(
            lambda: _sessions(servers.standby_url(), "mediator-listener") == 1,
            "the claim listener's session on the new primary",
            30,
            interval=0.05,
        )
        # The reaper sees the switch (another server's start time) and gives leases a window.
        assert reap_pass(ctx).restarted is True

    with psycopg.connect(servers.standby_url(dbname), autocommit=True) as conn:
        rows: Any = conn.execute("select run_id, state from runs order by run_id").fetchall()
    assert dict(rows) == {"run-1": "RUNNING", "run-2": "QUEUED", "run-3": "QUEUED"}
