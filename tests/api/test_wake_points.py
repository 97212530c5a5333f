"""The wake points that adverts and start-up own, and the wake debt (wake points 4, 5, 6 and 8 of
docs/design.md#wake-points, and docs/design.md#wake-debt-and-what-is-owed; docs/queue.md#the-reaper
for the reaper's side).

A wake is observed by its effect: a QUEUED run that fits a node freed or made available is
RUNNING in the GET right after the request. To leave a freed node without its wake, rows are
changed with plain SQL (which wakes nobody). A wake is made to fail for real: another connection
holds an ACCESS EXCLUSIVE lock on ``reservations``, so the scan's first look at the queue runs into
the (small) ``database.statement_timeout_seconds``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from sqlalchemy.exc import OperationalError

from app import startup
from app.config import to_libpq_url
from app.services.reaper import reap_pass
from tests.support.actors import cap
from tests.support.agent import advertise, claim
from tests.support.apps import TOKEN, app_on, client_of, gunicorn_on
from tests.support.concurrency import await_condition
from tests.support.contracts import contract, role
from tests.support.rows import leases, scalar
from tests.support.submitter import state_of, submit

TIMEOUT = {"database.statement_timeout_seconds": 0.3}
failing_scans = pytest.mark.parametrize("config_overrides", [TIMEOUT], ids=["statement-timeout"])


# ---------------------------------------------------------------- rows and pieces


def wake_debt(sql: Any) -> list[dict[str, Any]]:
    return sql.cursor(row_factory=dict_row).execute("select * from wake_debt").fetchall()


def r1_running_on_n1_and_r2_queued(client: Any, **advert: Any) -> None:
    advertise(client, "n1", cap("board"), **advert)
    assert submit(client, contract("r1"), 201).get_json()["state"] == "RUNNING"
    assert submit(client, contract("r2"), 202).get_json()["state"] == "QUEUED"


def free_n1_without_a_wake(sql: Any) -> None:
    """r1 ends and n1 frees by plain SQL: a commit whose wake never happened (a crash between
    the two)."""
    sql.execute("update runs set state = 'FAILED', ended_at = now() where run_id = 'r1'")
    sql.execute("update steps set state = 'FAILED' where run_id = 'r1'")
    sql.execute("delete from leases where run_id = 'r1'")


@contextmanager
def reservations_locked(db_url: str) -> Iterator[None]:
    """Another session holds ACCESS EXCLUSIVE on ``reservations`` until the block ends: a wake
    scan's first look at the queue reads that table (whether the reservation step has anything
    to do: docs/design.md#priorities-and-reservations), so it waits and fails under its statement
    timeout, while a cancel of a RUNNING run and its seal never read it."""
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as conn:
        # A code path that waits on the lock without a timeout must fail the test, not hang it:
        # the server ends this session (and its lock) after 10 idle seconds.
        conn.execute("set idle_in_transaction_session_timeout = '10s'")
        conn.execute("begin")
        conn.execute("lock table reservations in access exclusive mode")
        try:
            yield
        finally:
            try:
                conn.execute("rollback")
            except psycopg.OperationalError:
                pass  # the server already ended the session, and the lock with it


def ask_only_run(run_id: str) -> dict[str, Any]:
    """Holds n1 but binds no step to it: nothing of its cancel but the wake scan after the
    cancel's commit runs into the lock."""
    return contract(
        run_id,
        role("dut"),
        steps=[
            {
                "id": "approve",
                "ask": {"prompt": "Go?"},
                "out": ["decision"],
                "schema": {
                    "decision": {"type": "object", "properties": {"ok": {"type": "boolean"}}}
                },
            }
        ],
    )


def cancel_whose_wake_fails(client: Any, sql: Any, db_url: str) -> None:
    """n1 held by r1, r2 QUEUED for n1; r1 is cancelled and committed, and its wake fails."""
    advertise(client, "n1", cap("board"))
    submit(client, ask_only_run("r1"), 201)
    submit(client, contract("r2"), 202)
    with reservations_locked(db_url):
        resp = client.post("/v1/runs/r1/cancel")
    # The wake's failure never changes the answer
    # (docs/queue.md#promotion-the-request-that-frees-a-node-promotes).
    assert resp.status_code == 200 and resp.get_json() == {"run_id": "r1", "state": "FAILED"}
    assert leases(sql) == []


# ---------------------------------------------------------------- 4. restart detected


def test_an_advert_that_detects_a_restart_promotes_the_run_queued_for_that_node(client, sql):
    r1_running_on_n1_and_r2_queued(client, instance="i1")
    assert claim(client, "n1", "i1").get_json()["step_id"] == "r1#01"

    reply = advertise(client, "n1", cap("board"), instance="i2")

    assert state_of(client, "r1") == "FAILED"
    assert state_of(client, "r2") == "RUNNING"
    assert leases(sql) == [("n1", "r2")]
    # Read after the wake: the node learns its new lease from this very reply.
    assert [x["run_id"] for x in reply["leases"]] == ["r2"]


# ---------------------------------------------------------------- 5. drain lifted


@pytest.mark.parametrize(
    ("drain", "lift"),
    [
        ("graceful", {"policy": {"drain": ""}}),
        ("at-boundary", {"policy": {"drain": ""}}),
        ("graceful", {}),
        ("at-boundary", {"policy": {"drain": "bogus"}}),
    ],
    ids=["graceful-empty", "at-boundary-empty", "graceful-no-policy", "at-boundary-unknown-folded"],
)
def test_lifting_a_drain_promotes_the_queued_run_in_that_very_request(client, sql, drain, lift):
    advertise(client, "n1", cap("board"), policy={"drain": drain})
    submit(client, contract("r1"), 202)

    reply = advertise(client, "n1", cap("board"), **lift)

    assert state_of(client, "r1") == "RUNNING"
    assert leases(sql) == [("n1", "r1")]
    assert reply["drain"] == "" and [x["run_id"] for x in reply["leases"]] == ["r1"]


def test_a_drain_lifted_after_the_run_freed_the_node_promotes_the_queued_run(client, sql):
    r1_running_on_n1_and_r2_queued(client)
    advertise(client, "n1", cap("board"), policy={"drain": "graceful"})
    client.post("/v1/runs/r1/cancel")
    assert state_of(client, "r2") == "QUEUED"

    advertise(client, "n1", cap("board"))

    assert state_of(client, "r2") == "RUNNING"
    assert leases(sql) == [("n1", "r2")]


def test_an_advert_that_keeps_draining_does_not_promote(client, sql):
    advertise(client, "n1", cap("board"), policy={"drain": "graceful"})
    submit(client, contract("r1"), 202)

    advertise(client, "n1", cap("board"), policy={"drain": "at-boundary"})

    assert state_of(client, "r1") == "QUEUED"
    assert leases(sql) == []


# ---------------------------------------------------------------- 8. capacity appeared


def test_a_node_that_comes_back_after_its_advert_expired_promotes_the_run_queued_for_it(
    client, sql
):
    r1_running_on_n1_and_r2_queued(client)
    sql.execute("update nodes set expires_at = now() - interval '1 second' where node_id = 'n1'")
    assert client.post("/v1/runs/r1/cancel").status_code == 200
    # The cancel's wake ran, but n1 is not live: nothing to place r2 on.
    assert state_of(client, "r2") == "QUEUED" and leases(sql) == []

    reply = advertise(client, "n1", cap("board"))

    assert state_of(client, "r2") == "RUNNING"
    assert leases(sql) == [("n1", "r2")]
    assert [x["run_id"] for x in reply["leases"]] == ["r2"]


def test_a_new_node_promotes_a_run_queued_behind_a_busy_one(client, sql):
    r1_running_on_n1_and_r2_queued(client)

    reply = advertise(client, "n2", cap("board"))

    assert state_of(client, "r2") == "RUNNING"
    assert leases(sql) == [("n1", "r1"), ("n2", "r2")]
    assert [x["run_id"] for x in reply["leases"]] == ["r2"]


def test_a_node_whose_capabilities_changed_promotes_the_run_that_now_fits_it(client, sql):
    advertise(client, "n1", cap("board", soc="x"))
    advertise(client, "n2", cap("board", soc="y"))
    submit(client, contract("r1", role("dut", soc="x")), 201)
    submit(client, contract("r2", role("dut", soc="x")), 202)
    assert leases(sql) == [("n1", "r1")]

    reply = advertise(client, "n2", cap("board", soc="x"))

    assert state_of(client, "r2") == "RUNNING"
    assert leases(sql) == [("n1", "r1"), ("n2", "r2")]
    assert [x["run_id"] for x in reply["leases"]] == ["r2"]


def test_a_heartbeat_of_a_live_node_with_unchanged_capabilities_does_not_scan(client, sql):
    # Heartbeats come every renew_seconds from every node: a scan on each would be a timer.
    r1_running_on_n1_and_r2_queued(client)
    free_n1_without_a_wake(sql)

    advertise(client, "n1", cap("board"))

    assert state_of(client, "r2") == "QUEUED"
    assert leases(sql) == []


# ---------------------------------------------------------------- 6. start-up


def test_start_up_promotes_a_run_whose_wake_never_happened(app, client, sql):
    r1_running_on_n1_and_r2_queued(client)
    free_n1_without_a_wake(sql)
    assert state_of(client, "r2") == "QUEUED"

    startup(app)

    assert state_of(client, "r2") == "RUNNING"
    assert leases(sql) == [("n1", "r2")]


@pytest.fixture
def freed_without_wake(fresh_db_url: str, tmp_path: Any) -> None:
    """On the live server's database, before it starts: r2 QUEUED next to a free n1."""
    with app_on(fresh_db_url, tmp_path / "records") as application:
        r1_running_on_n1_and_r2_queued(client_of(application))
    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        free_n1_without_a_wake(conn)
        assert scalar(conn, "select state from runs where run_id = 'r2'") == "QUEUED"


@pytest.fixture
def one_gunicorn_worker(
    freed_without_wake: None, fresh_db_url: str, tmp_path: Any
) -> Iterator[str]:
    """One gunicorn worker, started after the rows above: when /readyz answers, its start-up
    (wake included) has completed."""
    with gunicorn_on(fresh_db_url, tmp_path, MEDIATOR_WORKERS="1", MEDIATOR_THREADS="4") as server:
        yield server.url


def test_a_gunicorn_worker_wakes_the_queue_once_at_start_up(one_gunicorn_worker):
    import requests

    resp = requests.get(
        one_gunicorn_worker + "/v1/runs/r2",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )

    assert resp.status_code == 200 and resp.json()["state"] == "RUNNING"


@failing_scans
def test_a_failed_start_up_wake_is_logged_start_up_goes_on_and_the_debt_is_marked(
    app, client, sql, db_url
):
    r1_running_on_n1_and_r2_queued(client)
    free_n1_without_a_wake(sql)

    with reservations_locked(db_url):
        startup(app)  # returns: a failed wake never stops start-up

    assert state_of(client, "r2") == "QUEUED"
    assert len(wake_debt(sql)) == 1
    assert client.get("/v1/nodes").status_code == 200


# ---------------------------------------------------------------- wake debt


@failing_scans
def test_a_wake_that_fails_after_its_commit_sets_the_wake_debt_marker(client, sql, db_url):
    cancel_whose_wake_fails(client, sql, db_url)

    debt = wake_debt(sql)
    assert [d["id"] for d in debt] == [1]
    assert state_of(client, "r2") == "QUEUED"


@failing_scans
def test_the_next_reaper_pass_pays_the_wake_debt_promotes_and_clears_the_marker(
    client, ctx, sql, db_url
):
    cancel_whose_wake_fails(client, sql, db_url)
    assert len(wake_debt(sql)) == 1

    report = reap_pass(ctx)

    assert report.woke and not report.freed
    assert state_of(client, "r2") == "RUNNING"
    assert leases(sql) == [("n1", "r2")]
    assert wake_debt(sql) == []


@failing_scans
def test_a_reaper_scan_that_fails_keeps_the_wake_debt_for_the_next_pass(client, ctx, sql, db_url):
    cancel_whose_wake_fails(client, sql, db_url)

    with reservations_locked(db_url), pytest.raises(OperationalError, match="statement timeout"):
        reap_pass(ctx)

    assert len(wake_debt(sql)) == 1
    assert state_of(client, "r2") == "QUEUED"
    reap_pass(ctx)
    assert state_of(client, "r2") == "RUNNING" and wake_debt(sql) == []


def test_a_reaper_pass_without_wake_debt_and_nothing_freed_does_not_scan(client, ctx, sql):
    r1_running_on_n1_and_r2_queued(client)
    free_n1_without_a_wake(sql)
    assert wake_debt(sql) == []

    report = reap_pass(ctx)

    assert not report.woke
    assert state_of(client, "r2") == "QUEUED"
    assert leases(sql) == []


def test_a_reaper_pass_after_a_failed_pass_scans_once_without_wake_debt(client, ctx, sql):
    r1_running_on_n1_and_r2_queued(client)
    free_n1_without_a_wake(sql)

    report = reap_pass(ctx, previous_failed=True)

    assert report.woke
    assert state_of(client, "r2") == "RUNNING"
    assert leases(sql) == [("n1", "r2")]


def test_a_worker_started_on_an_old_schema_wakes_once_ops_have_migrated(
    fresh_db_url, tmp_path, sql
):
    """Wake point 6 is not lost to a schema that was not ready at start-up: the worker serves 503
    meanwhile, and the first request after ops migrated pays the start-up wake it skipped."""
    with app_on(fresh_db_url, tmp_path / "records") as first:
        r1_running_on_n1_and_r2_queued(client_of(first))
    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        free_n1_without_a_wake(conn)
        current = scalar(conn, "select version_num from alembic_version")
        conn.execute("update alembic_version set version_num = '0000_older'")
        with app_on(fresh_db_url, tmp_path / "records") as worker:
            client = client_of(worker)
            startup(worker)
            assert client.get("/v1/runs/r2").status_code == 503
            conn.execute("update alembic_version set version_num = %s", (current,))  # migrated
            # The worker looks at the schema again at most once a second while it is not right.
            await_condition(
                lambda: client.get("/v1/runs/r2").status_code == 200, "the schema seen as current"
            )

            assert state_of(client, "r2") == "RUNNING"
            assert scalar(conn, "select node_id from leases where run_id = 'r2'") == "n1"
