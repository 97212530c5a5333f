"""Closing the submit window (docs/queue.md#on-submit-placed-queued-or-rejected): the reply is
chosen by re-reading the run after the submit's own wake scan. A run that scan promoted and that
ended at once (every step settled inside its promotion) was placed: it is answered 201 with its
final view, never 202 (a 202 says "queued" and would carry a final state)."""

from __future__ import annotations

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.concurrency import states, submit_held_after_its_read
from tests.support.contracts import crossing_acquires, one_step
from tests.support.submitter import submit


def test_a_run_promoted_by_its_submit_scan_and_ended_before_the_re_read_is_answered_201(
    app, client, sql, db_url
):
    advertise(client, "n1", cap("board"))
    advertise(client, "s1", cap("scope"))
    submit(client, one_step("holder"), 201)
    with submit_held_after_its_read(app, sql, db_url, crossing_acquires("instant")) as answer:
        # The submit read n1 busy. n1 frees now: the cancel's own scan runs before the queued
        # row is visible, and its wake mark makes the submit scan after its commit.
        assert client.post("/v1/runs/holder/cancel").status_code == 200

    resp = answer["resp"]
    assert states(sql, ["instant"]) == {"instant": "SUCCEEDED"}
    assert resp.status_code == 201, resp.get_json()
    assert resp.get_json()["state"] == "SUCCEEDED"
