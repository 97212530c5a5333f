"""Webhook endpoints for tests, all on one test HTTP server (:class:`Endpoint`, a real server on
127.0.0.1 in a thread of this process): a receiver of the runs webhook that keeps each body by
its run (:class:`RunsHook`), and one that takes each POST and holds it without replying until the
test releases it (:class:`HangingHook`, a dead endpoint behind a proxy that accepts connections)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SENDERS = 4  # app.services.notify.SENDERS: the senders post_webhook's queues have


class Request(BaseHTTPRequestHandler):
    """A request to an :class:`Endpoint`; ``body`` is its body, read before the reply."""

    body: bytes


Answer = Callable[[Request], None]


def no_content(h: Request) -> None:
    """The reply of an endpoint that took the request: 204."""
    h.send_response(204)
    h.end_headers()


class Endpoint:
    """A real HTTP server on 127.0.0.1: ``answer(request)`` decides each request's reply (204 by
    default). Keeps what every request asked for (method and path) and the JSON bodies, before
    the reply; ``arrived`` is set at the first request."""

    def __init__(self, answer: Answer | None = None) -> None:
        self.requests: list[tuple[str, str]] = []
        self.bodies: list[Any] = []
        self.arrived = threading.Event()
        self._lock = threading.Lock()
        endpoint = self
        reply = answer or no_content

        class Handler(Request):
            def _take(self) -> None:
                self.body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with endpoint._lock:
                    endpoint.requests.append((self.command, self.path))
                    if self.body:
                        endpoint.bodies.append(json.loads(self.body))
                endpoint.arrived.set()
                reply(self)

            do_POST = do_GET = do_PUT = _take

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def received(self) -> int:
        """How many bodies have arrived."""
        with self._lock:
            return len(self.bodies)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class HangingHook(Endpoint):
    """Takes every POST, keeps its JSON body, and holds the request without replying until
    :meth:`close` (a dead endpoint behind a proxy that accepts connections)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        super().__init__(self._hang)
        self.url = f"{self.origin}/hooks"

    def _hang(self, h: Request) -> None:
        self.release.wait(600)  # until the test releases or closes it
        try:
            no_content(h)
        except OSError:
            pass  # the sender gave up waiting

    def seqs(self) -> list[int]:
        with self._lock:
            return sorted(b["n"] for b in self.bodies if "n" in b)

    def wait_for(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.received() < count:
            assert time.monotonic() < deadline, f"{self.received()} of {count} posts arrived"
            time.sleep(0.01)

    def close(self) -> None:
        self.release.set()
        super().close()


class RunsHook:
    """A receiver of the ``notify.runs_url`` POSTs on an :class:`Endpoint`; keeps each JSON body
    by its ``run_id`` once it has replied."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrived: dict[str, threading.Event] = {}
        self.bodies: dict[str, list[dict[str, Any]]] = {}
        self.endpoint = Endpoint(self._take)
        self.url = f"{self.endpoint.origin}/runs"

    def _take(self, h: Request) -> None:
        no_content(h)
        body = json.loads(h.body)
        run_id = str(body.get("run_id"))
        with self._lock:
            self.bodies.setdefault(run_id, []).append(body)
        self.arrival(run_id).set()

    def arrival(self, run_id: str) -> threading.Event:
        """Set once a body for ``run_id`` has been received."""
        with self._lock:
            return self._arrived.setdefault(run_id, threading.Event())

    def close(self) -> None:
        self.endpoint.close()
