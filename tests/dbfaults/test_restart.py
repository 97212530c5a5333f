"""PostgreSQL restarted under a live Mediator (gunicorn, 2 workers) on a server the test started
itself: while the database is down every answer is a 503 within the pool's time-out (never a
500, never a hang) and ``/readyz`` says so; once it is back the service recovers by itself — no
restart of gunicorn, no reaper — and every run placed before the restart goes on to SUCCEEDED
(docs/reliability.md#database-faults: wake debt and scan gate, the pool time-out, ``/readyz``)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests

from app.config import to_libpq_url
from tests.dbfaults.load import Agent, Submitter, Tally, one_step, reaper_of
from tests.dbfaults.server import RestartablePostgres
from tests.support.apps import LiveServer, gunicorn_on, ready_workers
from tests.support.concurrency import await_condition, connect
from tests.support.invariants import check, check_settled

pytestmark = pytest.mark.slow

POOL_TIMEOUT = 2.0
# The longest any answer may take while the database is down or coming back: the pool's
# time-out, plus what a busy 2-core machine adds.
ANSWER_BOUND = POOL_TIMEOUT + 3.0
DOWN_SECONDS = 3.0
REQUEST_JOIN = 30.0
SERVER_ENV = {
    "MEDIATOR_DATABASE_POOL_TIMEOUT": str(POOL_TIMEOUT),
    "MEDIATOR_CLAIM_LONG_POLL_SECONDS": "1",
    "MEDIATOR_CLAIM_RECHECK_SECONDS": "1",
    # A reaper pass every 5 s; a lease lives 15 s past its last renewal, far longer than the
    # outage (the agents renew every second).
    "MEDIATOR_LEASE_RENEW_SECONDS": "5",
    "MEDIATOR_LOG_LEVEL": "info",  # each worker's "process ready" line
}
WORKERS = 2  # gunicorn_on's default


@pytest.fixture
def server(own_server: RestartablePostgres) -> RestartablePostgres:
    if not own_server.is_up:  # an earlier test failed while the server was down
        own_server.up()
    return own_server


@pytest.fixture
def db_url(server: RestartablePostgres) -> str:
    return server.new_database()


@pytest.fixture
def live(db_url: str, tmp_path: Path) -> Iterator[LiveServer]:
    """gunicorn once every worker has finished its start-up (its schema check and start-up
    wake): a restart while a worker is still starting would test that worker's start-up, not a
    serving process's first requests after it (seen on a loaded machine)."""
    with gunicorn_on(db_url, tmp_path, **SERVER_ENV) as live_server:
        await_condition(
            lambda: len(ready_workers(live_server)) >= WORKERS,
            "every worker to finish its start-up",
            60,
            interval=0.1,
        )
        yield live_server


def sql(db_url: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


def states(db_url: str, run_ids: list[str]) -> dict[str, str]:
    return dict(sql(db_url, "select run_id, state from runs where run_id = any(%s)", run_ids))


def wake_debt(db_url: str) -> list[tuple[Any, ...]]:
    return sql(db_url, "select reason from wake_debt")


def picture(db_url: str, run_ids: list[str], live: LiveServer) -> str:
    """What the runs that did not get there look like, for the failure message."""
    stuck = [r for r, state in states(db_url, run_ids).items() if state != "SUCCEEDED"]
    rows = sql(
        db_url,
        "select r.run_id, r.state, s.seq, s.state, s.node_id,"
        " (select string_agg(node_id, ',') from leases l where l.run_id = r.run_id)"
        " from runs r left join steps s using (run_id) where r.run_id = any(%s)"
        " order by r.created_at, s.seq",
        stuck,
    )
    leases = sql(db_url, "select node_id, run_id from leases order by node_id")
    log = Path(live.env["MEDIATOR_RECORDS_ROOT"]).parent / "gunicorn.log"
    tail = log.read_text()[-4000:] if log.exists() else ""
    return f"stuck: {rows}\nleases: {leases}\nwake debt: {wake_debt(db_url)}\n{tail}"


def ready(live: LiveServer) -> int:
    return requests.get(live.url + "/readyz", timeout=10).status_code


# ---------------------------------------------------------------- under load


def test_a_restart_under_load_answers_503_meanwhile_and_every_run_placed_before_it_succeeds(
    server: RestartablePostgres, db_url: str, live: LiveServer, tmp_path: Path
) -> None:
    """gunicorn and ``mediator reaper``, as deployed: a result whose step committed just before
    the database went away may leave its run VERIFYING, which the reaper settles
    (docs/reliability.md#what-these-tests-found)."""
    with reaper_of(live, tmp_path / "reaper.log"):
        restart_under_load(server, db_url, live)


def restart_under_load(server: RestartablePostgres, db_url: str, live: LiveServer) -> None:
    tally, stop = Tally(), threading.Event()
    violations: list[str] = []
    agents = [Agent(live, f"n{i}", tally, stop) for i in range(1, 4)]
    submitter = Submitter(live, tally, stop, count=60, every=0.05)
    for agent in agents:
        agent.advertise()
    threads: list[threading.Thread] = [*agents, submitter]
    for t in threads:
        t.start()
    try:
        # Enough runs placed, some already done, some still queued behind the three nodes.
        await_condition(lambda: len(submitter.accepted) >= 20, "20 runs accepted", 30, interval=0.1)
        placed = [run_id for run_id, _ in submitter.accepted]
        with connect(db_url) as conn:
            violations += check(conn)

        went_down = time.monotonic()
        server.down(signal.SIGINT)
        down_at = time.monotonic()
        probes = [(time.monotonic(), ready(live))]
        time.sleep(DOWN_SECONDS / 2)  # the outage lasts a while: load keeps arriving
        probes.append((time.monotonic(), ready(live)))
        time.sleep(DOWN_SECONDS / 2)
        up_from = time.monotonic()
        server.up()
        up_at = time.monotonic()

        await_condition(
            lambda: ready(live) == 200, "/readyz 200 after the restart", 20, interval=0.1
        )
        with connect(db_url) as conn:
            violations += check(conn)
        await_condition(
            lambda: set(states(db_url, placed).values()) == {"SUCCEEDED"},
            "every run placed before the restart SUCCEEDED",
            60,
            interval=0.1,
            explain=lambda: picture(db_url, placed, live),
        )
        submitter.join(60)
        assert not submitter.is_alive(), "the submitter never finished"
        accepted = [run_id for run_id, _ in submitter.accepted]
        await_condition(
            lambda: set(states(db_url, accepted).values()) == {"SUCCEEDED"},
            "every accepted run SUCCEEDED",
            60,
            interval=0.1,
            explain=lambda: picture(db_url, accepted, live),
        )
    finally:
        stop.set()
        for t in threads:
            t.join(REQUEST_JOIN)
    # Quiet now: within a reaper pass or two every finished run is sealed and nothing is left.
    with connect(db_url) as conn:
        await_condition(
            lambda: not check_settled(conn),
            "the checker holds",
            20,
            interval=0.1,
            explain=lambda: check_settled(conn),
        )

    assert violations == []
    assert all(status == 503 for _, status in probes), probes
    assert not tally.unexpected(), tally.unexpected()[:20]
    during = tally.between(down_at, up_from)
    assert during, "no request was answered while the database was down"
    assert {a.status for a in during} == {503}, sorted({(a.route, a.status) for a in during})
    outage = [a for a in tally.answers if a.started + a.seconds >= went_down and a.started <= up_at]
    slowest = max(outage, key=lambda a: a.seconds)
    assert slowest.seconds < ANSWER_BOUND, slowest
    assert len(accepted) == 60
    assert tally.statuses()[("submit", 202)], "no run was ever queued: the load is too light"
    print(
        f"\nrestart under load: {len(tally.answers)} requests, {len(during)} answered 503 "
        f"while down ({DOWN_SECONDS}s), slowest during the outage {slowest.seconds:.2f}s, "
        f"{len(placed)} runs placed before, {len(accepted)} in all, all SUCCEEDED; "
        f"{dict(tally.statuses())}"
    )


# ---------------------------------------------------------------- right after the restart


@pytest.mark.parametrize(
    "how", [signal.SIGINT, signal.SIGQUIT], ids=["fast-shutdown", "immediate-shutdown"]
)
def test_the_first_freeing_request_after_a_restart_promotes_the_queued_run_itself(
    server: RestartablePostgres, db_url: str, live: LiveServer, how: signal.Signals
) -> None:
    """Promotion by the freeing request, not by the reaper
    (docs/queue.md#promotion-the-request-that-frees-a-node-promotes). Every pooled connection and
    the scan gate's session of both workers died with the server; the first requests after it are
    answered normally, and the result that frees the node promotes the waiting run."""
    headers = {"X-Enode-Instance": "n1-instance-1"}
    advert = {
        "node_id": "n1",
        "instance": "n1-instance-1",
        "capabilities": [{"capability": "board"}],
    }
    assert live.post("/v1/nodes", advert).status_code == 200
    assert live.post("/v1/runs", one_step("run-a")).status_code == 201
    assert live.post("/v1/runs", one_step("run-b")).status_code == 202

    server.down(how)
    assert ready(live) == 503
    server.up()

    # Each worker's first requests after the restart: none of them may be a 500 (or a 503:
    # the database is reachable again).
    firsts = [ready(live) for _ in range(4)]
    assert firsts == [200] * 4
    firsts = [live.post("/v1/nodes", advert).status_code for _ in range(4)]
    assert firsts == [200] * 4
    step = live.post("/v1/nodes/n1/claim?wait=0", headers=headers)
    assert step.status_code == 200, step.text
    assert (step.json()["run_id"], step.json()["seq"]) == ("run-a", 1)

    resp = live.post("/v1/runs/run-a/steps/1/result", {"node": "n1", "exit_code": 0})
    assert resp.status_code == 200, resp.text

    # The wake is synchronous, inside the result request (wake point 1, docs/design.md#wake-points).
    assert states(db_url, ["run-a", "run-b"]) == {"run-a": "SUCCEEDED", "run-b": "RUNNING"}
    assert wake_debt(db_url) == []
    with connect(db_url) as conn:
        assert check(conn) == []
