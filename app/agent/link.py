"""The agent's HTTP to the Mediator, through :mod:`app.httpclient` (the standard library only: a
node carries no extra client).

Every call answers an :class:`Answer`, whatever its status (the caller decides what a 4xx or a
5xx means for it); a Mediator that cannot be reached raises :class:`Unreachable`. The retries and
their backoff are the callers' (app/agent/loop.py, app/agent/step.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import IO, Any

from app.httpclient import Connection, ConnectionFailed, Response, error_reason, quote

REQUEST_TIMEOUT = 30.0  # every call but the long poll, whose own window comes on top


class Unreachable(Exception):
    """No answer: the connection failed, broke or timed out."""


class Answer(Response):
    """An answer of any status, read by the agent."""

    @property
    def refused(self) -> bool:
        """A 4xx: the Mediator took the request and said no; the same request gets the same no."""
        return 400 <= self.status < 500

    def reason(self) -> str:
        """The reason of the Mediator's error body, else the start of the body."""
        return error_reason(self.body) or self.body[:200].decode("utf-8", "replace")

    def server_time(self) -> datetime | None:
        """The Mediator's clock at its answer (the Date header): lease times are the database's,
        so a deadline is measured from this, not from the node's own clock."""
        text = self.header("Date")
        if not text:
            return None
        try:
            return parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None


segment = quote  # one path segment: a run id or an artifact name, whatever characters it holds


class Link:
    """The Mediator at ``url``. Every call opens its own connection (``Connection: close``): the
    agent's threads (claims, log uploads, blobs) call at once, and no proxy of the environment is
    used and no redirect followed: the agent talks to the Mediator it was given."""

    def __init__(self, url: str, token: str | None, principal: str | None, instance: str) -> None:
        self.url = url.rstrip("/")
        self.instance = instance
        self._headers = {"User-Agent": "mediator-agent"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        if principal:
            self._headers["X-Enode-Principal"] = principal

    def call(
        self,
        method: str,
        path: str,
        *,
        doc: Any = None,
        data: bytes | IO[bytes] | None = None,
        length: int | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = REQUEST_TIMEOUT,
    ) -> Answer:
        all_headers = dict(headers or {})
        if doc is None and data is not None:
            all_headers.setdefault("Content-Type", "application/octet-stream")
        if length is not None:
            all_headers["Content-Length"] = str(length)
        try:
            conn = Connection(self.url, timeout=timeout, headers=self._headers, keep_alive=False)
            got = conn.request(method, path, doc=doc, body=data, headers=all_headers)
        except ValueError as exc:
            raise Unreachable(f"{method} {path}: {exc}") from None
        except ConnectionFailed as exc:
            reason = getattr(exc.cause, "reason", None) or exc.cause
            raise Unreachable(f"{method} {path}: {reason}") from None
        return Answer(got.status, got.headers, got.body)

    # ------------------------------------------------------------ the routes an agent uses

    def advertise(self, body: dict[str, Any]) -> Answer:
        return self.call("POST", "/v1/nodes", doc=body)

    def claim(self, node_id: str, wait: float) -> Answer:
        return self.call(
            "POST",
            f"/v1/nodes/{segment(node_id)}/claim?wait={wait:g}",
            data=b"",
            headers={"X-Enode-Instance": self.instance},
            timeout=wait + REQUEST_TIMEOUT,
        )

    def get_blob(self, run_id: str, name: str) -> Answer:
        return self.call("GET", f"/v1/runs/{segment(run_id)}/blob/{segment(name)}")

    def append_log(self, run_id: str, seq: int, chunk: bytes) -> Answer:
        return self.call("PUT", f"/v1/runs/{segment(run_id)}/steps/{seq}/log", data=chunk)

    def put_blob(self, run_id: str, seq: int, name: str, body: IO[bytes], length: int) -> Answer:
        return self.call(
            "PUT",
            f"/v1/runs/{segment(run_id)}/steps/{seq}/blob/{segment(name)}",
            data=body,
            length=length,
        )

    def report(self, run_id: str, seq: int, result: dict[str, Any]) -> Answer:
        return self.call("POST", f"/v1/runs/{segment(run_id)}/steps/{seq}/result", doc=result)
