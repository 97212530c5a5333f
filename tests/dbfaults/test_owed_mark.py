"""A wake mark that could not be taken is owed, and paid at the process's next use of the
database (docs/queue.md#which-commit-frees-and-its-mark). The database (a server of the test's
own) goes down right after a cancel's freeing commit, before its mark: the mark, the wake and the
wake debt all fail. Once the server is back, the next request of that process, a plain read,
pays what it owes: a mark, then a scan, which promotes the run waiting for the freed node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import app.services.cancel as cancel_service
from tests.dbfaults.server import RestartablePostgres
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import app_on, client_of
from tests.support.concurrency import connect, states
from tests.support.contracts import one_step
from tests.support.submitter import submit


def test_a_mark_lost_with_the_database_is_paid_by_the_next_request_once_it_is_back(
    own_server: RestartablePostgres,
    clean_db: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with app_on(clean_db, tmp_path / "records", **{"database.pool_timeout": 2}) as app:
        client = client_of(app)
        ctx = app.extensions["mediator"]
        advertise(client, "b1", cap("board"))
        submit(client, one_step("holder"), 201)
        submit(client, one_step("waiter"), 202)
        original = cancel_service.fault

        def down_after_the_commit(point: str) -> None:
            original(point)
            if point == "cancel.after_commit":
                own_server.down()

        monkeypatch.setattr(cancel_service, "fault", down_after_the_commit)
        try:
            client.post("/v1/runs/holder/cancel")
        finally:
            if not own_server.is_up:
                own_server.up()
        monkeypatch.setattr(cancel_service, "fault", original)
        assert ctx.owed.is_set()
        with connect(clean_db) as sql:
            # The cancel committed; nothing scanned after it and nothing recorded a debt.
            assert states(sql, ["holder", "waiter"]) == {"holder": "FAILED", "waiter": "QUEUED"}
            assert sql.execute("select count(*) from leases").fetchone()[0] == 0
            assert sql.execute("select count(*) from wake_debt").fetchone()[0] == 0

            resp: Any = None
            # The first request after the restart may meet a dead pooled connection.
            for _ in range(3):
                resp = client.get("/v1/runs/waiter")
                if not ctx.owed.is_set():
                    break
            assert not ctx.owed.is_set()
            assert resp is not None
            assert states(sql, ["waiter"]) == {"waiter": "RUNNING"}
            assert [r[0] for r in sql.execute("select run_id from leases")] == ["waiter"]
