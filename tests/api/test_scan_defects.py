"""What a wake scan must not leave behind
(docs/queue.md#guarantees-their-bounds-and-the-tests-that-prove-them): nodes freed by a run that
ends inside its own promotion are seen by the same scan, and a scan whose promotion failed on a
transient error leaves a wake debt that the reaper's next pass pays."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from app.config import to_libpq_url
from app.services.reaper import reap_pass
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.contracts import crossing_acquires, one_step
from tests.support.rows import leases, scalar
from tests.support.submitter import state_of, submit


def test_a_run_that_ends_inside_its_promotion_frees_its_nodes_for_the_same_scan(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    submit(client, one_step("holder"), 201)
    accepted = submit(client, crossing_acquires("instant"), 202).get_json()
    assert accepted["state"] == "QUEUED" and accepted["warnings"]
    submit(client, one_step("next"), 202)

    # The holder's cancel frees n1: "instant" is promoted, ends at once and frees n1 (and s1)
    # again; the same wake must then place "next" on n1.
    assert client.post("/v1/runs/holder/cancel").status_code == 200

    assert state_of(client, "instant") == "SUCCEEDED"
    assert state_of(client, "next") == "RUNNING"
    assert leases(sql) == [("n1", "next")]


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"database.statement_timeout_seconds": 0.3}


@contextmanager
def run_row_locked(db_url: str, run_id: str) -> Iterator[None]:
    """Another session holds the run's row lock: the promotion's conditional UPDATE waits on it
    and fails on the scan's statement timeout (a transient error)."""
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        conn.execute("SET idle_in_transaction_session_timeout = '10s'")
        conn.execute("SELECT 1 FROM runs WHERE run_id = %s FOR UPDATE", (run_id,))
        yield
        conn.rollback()


def test_a_promotion_that_fails_on_a_transient_error_leaves_a_debt_the_reaper_pays(
    client, ctx, sql, db_url
):
    advertise(client, "n1", cap("board"))
    submit(client, one_step("holder"), 201)
    submit(client, one_step("waiting"), 202)

    with run_row_locked(db_url, "waiting"):
        assert client.post("/v1/runs/holder/cancel").status_code == 200

    assert state_of(client, "waiting") == "QUEUED"  # its promotion timed out
    assert scalar(sql, "SELECT count(*) FROM wake_debt") == 1
    report = reap_pass(ctx)
    assert report.woke
    assert state_of(client, "waiting") == "RUNNING"
    assert scalar(sql, "SELECT count(*) FROM wake_debt") == 0


def test_after_the_database_drops_every_connection_the_freeing_request_still_promotes(client, sql):
    """A restart, a failover or a reset proxy ends every session: the scan gate's dead session
    is replaced and the pool's dead connections are not handed out, so the next freeing request
    answers as usual and promotes by itself (no wake debt left for the reaper)."""
    advertise(client, "n1", cap("board"))
    submit(client, one_step("holder"), 201)
    submit(client, one_step("waiting"), 202)
    # A new node's wake, with a run queued, opens the gate's session (a wake that finds the queue
    # empty ends without the gate).
    advertise(client, "s1", cap("scope"))
    ended = scalar(
        sql,
        # With a timeout, each call returns once its backend has exited, so its message to the
        # client has been sent: on a loaded machine a backend took longer to die than the next
        # request took to check its connection out, which then failed with 503.
        "SELECT count(pg_terminate_backend(pid, 60000)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    assert ended >= 2  # at least the pool's connection and the gate's session

    assert client.post("/v1/runs/holder/cancel").status_code == 200

    assert state_of(client, "waiting") == "RUNNING"
    assert scalar(sql, "SELECT count(*) FROM wake_debt") == 0


@contextmanager
def node_stolen_whenever_granted_to(sql: Any, run_id: str, thief: str) -> Iterator[None]:
    """Each time a transaction grants a node to ``run_id``, another run's lease on that node is
    inserted just before (a trigger): the grant always meets a taken node, as if another scan
    kept winning the race. The trigger is gone when the block ends."""
    sql.execute(
        f"""
        CREATE FUNCTION test_steal_node() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.run_id = '{run_id}' THEN
                INSERT INTO leases (node_id, run_id, role, capability, not_after, nonce)
                VALUES (NEW.node_id, '{thief}', 'dut', 'board', now() + interval '1 hour', 'x');
            END IF;
            RETURN NEW;
        END $$
        """
    )
    sql.execute(
        "CREATE TRIGGER test_steal_node BEFORE INSERT ON leases"
        " FOR EACH ROW EXECUTE FUNCTION test_steal_node()"
    )
    try:
        yield
    finally:
        sql.execute("DROP TRIGGER test_steal_node ON leases")
        sql.execute("DROP FUNCTION test_steal_node()")


def test_a_run_that_meets_a_taken_node_twice_is_not_passed_by_a_younger_run_of_its_shape(
    client, ctx, sql
):
    advertise(client, "n1", cap("board"))
    submit(client, one_step("holder"), 201)
    submit(client, one_step("old"), 202)
    submit(client, one_step("young"), 202)

    with node_stolen_whenever_granted_to(sql, "old", thief="holder"):
        assert client.post("/v1/runs/holder/cancel").status_code == 200
        assert state_of(client, "young") == "QUEUED"  # it did not pass "old"
        assert state_of(client, "old") == "QUEUED"
        assert scalar(sql, "SELECT count(*) FROM wake_debt") == 1  # someone looks again

    assert reap_pass(ctx).woke
    assert state_of(client, "old") == "RUNNING"
    assert state_of(client, "young") == "QUEUED"
