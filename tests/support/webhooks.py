"""A webhook endpoint for tests: a real local HTTP server that takes each POST and holds it without
replying until the test releases it (a dead endpoint behind a proxy that accepts connections)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SENDERS = 4  # app.services.notify.SENDERS: the senders post_webhook's queues have


class HangingHook:
    """Takes every POST, keeps its JSON body, and holds the request without replying until
    :meth:`close` (a dead endpoint behind a proxy that accepts connections)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.bodies: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with hook._lock:
                    hook.bodies.append(body)
                hook.release.wait(600)  # until the test releases or closes it
                try:
                    self.send_response(204)
                    self.end_headers()
                except OSError:
                    pass  # the sender gave up waiting

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def received(self) -> int:
        with self._lock:
            return len(self.bodies)

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
        self.server.shutdown()
        self.server.server_close()
