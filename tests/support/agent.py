"""A node agent's side of the API as functions of a client (thin wrappers over
:class:`tests.support.actors.Node`): advertising, claiming steps
(docs/api.md#post-v1nodesnode_idclaim--the-next-step-for-a-node), reporting their results
(docs/api.md#post-v1runsrun_idstepsseqresult--report-a-steps-result), and a claim long-polling in a
thread of its own."""

from __future__ import annotations

import threading
import time
from typing import Any

from flask import Flask

from tests.support.actors import Node
from tests.support.apps import client_of
from tests.support.concurrency import await_condition


def advertise(client: Any, node_id: str, *caps: dict[str, Any], **body: Any) -> Any:
    """:meth:`Node.advertise` of ``node_id`` over ``client`` (a test client or a live server)."""
    return Node(client, node_id).advertise(*caps, **body)


def claim(client: Any, node: str, instance: str | None = None, wait: float | None = 0) -> Any:
    """:meth:`Node.claim`: ``POST /v1/nodes/{node}/claim``, the response as it is. ``instance``
    goes in the X-Enode-Instance header when given; ``wait=None`` sends no ``wait`` (the
    configured window)."""
    return Node(client, node, instance).claim(wait)


def claimed(client: Any, node: str, instance: str | None = None) -> dict[str, Any]:
    """Claim with ``wait=0``; a step must be handed out (200). Returns the step."""
    return Node(client, node, instance).claimed()


def nothing_to_claim(client: Any, node: str) -> bool:
    return claim(client, node).status_code == 204


def report(
    client: Any, run_id: str, seq: int, node: str, *, exit_code: int | None = 0, **body: Any
) -> Any:
    """:meth:`Node.report`: ``POST /v1/runs/{run_id}/steps/{seq}/result`` by ``node``, the
    response as it is; ``exit_code=None`` leaves the exit code out."""
    return Node(client, node).report(run_id, seq, exit_code=exit_code, **body)


def done(client: Any, run_id: str, seq: int, node: str, **body: Any) -> dict[str, Any]:
    """:func:`report` of a step already claimed; it must be accepted (200). Returns the reply."""
    return Node(client, node).done(run_id, seq, **body)


def put_blob(client: Any, run_id: str, seq: int, name: str, data: bytes) -> int:
    """``PUT`` a blob of a step as its agent does; returns the status code."""
    status: int = Node(client, "").put_blob(run_id, seq, name, data).status_code
    return status


def run_step(
    client: Any, node: str, run_id: str, seq: int, instance: str | None = None
) -> dict[str, Any]:
    """Claim the next step of ``node``, which must be step ``seq`` of ``run_id``, and report it
    done with exit code 0. Returns the result's reply."""
    return Node(client, node, instance).run_step(run_id, seq)


class WaitingClaim:
    """A claim long-polling in its own thread, on a client of its own; ``done`` is set once its
    answer is back."""

    def __init__(
        self, app: Flask, node: str, instance: str | None = None, wait: float | None = 10
    ) -> None:
        self.client = client_of(app)
        self.node, self.instance, self.wait = node, instance, wait
        self.done = threading.Event()
        self.resp: Any = None
        self.error: BaseException | None = None
        self.started = self.answered = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.started = time.monotonic()
        try:
            self.resp = claim(self.client, self.node, self.instance, self.wait)
        except BaseException as exc:
            self.error = exc
        finally:
            self.answered = time.monotonic()
            self.done.set()

    def begin(self) -> WaitingClaim:
        """Send the claim and return at once (the caller awaits what it looks for)."""
        self.thread.start()
        return self

    def start(self, ctx: Any) -> WaitingClaim:
        before = ctx.claims.waiting()
        self.thread.start()
        # The claim registers with the process's listener before its first look; once the
        # listener is connected too (it wakes every waiter when it connects), a notification
        # cannot be missed, and only a notification or the slow re-check can wake this claim.
        await_condition(
            lambda: ctx.claims.waiting() > before or self.done.is_set(), "claim to wait"
        )
        await_condition(ctx.claims.connected.is_set, "claim listener to connect")
        return self

    def result(self, timeout: float = 15.0) -> Any:
        assert self.done.wait(timeout), "the waiting claim never answered"
        if self.error is not None:
            raise self.error
        return self.resp
