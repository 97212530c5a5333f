"""The agent's HTTP to the Mediator (the standard library only: a node carries no extra client).

Every call answers an :class:`Answer`, whatever its status (the caller decides what a 4xx or a
5xx means for it); a Mediator that cannot be reached raises :class:`Unreachable`.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import IO, Any
from urllib.parse import quote

REQUEST_TIMEOUT = 30.0  # every call but the long poll, whose own window comes on top


class Unreachable(Exception):
    """No answer: the connection failed, broke or timed out."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def refused(self) -> bool:
        """A 4xx: the Mediator took the request and said no; the same request gets the same no."""
        return 400 <= self.status < 500

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def reason(self) -> str:
        """The reason of the Mediator's error body, else the start of the body."""
        try:
            doc = self.json()
            if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
                return str(doc["error"].get("reason", ""))
        except ValueError:
            pass
        return self.body[:200].decode("utf-8", "replace")

    def server_time(self) -> datetime | None:
        """The Mediator's clock at its answer (the Date header): lease times are the database's,
        so a deadline is measured from this, not from the node's own clock."""
        text = self.headers.get("Date")
        if not text:
            return None
        try:
            return parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None


def segment(text: str) -> str:
    """One path segment: a run id or an artifact name, whatever characters it holds."""
    return quote(text, safe="")


class Link:
    def __init__(self, url: str, token: str | None, principal: str | None, instance: str) -> None:
        self.url = url.rstrip("/")
        self.instance = instance
        self._headers = {"User-Agent": "mediator-agent"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        if principal:
            self._headers["X-Enode-Principal"] = principal
        # No proxies from the environment and no redirects on POST: the agent talks to the
        # Mediator it was given.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

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
        all_headers = {**self._headers, **(headers or {})}
        if doc is not None:
            data = json.dumps(doc).encode()
            all_headers["Content-Type"] = "application/json"
        elif data is not None:
            all_headers.setdefault("Content-Type", "application/octet-stream")
        if length is not None:
            all_headers["Content-Length"] = str(length)
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers=all_headers
        )
        try:
            with self._opener.open(request, timeout=timeout) as resp:
                return Answer(resp.status, dict(resp.headers.items()), resp.read())
        except urllib.error.HTTPError as exc:
            try:
                body = exc.read()
            except (http.client.HTTPException, OSError):
                body = b""
            return Answer(exc.code, dict(exc.headers.items()), body)
        except (TimeoutError, urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise Unreachable(f"{method} {path}: {reason}") from None

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
