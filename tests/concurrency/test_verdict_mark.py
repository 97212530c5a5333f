"""The mark follows the commit that frees (docs/queue.md, "Which commit frees, and its mark"): a
run that ends through VERIFYING frees its nodes in its verdict's commit, after the result's
commit. A submit that read the fleet between the two, and whose QUEUED row became visible only
after the holder's wake had scanned, must still find its node: the holder's mark after its
verdict's commit makes the submit scan.

The window is held open with row locks, not timing: a lock on the holder's lease keeps its
verdict from deleting it while the submit reads, and an uncommitted row with the submit's run_id
keeps the submit's insert waiting until the holder's wake has scanned."""

from __future__ import annotations

import threading
from typing import Any

from tests.support.actors import Node, cap
from tests.support.agent import advertise
from tests.support.apps import client_of
from tests.support.concurrency import (
    JOIN_TIMEOUT,
    await_condition,
    backends_waiting_on_locks,
    connect,
    lease_runs,
    states,
    submit_held_after_its_read,
)
from tests.support.contracts import one_step
from tests.support.submitter import submit


def test_a_submit_read_between_a_result_and_its_verdict_is_placed_once_the_verdict_frees(
    app: Any, client: Any, sql: Any, db_url: str
) -> None:
    advertise(client, "b1", cap("board"))
    submit(client, one_step("holder"), 201)
    node = Node(client, "b1")
    node.claimed()
    result: dict[str, Any] = {}
    reporter = threading.Thread(
        target=lambda: result.update(reply=Node(client_of(app), "b1").report("holder", 1)),
        daemon=True,
    )
    with connect(db_url) as lease_lock, connect(db_url) as watcher:
        lease_lock.execute("begin")
        lease_lock.execute("select 1 from leases where node_id = 'b1' for update")
        reporter.start()
        # The result has committed (the run is VERIFYING) and its verdict waits to delete the
        # lease: the holder still holds b1 as far as any reader sees.
        await_condition(
            lambda: backends_waiting_on_locks(watcher) == 1,
            "the holder's verdict waiting to delete its lease",
        )
        assert states(sql, ["holder"]) == {"holder": "VERIFYING"}
        with submit_held_after_its_read(
            app, sql, db_url, one_step("late"), others_waiting=1
        ) as answer:
            # The submit read b1 busy and waits to insert its row. The verdict now deletes the
            # lease, and the holder's wake scans a queue without the submit's run in it.
            lease_lock.execute("rollback")
            reporter.join(JOIN_TIMEOUT)
            assert not reporter.is_alive()
            assert result["reply"].status_code == 200
            assert states(sql, ["holder"]) == {"holder": "SUCCEEDED"}
    resp = answer["resp"]
    assert resp.status_code == 201, resp.get_json()
    assert states(sql, ["late"]) == {"late": "RUNNING"}
    assert lease_runs(sql, "late") == ["b1"]
