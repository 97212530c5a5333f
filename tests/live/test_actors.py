"""The actors of tests/support/actors.py do the same over either backend: Flask's test client and
HTTP with the token to a real gunicorn. One run, end to end: a node advertises, a submitter
submits, the node claims the step, uploads its log and reports it, an answerer answers the ask,
and the submitter sees the run succeed under its principal."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.actors import Answerer, ClientTransport, HttpTransport, Node, Submitter, cap
from tests.support.contracts import contract, role
from tests.support.wire import ASK_STEP

WORK = {"id": "work", "uses": "dut", "run": ["true"]}


def one_run(caller: Any) -> dict[str, Any]:
    """The run through the actors over ``caller``; what each of them saw."""
    node = Node(caller, "board-1", "board-1-i1")
    submitter = Submitter(caller, "ana@lab.test")
    node.advertise(cap("board", soc="imx8mp"))
    placed = submitter.submitted(contract("r1", role("dut"), steps=[WORK, ASK_STEP]))
    step = node.claimed()
    log = node.put_log("r1", step["seq"], b"booted\n").status_code
    reported = node.report("r1", step["seq"]).status_code
    answered = Answerer(caller, "qa@lab.test").answer("r1", 2, {"ok": True}).status_code
    view = submitter.wait_for_state("r1", "SUCCEEDED")
    return {
        "placed": placed["state"],
        "step": (step["run_id"], step["seq"]),
        "log": log,
        "reported": reported,
        "answered": answered,
        "view": (view["state"], view["principal"]),
    }


EXPECTED = {
    "step": ("r1", 1),
    "placed": "RUNNING",
    "log": 200,
    "reported": 200,
    "answered": 200,
    "view": ("SUCCEEDED", "ana@lab.test"),
}


def test_the_actors_over_flasks_test_client_run_a_run_to_its_end(client):
    seen = one_run(client)

    assert seen == EXPECTED
    assert isinstance(Node(client, "n").transport, ClientTransport)


@pytest.mark.slow
def test_the_actors_over_http_to_a_live_server_see_what_they_see_over_the_test_client(
    live_server,
):
    seen = one_run(live_server)

    assert seen == EXPECTED
    assert isinstance(Node(live_server, "n").transport, HttpTransport)
