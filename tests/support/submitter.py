"""A submitter's side of the API as functions of a client (thin wrappers over
:class:`tests.support.actors.Submitter`): submitting a contract and reading a run's state, over
Flask's test client or a live server alike, and awaiting a state another process moves it to."""

from __future__ import annotations

from typing import Any

from tests.support.actors import Submitter


def submit(
    client: Any, doc: dict[str, Any], status: int | None = None, principal: str | None = None
) -> Any:
    """:meth:`Submitter.submit` over ``client``: the reply, its status asserted when given;
    ``principal`` goes in ``X-Enode-Principal`` when given."""
    return Submitter(client, principal).submit(doc, status)


def state_of(client: Any, run_id: str) -> str:
    return Submitter(client).state_of(run_id)


def run_view(server: Any, run_id: str) -> dict[str, Any]:
    """:meth:`Submitter.view`: ``GET /v1/runs/{run_id}``, which must answer 200."""
    return Submitter(server).view(run_id)


def await_state(server: Any, run_id: str, *states: str, timeout: float = 20.0) -> dict[str, Any]:
    """:meth:`Submitter.wait_for_state`: the run's view once it is in one of ``states``."""
    return Submitter(server).wait_for_state(run_id, *states, timeout=timeout)


def step_state(client: Any, run_id: str, seq: int) -> str:
    """The state of step ``seq`` of the run, as its view shows it."""
    steps = Submitter(client).view(run_id)["steps"]
    return str(next(st["state"] for st in steps if st["seq"] == seq))
