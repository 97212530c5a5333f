"""Wake debt (docs/design.md#wake-debt-and-what-is-owed): no path that frees a node can leave it
with no scan and nothing owed — not a reaper wake that raises, not a pass that could not take the
reaper's lock, not a settle that fails before its wake."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import DBAPIError

from app.services.after_commit import settle_and_wake
from app.services.notify import AfterCommit
from app.services.reaper import reap_once, reap_pass
from app.store.reaper import REAPER_LOCK
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import app_on
from tests.support.clock import expire_leases
from tests.support.concurrency import connect, states
from tests.support.contracts import contract
from tests.support.scenes import running_on_n1_and_one_queued
from tests.support.submitter import submit


def _debt(sql) -> list[str]:
    return [r[0] for r in sql.execute("select reason from wake_debt")]


def test_a_reaper_wake_that_raises_leaves_a_wake_debt(fresh_db_url, tmp_path):
    keys = {"database.statement_timeout_seconds": 0.5}
    with app_on(fresh_db_url, tmp_path / "r", **keys) as app, connect(fresh_db_url) as sql:
        client = app.test_client()
        client.environ_base["HTTP_AUTHORIZATION"] = "Bearer test-token-of-the-mediator-long-enough"
        running_on_n1_and_one_queued(client)
        expire_leases(sql, "run-a")
        with connect(fresh_db_url) as blocker:
            # An operator's migration holds the reservations table: the wake's scan reads it
            # under its statement timeout and raises.
            blocker.execute("begin")
            blocker.execute("lock table reservations in access exclusive mode")
            with pytest.raises(DBAPIError):
                reap_pass(app.extensions["mediator"])
            blocker.execute("rollback")
        assert states(sql, ["run-a", "run-b"]) == {"run-a": "FAILED", "run-b": "QUEUED"}
        assert _debt(sql) != []
        # The next pass pays it.
        assert reap_pass(app.extensions["mediator"]).woke is True
        assert states(sql, ["run-b"]) == {"run-b": "RUNNING"}
        assert _debt(sql) == []


def test_a_pass_that_cannot_take_the_reaper_lock_keeps_the_debt_it_saw(ctx, sql):
    assert sql.execute("select pg_try_advisory_lock(%s)", (REAPER_LOCK,)).fetchone()[0]
    try:
        # Another reaper holds the lock: this pass is skipped, and the failure it owed a scan
        # for is still owed at its next turn.
        assert reap_once(ctx, previous_failed=True) is True
        assert reap_once(ctx, previous_failed=False) is False
    finally:
        sql.execute("select pg_advisory_unlock(%s)", (REAPER_LOCK,))
    assert reap_once(ctx, previous_failed=True) is False  # the pass ran and scanned


def test_a_settle_that_fails_before_its_wake_still_wakes_or_leaves_something_owed(
    fresh_db_url, tmp_path
):
    keys = {"notify.runs_url": "http://127.0.0.1:9/runs"}
    with app_on(fresh_db_url, tmp_path / "r", **keys) as app, connect(fresh_db_url) as sql:
        ctx = app.extensions["mediator"]
        client = app.test_client()
        client.environ_base["HTTP_AUTHORIZATION"] = "Bearer test-token-of-the-mediator-long-enough"
        advertise(client, "n1", cap("board"))
        submit(client, contract("holder"), 201)
        submit(client, contract("waiter"), 202)
        # The freeing commit (as a cancel makes it), then its after-commit work.
        sql.execute("delete from leases where run_id = 'holder'")
        sql.execute("update runs set state = 'FAILED', ended_at = now() where run_id = 'holder'")
        after = AfterCommit()
        after.released("holder", ["n1"])
        after.settled.append("holder")
        # A half-applied schema change: the settle's read of the ended run (its announcement)
        # fails; reading the queue does not.
        sql.execute("alter table runs rename column verdict to verdict_moved")
        try:
            with pytest.raises(DBAPIError):
                settle_and_wake(ctx, after)
        finally:
            sql.execute("alter table runs rename column verdict_moved to verdict")
        owed = _debt(sql) != []
        assert states(sql, ["waiter"]) == {"waiter": "RUNNING"} or owed
