"""A scan that frees nodes from their reservations frees them like any freeing commit
(docs/queue.md#which-commit-frees-and-its-mark): it takes a wake mark, and a fresh pass reads the
queue after it. A submit that queued after the first pass read the queue, and saw no mark since its
own read, is looked at by that pass."""

from __future__ import annotations

from app.services.queue import wake_queued
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.contracts import contract, role
from tests.support.rows import scalar
from tests.support.submitter import submit


def test_a_scan_that_releases_a_reservation_takes_a_mark_and_reads_the_queue_again(
    client, ctx, sql
):
    advertise(client, "n1", cap("board"))
    submit(client, contract("holder", role("dut")), 201)
    submit(client, contract("waiter", role("dut")), 202)
    # A reservation whose holder is not QUEUED any more: the reservation step removes it.
    sql.execute("insert into reservations (node_id, run_id) values ('n1', 'holder')")
    before = scalar(sql, "select last_value from wake_mark")

    report = wake_queued(ctx, "test")

    assert scalar(sql, "select count(*) from reservations") == 0
    assert scalar(sql, "select last_value from wake_mark") == before + 1
    assert report.passes == 2 and not report.again and report.promoted == []
    # The fresh pass covers the mark the first one took.
    assert scalar(sql, "select last_value from wake_covered") == before + 1


def test_a_scan_that_releases_nothing_takes_no_mark(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("holder", role("dut")), 201)
    submit(client, contract("waiter", role("dut")), 202)
    before = scalar(sql, "select last_value from wake_mark")

    report = wake_queued(ctx, "test")

    assert scalar(sql, "select last_value from wake_mark") == before
    assert report.passes == 1
