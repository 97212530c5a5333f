"""The API's callers as actors (in the spirit of the Flask tutorial's ``AuthActions``): a
:class:`Node` agent advertises, claims and reports its steps, a :class:`Submitter` submits, cancels
and follows runs, an :class:`Answerer` answers asks. A test says what the actor does, not how its
request is built.

Every actor talks through one small :class:`Transport` with two backends: :class:`ClientTransport`
over Flask's test client (or anything with its ``post``/``get``/``put``), and
:class:`HttpTransport` over HTTP to a live server's base URL with the token header. An actor takes
either backend, or what :func:`transport_of` turns into one (a test client, a Flask app, a
:class:`~tests.support.apps.LiveServer`).

Replies are those of the backend as they are (Flask's ``TestResponse`` or ``requests.Response``);
:func:`json_of` reads the JSON body of either."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import requests
from flask import Flask

from tests.support.apps import TOKEN, LiveServer, client_of
from tests.support.concurrency import await_condition

HTTP_TIMEOUT = 30.0  # seconds; a safety net far above a busy machine's replies


@dataclass(frozen=True)
class Call:
    """One request to the Mediator: its method, path (and query), JSON or raw body, headers."""

    method: str
    path: str
    json: Any = None
    data: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class Transport(Protocol):
    """Sends one :class:`Call`, the token already attached; returns the reply as it is."""

    def send(self, call: Call) -> Any: ...


class ClientTransport:
    """Flask's test client (which carries the token, :func:`tests.support.apps.client_of`), or an
    object with the same ``post``/``get``/``put`` methods (the HTTPS client of
    tests/support/http.py)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def send(self, call: Call) -> Any:
        # Only the arguments given: a look-alike's put() takes no json, its post() no data.
        kwargs: dict[str, Any] = {"headers": dict(call.headers)}
        if call.json is not None:
            kwargs["json"] = call.json
        if call.data is not None:
            kwargs["data"] = call.data
        return getattr(self.client, call.method.lower())(call.path, **kwargs)


class HttpTransport:
    """HTTP to a live server at ``base`` (``http://127.0.0.1:port``), ``Authorization: Bearer``
    ``token`` on every request; a new connection per request, so that gunicorn hands each to
    whichever worker accepts it."""

    def __init__(
        self,
        base: str,
        token: str | None = TOKEN,
        headers: Callable[..., dict[str, str]] | None = None,
    ) -> None:
        self.base = base.rstrip("/")
        self.token = token
        self.headers = headers  # a live server's own (a test may give it another token)

    def send(self, call: Call) -> requests.Response:
        if self.headers is not None:
            sent = self.headers(**call.headers)
        else:
            sent = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            sent.update(call.headers)
        return requests.request(
            call.method,
            self.base + call.path,
            json=call.json,
            data=call.data,
            headers=sent,
            timeout=HTTP_TIMEOUT,
        )


def transport_of(caller: Any) -> Transport:
    """The transport of ``caller``: a transport as it is, a live server over HTTP, a Flask app
    over a test client of its own, a test client (or look-alike) as it is."""
    if isinstance(caller, Transport):
        return caller
    if isinstance(caller, LiveServer):
        server = caller  # its headers read at each request: a test may swap them
        return HttpTransport(caller.url, headers=lambda **extra: server.headers(**extra))
    if isinstance(caller, Flask):
        return ClientTransport(client_of(caller))
    return ClientTransport(caller)


def json_of(resp: Any) -> Any:
    """The JSON body of a reply of either backend (``None`` when it has none)."""
    if hasattr(resp, "get_json"):
        return resp.get_json()
    return resp.json() if resp.content else None


def expect(resp: Any, status: int) -> Any:
    """Assert the reply's status (showing its body otherwise); returns its JSON body."""
    assert resp.status_code == status, (resp.status_code, json_or_text(resp))
    return json_of(resp)


def json_or_text(resp: Any) -> Any:
    """What to show of a reply that was not the one expected."""
    try:
        return json_of(resp)
    except ValueError:
        return getattr(resp, "text", resp)


def _with_principal(principal: str | None, headers: Mapping[str, str] | None) -> dict[str, str]:
    sent = {"X-Enode-Principal": principal} if principal else {}
    sent.update(headers or {})
    return sent


class Actor:
    """A caller of the API over the transport of ``caller`` (:func:`transport_of`)."""

    def __init__(self, caller: Any) -> None:
        self.transport = transport_of(caller)

    def _send(self, method: str, path: str, **call: Any) -> Any:
        return self.transport.send(Call(method, path, **call))


class Node(Actor):
    """A node agent (docs/api.md#node-agents): advertises its capabilities, claims steps, reports
    their results, uploads their logs and blobs. ``instance`` goes in ``X-Enode-Instance`` when
    given."""

    def __init__(self, caller: Any, node_id: str, instance: str | None = None) -> None:
        super().__init__(caller)
        self.node_id = node_id
        self.instance = instance

    def advertise(self, *caps: dict[str, Any], **body: Any) -> Any:
        """``POST /v1/nodes`` (``capabilities`` default: one board); it must be accepted (200).
        ``instance`` is this node's unless ``body`` names one. Returns the reply's JSON."""
        payload: dict[str, Any] = {"node_id": self.node_id}
        if self.instance is not None:
            payload["instance"] = self.instance
        payload.update({"capabilities": list(caps) or [cap()], **body})
        return expect(self._send("POST", "/v1/nodes", json=payload), 200)

    def claim(self, wait: float | None = 0, instance: str | None = None) -> Any:
        """``POST /v1/nodes/{node}/claim``: the reply as it is; ``wait=None`` sends no ``wait``
        (the configured window)."""
        instance = instance or self.instance
        headers = {"X-Enode-Instance": instance} if instance else {}
        query = "" if wait is None else f"?wait={wait}"
        return self._send("POST", f"/v1/nodes/{self.node_id}/claim{query}", headers=headers)

    def claimed(self, wait: float | None = 0, instance: str | None = None) -> dict[str, Any]:
        """A claim that must hand out a step (200). Returns the step."""
        step: dict[str, Any] = expect(self.claim(wait, instance), 200)
        return step

    def report(self, run_id: str, seq: int, *, exit_code: int | None = 0, **body: Any) -> Any:
        """``POST /v1/runs/{run_id}/steps/{seq}/result``: the reply as it is. The body is
        ``{"node", "exit_code", "produced": [], **body}``; ``exit_code=None`` leaves the exit
        code out (a step that did not get as far as an exit code)."""
        payload: dict[str, Any] = {"node": self.node_id}
        if exit_code is not None:
            payload["exit_code"] = exit_code
        payload.update({"produced": [], **body})
        return self._send("POST", f"/v1/runs/{run_id}/steps/{seq}/result", json=payload)

    def done(self, run_id: str, seq: int, **body: Any) -> dict[str, Any]:
        """:meth:`report` that must be accepted (200). Returns the reply's JSON."""
        reply: dict[str, Any] = expect(self.report(run_id, seq, **body), 200)
        return reply

    def put_blob(self, run_id: str, seq: int, name: str, data: bytes) -> Any:
        """``PUT`` a blob of a step: the reply as it is."""
        return self._send("PUT", f"/v1/runs/{run_id}/steps/{seq}/blob/{name}", data=data)

    def put_log(self, run_id: str, seq: int, data: bytes) -> Any:
        """``PUT`` a step's log: the reply as it is."""
        return self._send("PUT", f"/v1/runs/{run_id}/steps/{seq}/log", data=data)

    def run_step(self, run_id: str, seq: int, wait: float | None = 0) -> dict[str, Any]:
        """Claim the next step, which must be step ``seq`` of ``run_id``, and report it done with
        exit code 0. Returns the result's reply."""
        step = self.claimed(wait)
        assert (step["run_id"], step["seq"]) == (run_id, seq), step
        return self.done(run_id, seq)


class Submitter(Actor):
    """Someone with runs (docs/api.md#submitters): submits contracts, cancels runs, reads and waits
    for a run's state. ``principal`` goes in ``X-Enode-Principal`` when given."""

    def __init__(self, caller: Any, principal: str | None = None) -> None:
        super().__init__(caller)
        self.principal = principal

    def submit(
        self,
        doc: dict[str, Any],
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """``POST /v1/runs``: the reply as it is, its status asserted when ``status`` is given."""
        resp = self._send(
            "POST", "/v1/runs", json=doc, headers=_with_principal(self.principal, headers)
        )
        if status is not None:
            expect(resp, status)
        return resp

    def submitted(self, doc: dict[str, Any], status: int = 201) -> dict[str, Any]:
        """:meth:`submit` with the status asserted; returns the reply's JSON."""
        reply: dict[str, Any] = json_of(self.submit(doc, status))
        return reply

    def cancel(self, run_id: str, headers: Mapping[str, str] | None = None) -> Any:
        """``POST /v1/runs/{run_id}/cancel``: the reply as it is."""
        return self._send(
            "POST", f"/v1/runs/{run_id}/cancel", headers=_with_principal(self.principal, headers)
        )

    def view(self, run_id: str) -> dict[str, Any]:
        """``GET /v1/runs/{run_id}``, which must answer 200."""
        reply: dict[str, Any] = expect(self._send("GET", f"/v1/runs/{run_id}"), 200)
        return reply

    def state_of(self, run_id: str) -> str:
        return str(self.view(run_id)["state"])

    def wait_for_state(self, run_id: str, *states: str, timeout: float = 30.0) -> dict[str, Any]:
        """Read the run until it is in one of ``states`` (another process moves it: there is no
        event to await across processes). Returns the view that showed it."""
        seen: dict[str, Any] = {}

        def reached() -> bool:
            seen.update(self.view(run_id))
            return seen["state"] in states

        await_condition(reached, f"{run_id} to be {' or '.join(states)}", timeout, 0.05)
        return seen


class Answerer(Actor):
    """Someone answering asks (docs/api.md#answerers): lists them and answers one. ``principal``
    goes in ``X-Enode-Principal`` when given."""

    def __init__(self, caller: Any, principal: str | None = None) -> None:
        super().__init__(caller)
        self.principal = principal

    def answer(
        self,
        run_id: str,
        seq: int,
        body: dict[str, Any] | bytes,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """``POST /v1/runs/{run_id}/steps/{seq}/answer`` with ``body`` (a mapping sent as JSON,
        bytes sent as they are, as ``application/json``): the reply as it is."""
        sent = {"Content-Type": "application/json", **_with_principal(self.principal, headers)}
        path = f"/v1/runs/{run_id}/steps/{seq}/answer"
        if isinstance(body, bytes):
            return self._send("POST", path, data=body, headers=sent)
        return self._send("POST", path, json=body, headers=sent)

    def asks(self) -> Any:
        """``GET /v1/asks``: the reply as it is."""
        return self._send("GET", "/v1/asks", headers=_with_principal(self.principal, None))


def cap(capability: str = "board", **attrs: str) -> dict[str, Any]:
    """One capability of an advert."""
    return {"capability": capability, "attrs": dict(attrs)}
