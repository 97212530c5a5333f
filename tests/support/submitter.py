"""A submitter's side of the API as functions of a client (thin wrappers over
:class:`tests.support.actors.Submitter`): submitting a contract and reading a run's state, over
Flask's test client or a live server alike."""

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
