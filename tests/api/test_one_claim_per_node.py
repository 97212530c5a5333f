"""One caller cannot hold the server
(docs/api.md#post-v1nodesnode_idclaim--the-next-step-for-a-node, and "One caller cannot hold the
server" in docs/security.md#input-and-load): per process, a newer claim of a node answers the older
waiting one with 204 at once, unless the older has already taken a step (it returns that step) or
started less than a second ago (then both wait); a claim for a node without a live advert waits at
most a second.

Nothing here depends on the machine's speed: a claim's age is read from the process's own
listener (``ctx.claims.ages``), waits are on threads and Events, and bounds on time are only
loose upper bounds far below the windows the claims asked for.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from app import listener as claim_listener
from app.services import results as results_service
from tests.support.actors import cap
from tests.support.agent import WaitingClaim, advertise, claim
from tests.support.concurrency import await_condition
from tests.support.contracts import contract, role, two_free_steps
from tests.support.submitter import submit

WINDOW = 30.0  # what each claim asks to wait; answered long before it, or the rule failed
PROMPT = 10.0  # a loose bound for "at once" on a loaded machine, far below WINDOW


# The safety-net re-check far above every bound here: only the rule answers a claim early.
pytestmark = pytest.mark.config({"claim.recheck_seconds": 60.0})


def waited_a_second(ctx: Any, node: str) -> None:
    """Until the oldest waiting claim of ``node`` has waited at least a second, by the process's
    own clock."""
    await_condition(
        lambda: any(age >= 1.0 for age in ctx.claims.ages(node)), f"a claim of {node} 1 s old"
    )


def test_a_newer_claim_answers_an_older_waiting_one_with_204_at_once(app, client, ctx):
    advertise(client, "n1", cap())
    older = WaitingClaim(app, "n1", "i1", wait=WINDOW).start(ctx)
    waited_a_second(ctx, "n1")

    newer = WaitingClaim(app, "n1", "i1", wait=WINDOW).begin()

    resp = older.result(PROMPT)
    assert resp.status_code == 204 and resp.data == b""
    assert older.answered - older.started < PROMPT
    assert not newer.done.is_set()
    await_condition(lambda: ctx.claims.waiting() == 1, "the newer claim waiting alone")
    submit(client, contract("run-1", role("dut")), 201)
    got = newer.result(PROMPT)
    assert got.status_code == 200 and got.get_json()["step_id"] == "run-1#01"


def test_a_newer_claim_from_another_instance_answers_the_older_one_too(app, client, ctx):
    advertise(client, "n1", cap())
    older = WaitingClaim(app, "n1", "boot-1", wait=WINDOW).start(ctx)
    waited_a_second(ctx, "n1")

    newer = claim(client, "n1", "boot-2", wait=0)

    assert newer.status_code == 204
    assert older.result(PROMPT).status_code == 204
    assert older.answered - older.started < PROMPT


def test_a_waiting_claim_is_not_answered_by_a_newer_claim_of_another_node(app, client, ctx):
    advertise(client, "n1", cap(slot="a"))
    advertise(client, "n2", cap(slot="b"))
    other = WaitingClaim(app, "n2", "i2", wait=WINDOW).start(ctx)
    waited_a_second(ctx, "n2")

    assert claim(client, "n1", "i1", wait=0).status_code == 204

    assert not other.done.is_set() and len(ctx.claims.ages("n2")) == 1
    submit(client, contract("run-1", role("dut", slot="b")), 201)
    resp = other.result(PROMPT)
    assert resp.status_code == 200 and resp.get_json()["step_id"] == "run-1#01"


def test_an_older_claim_younger_than_a_second_keeps_waiting_beside_the_newer(
    app, client, ctx, monkeypatch
):
    # "Less than a second" made long enough that no machine is slow enough to cross it here.
    monkeypatch.setattr(claim_listener, "SUPERSEDE_AFTER_SECONDS", 600.0)
    advertise(client, "n1", cap())
    older = WaitingClaim(app, "n1", wait=WINDOW).start(ctx)

    newer = WaitingClaim(app, "n1", wait=WINDOW).begin()
    await_condition(lambda: len(ctx.claims.ages("n1")) == 2, "both claims waiting")

    assert not older.done.is_set() and not newer.done.is_set()
    submit(client, two_free_steps("run-1"), 201)
    steps = {older.result(PROMPT).get_json()["step_id"], newer.result(PROMPT).get_json()["step_id"]}
    assert steps == {"run-1#01", "run-1#02"}


def test_an_older_claim_that_has_taken_a_step_returns_it_when_a_newer_one_comes(
    app, client, ctx, monkeypatch
):
    advertise(client, "n1", cap())
    # The older claim is held just after its step is taken, before its answer is built.
    taken, release = threading.Event(), threading.Event()
    body_of = results_service.claim_body

    def held_after_taking(*args: Any) -> dict[str, Any]:
        if not taken.is_set():
            taken.set()
            assert release.wait(PROMPT)
        return body_of(*args)

    monkeypatch.setattr(results_service, "claim_body", held_after_taking)
    older = WaitingClaim(app, "n1", "i1", wait=WINDOW).start(ctx)
    waited_a_second(ctx, "n1")
    submit(client, contract("run-1", role("dut")), 201)
    assert taken.wait(PROMPT)

    newer = WaitingClaim(app, "n1", "i2", wait=1).begin()
    await_condition(lambda: len(ctx.claims.ages("n1")) == 2, "the newer claim waiting")
    release.set()

    resp = older.result(PROMPT)
    assert resp.status_code == 200 and resp.get_json()["step_id"] == "run-1#01"
    assert newer.result(PROMPT).status_code == 204


@pytest.mark.parametrize("advert", ["never", "expired"])
def test_a_claim_for_a_node_without_a_live_advert_waits_at_most_a_second(
    app, client, ctx, sql, advert
):
    if advert == "expired":
        advertise(client, "n1", cap())
        sql.execute("update nodes set expires_at = now() - interval '1 second'")

    waiting = WaitingClaim(app, "n1", "i1", wait=WINDOW).start(ctx)

    resp = waiting.result(PROMPT)
    assert resp.status_code == 204
    assert waiting.answered - waiting.started < PROMPT


def test_a_node_whose_advert_expired_still_gets_a_step_of_its_lease(client, sql):
    advertise(client, "n1", cap())
    submit(client, contract("run-1", role("dut")), 201)
    sql.execute("update nodes set expires_at = now() - interval '1 second'")

    resp = claim(client, "n1", "i1", wait=WINDOW)

    assert resp.status_code == 200 and resp.get_json()["step_id"] == "run-1#01"
