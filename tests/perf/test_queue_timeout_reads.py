"""The reaper's queue-timeout read (docs/queue.md, "Leaving the queue") reads the runs whose
deadline passed, through ``ix_runs_queue_deadline``, not every QUEUED run that has a timeout: with
5,000 QUEUED runs whose timeout is far off and 3 past it, the read touches about 3 rows."""

from __future__ import annotations

from app.store.queue import timed_out_queued
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import app_on, client_of
from tests.support.concurrency import connect
from tests.support.contracts import contract, role
from tests.support.reads import SLACK, copy_queued, reads_sent, touched
from tests.support.submitter import submit


def test_the_queue_timeout_read_touches_the_timed_out_runs_not_the_queue(fresh_db_url, tmp_path):
    with app_on(fresh_db_url, tmp_path / "r") as app:
        client = client_of(app)
        ctx = app.extensions["mediator"]
        advertise(client, "b1", cap())
        submit(client, contract("busy", role("dut")), 201)
        doc = contract("waits", role("dut"))
        doc["queue"] = {"timeout": "4h"}
        submit(client, doc, 202)
        with connect(fresh_db_url) as sql:
            copy_queued(sql, "waits", 0, 5_000, aged=False)
            sql.execute(
                "update runs set created_at = now() - interval '5 hours'"
                " where run_id in ('waits-1', 'waits-2', 'waits-3')"
            )
            sql.execute("analyze runs")

        def read() -> None:
            with ctx.db.read() as s:
                found.extend(timed_out_queued(s))

        found: list[str] = []
        sent = reads_sent(app, read)
        assert sorted(found) == ["waits-1", "waits-2", "waits-3"]
        reads = touched(app, sent)
        assert len(reads) == 1
        statement, rows = reads[0]
        assert rows <= 3 + SLACK, f"{rows} rows touched: {statement}"
