"""A ``mediator agent`` process of a test (its JSON log lines awaited with a bounded deadline),
a node as the server lists it, and a proxy that loses one claim's answer on its way to the
agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from tests.support.apps import TOKEN, LiveServer
from tests.support.concurrency import await_value
from tests.support.processes import stop

MEDIATOR = Path(sys.executable).parent / "mediator"  # .venv/bin/mediator


def node_view(server: LiveServer, node_id: str) -> dict[str, Any] | None:
    nodes = server.get("/v1/nodes").json()["nodes"]
    return next((n for n in nodes if n["node_id"] == node_id), None)


class AgentProcess:
    """``.venv/bin/mediator agent …`` with JSON log lines in a file of the test."""

    def __init__(
        self,
        url: str | None,
        tmp: Path,
        *args: str,
        env: dict[str, str] | None = None,
        token: bool = True,
    ) -> None:
        """``url`` None: the agent's own configuration says where the Mediator is."""
        self.log_path = tmp / f"agent-{time.monotonic_ns()}.log"
        argv = [str(MEDIATOR), "agent", "--log-format", "json", "--claim-wait", "1"]
        if url:
            argv += ["--url", url]
        if token:
            argv += ["--token", TOKEN]
        argv += ["--work-dir", str(tmp / "work"), *args]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIATOR_")}
        full_env.update(env or {})
        with open(self.log_path, "wb") as err:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=full_env
            )

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"event": line})
        return out

    def events(self) -> list[str]:
        return [line.get("event", "") for line in self.lines()]

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def await_event(self, event: str, timeout: float = 20.0, *, count: int = 1) -> dict[str, Any]:
        """The ``count``-th line of ``event`` the agent logs, once it has logged it."""

        def look() -> dict[str, Any] | None:
            found = [x for x in self.lines() if x.get("event") == event]
            assert self.proc.poll() is None or len(found) >= count, (
                f"the agent exited ({self.proc.returncode}):\n{self.text()[-3000:]}"
            )
            return found[count - 1] if len(found) >= count else None

        return await_value(look, f"the agent to log {event!r} {count} times", timeout)

    def stop(self) -> int:
        if self.proc.poll() is None:
            stop(self.proc)
        return self.proc.returncode


@contextmanager
def agent_on(url: str | None, tmp: Path, *args: str, **kw: Any) -> Iterator[AgentProcess]:
    agent = AgentProcess(url, tmp, *args, **kw)
    try:
        yield agent
    finally:
        agent.stop()


# ---------------------------------------------------------------- a claim answer lost


class LosingProxy:
    """An HTTP proxy in front of the Mediator that forwards everything, except that the answer
    to the first claim handing out a step never reaches the agent: the connection is closed
    instead, as a proxy or a network that failed at that moment would. The Mediator has handed
    the step out all the same."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.lost: list[str] = []  # step ids whose claim answer was lost
        self.delivered: list[str] = []  # step ids of the claim answers that got through
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                skip = {"host", "content-length", "connection", "accept-encoding"}
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                resp = requests.request(
                    self.command, proxy.upstream + self.path, data=body, headers=headers, timeout=90
                )
                if proxy.loses(self.command, self.path, resp):
                    self.close_connection = True
                    return
                self.send_response(resp.status_code)
                for k, v in resp.headers.items():
                    if k.lower() not in {
                        "transfer-encoding",
                        "connection",
                        "content-length",
                        "content-encoding",
                        "date",
                        "server",
                    }:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(resp.content)))
                self.end_headers()
                self.wfile.write(resp.content)

            do_GET = do_POST = do_PUT = forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def loses(self, method: str, path: str, resp: requests.Response) -> bool:
        if method != "POST" or "/claim" not in path or resp.status_code != 200:
            return False
        step_id = resp.json()["step_id"]
        with self._lock:
            if not self.lost:
                self.lost.append(step_id)
                return True
            self.delivered.append(step_id)
            return False

    def __enter__(self) -> LosingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
