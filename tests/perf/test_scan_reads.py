"""A wake scan's reads are bounded by shapes, not by the queue (docs/design.md#the-queue,
docs/design.md#priorities-and-reservations), and so are a queued submit's (its place in the queue
comes from kept counts: docs/queue.md#what-a-queued-runs-view-explains): every read statement one
scan sends is replayed under ``EXPLAIN (ANALYZE, BUFFERS)`` and the rows each plan node touched
(returned plus removed by a filter, times its loops) are summed. With 1k and then 100k QUEUED runs
of the same three shapes, no statement may touch more rows at 100k than at 1k, give or take a few
(an index one level deeper, ties in the planner's estimates).

The 100k rows are copies of real queued runs, made by one ``INSERT … SELECT generate_series``;
every node is busy, so the scans promote nothing and the two measurements send the same
statements; the oldest runs have waited past ``queue.reserve_after_seconds`` so the reservation
step runs too.
"""

from __future__ import annotations

from typing import Any

from app.services.expected import QueuedShapes
from app.services.queue import wake_queued
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import app_on, client_of
from tests.support.concurrency import connect
from tests.support.contracts import contract, role
from tests.support.reads import SLACK, copy_queued, reads_sent, touched
from tests.support.submitter import submit


def scan_reads(app: Any) -> list[tuple[str, int]]:
    """(statement, rows touched) of every read one wake scan sends, in order."""
    ctx = app.extensions["mediator"]
    reports = []
    sent = reads_sent(app, lambda: reports.append(wake_queued(ctx, "measure")))
    report = reports[0]
    assert not report.skipped and report.promoted == [] and report.errors == 0
    return touched(app, sent)


# Runs wait this long before they count as aged
# (docs/priorities.md#reservations-a-bound-on-how-long-a-wide-run-waits): the aged shape's copies
# are an hour old, and the others are far from aging however long the test takes on a slow machine
# (with 60 s, the runs created at its start aged during it, and the aged read returned more of them
# at 100k than at 1k).
RESERVE_AFTER_SECONDS = 1800


def test_a_scan_reads_no_more_rows_with_100k_queued_runs_than_with_1k(fresh_db_url, tmp_path):
    with app_on(
        fresh_db_url, tmp_path / "r", **{"queue.reserve_after_seconds": RESERVE_AFTER_SECONDS}
    ) as app:
        # Each queued submit reads the process's list of queued shapes (read at most once a
        # second otherwise): both submits compared below send the same statements.
        app.extensions["mediator"].estimate_shapes = QueuedShapes(fresh_seconds=0)
        client = client_of(app)
        with connect(fresh_db_url) as sql:
            advertise(client, "b1", cap())
            advertise(client, "b2", cap())
            advertise(client, "s1", cap("scope"))
            submit(client, contract("busy-1", role("dut")), 201)
            submit(client, contract("busy-2", role("dut")), 201)
            submit(client, contract("busy-s", role("m", "scope")), 201)
            shapes = {
                "one": contract("one", role("dut")),
                "two": contract("two", role("duts", count=2)),
                "scope": contract("scope", role("m", "scope")),
            }
            for doc in shapes.values():
                submit(client, doc, 202)

            def grow(total: int) -> None:
                for i, name in enumerate(shapes):
                    have = sql.execute(
                        "select count(*) from runs where run_id like %s", (name + "%",)
                    ).fetchone()[0]
                    copy_queued(sql, name, have, total // 3 - have, aged=(i == 0))

            def submitted(run_id: str) -> list[tuple[str, int]]:
                """The reads of a queued submit (its cost does not follow the queue either:
                docs/design.md#targets), and its place in the queue checked against a count of the
                queue."""
                doc = contract(run_id, role("m", "scope"))
                sent = reads_sent(app, lambda: submit(client, doc, 202))
                ahead = sql.execute(
                    "select count(*) from runs where state = 'QUEUED' and run_id <> %s", (run_id,)
                ).fetchone()[0]
                assert client.get(f"/v1/runs/{run_id}").get_json()["queue"]["ahead"] == ahead
                return touched(app, sent)

            grow(1_000)
            wake_queued(app.extensions["mediator"], "warm up")  # writes the reservations
            small = scan_reads(app)
            small_submit = submitted("new-at-1k")
            grow(100_000)
            wake_queued(app.extensions["mediator"], "warm up")
            large = scan_reads(app)
            large_submit = submitted("new-at-100k")
            queued = sql.execute("select count(*) from runs where state = 'QUEUED'").fetchone()[0]
            assert queued >= 99_000
        for small_reads, large_reads in ((small, large), (small_submit, large_submit)):
            assert [s for s, _ in large_reads] == [s for s, _ in small_reads]
            grown = [
                (s, a, b)
                for (s, a), (_, b) in zip(small_reads, large_reads, strict=True)
                if b > a + SLACK
            ]
            assert grown == [], "\n".join(f"{a} -> {b} rows: {s}" for s, a, b in grown)
