"""SPEC §7, closing the submit window: the reply is chosen by re-reading the run after the
submit's own wake scan. A run that scan promoted and that ended at once (every step settled
inside its promotion) was placed: it is answered 201 with its final view, never 202 (a 202 says
"queued" and would carry a final state)."""

from __future__ import annotations

from app.store.gate import SCANNING_LOCK
from tests.api.test_scan_defects import crossing_acquires
from tests.helpers import advertise, cap, one_step, submit
from tests.support.concurrency import (
    Background,
    apps_on,
    await_condition,
    connect,
    lock_waiters,
    scanning_lock_held,
    states,
)


def test_a_run_promoted_by_its_submit_scan_and_ended_before_the_re_read_is_answered_201(
    fresh_db_url, tmp_path
):
    with apps_on(fresh_db_url, tmp_path / "records", 1) as apps, connect(fresh_db_url) as sql:
        c = apps.client(0)
        advertise(c, "n1", cap("board"))
        advertise(c, "s1", cap("scope"))
        submit(c, one_step("holder"), 201)
        with scanning_lock_held(sql):
            # The submit reads n1 busy and queues; its wake waits behind a running scan.
            placing = Background(lambda: c.post("/v1/runs", json=crossing_acquires("instant")))
            await_condition(lambda: lock_waiters(sql, SCANNING_LOCK) == 1, "the submit's wake")
            # n1 frees; the cancel's own wake skips: the submit's is waiting.
            assert c.post("/v1/runs/holder/cancel").status_code == 200
        resp = placing.result(timeout=30)
        assert states(sql, ["instant"]) == {"instant": "SUCCEEDED"}
        assert resp.status_code == 201, resp.get_json()
        assert resp.get_json()["state"] == "SUCCEEDED"
