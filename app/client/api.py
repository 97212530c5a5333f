"""A small HTTP client of the Mediator's API (docs/api.md#conventions) over ``http.client``, one
kept-alive connection a command.

Every answer outside 2xx becomes a :class:`ClientError` carrying the exit code the commands end
with (:mod:`app.client.exits`) and one line that names what to fix: the server's own
``error.reason`` for a 4xx (a 401 or 403 exits 5, another 4xx 6), and for no answer at all or a
5xx (exit 3) where the client tried to reach it.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.client.exits import EXIT_CREDENTIALS, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE
from app.httpclient import Connection, ConnectionFailed, Query, with_query
from app.httpclient import quote as quote  # the commands quote path segments with it

CHUNK = 64 * 1024


class ClientError(Exception):
    """A request that did not succeed: ``exit_code`` for the process, ``message`` for the person,
    and the answer's status and JSON body when there was an answer."""

    def __init__(
        self, message: str, *, exit_code: int, status: int | None = None, body: Any = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.status = status
        self.body = body


class Refused(ClientError):
    """A 4xx answer, or input the client refuses itself: the request, its credentials or the
    client's configuration need fixing (the exit code says which)."""


class Unreachable(ClientError):
    """No answer, or a 5xx: the Mediator is not there or not well (exit 3)."""


CREDENTIALS_REFUSED = frozenset({401, 403})  # who calls, not what is asked, is refused


@dataclass
class Answer:
    """A 2xx answer: its status, headers (names lower-cased) and body."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


def _reason(body: Any, raw: bytes) -> str:
    """The one error line of an answer: ``error.reason`` of the Mediator's error body, else the
    body's first line (a proxy's page, say)."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        reason = body["error"].get("reason")
        if isinstance(reason, str) and reason:
            return reason
    text = raw.decode("utf-8", "replace").strip()
    return text.splitlines()[0][:200] if text else "no reason given"


def _hint(status: int) -> str:
    """What to change on this side when the reason alone does not say it."""
    if status == 401:
        return " (set --token, MEDIATOR_CLIENT_TOKEN or a profile's token)"
    if status == 403:
        return " (use a token with that role, or --principal / MEDIATOR_CLIENT_PRINCIPAL)"
    return ""


class Client:
    """The Mediator at ``url``, called with ``token`` (``Authorization: Bearer``) and on behalf of
    ``principal`` (``X-Enode-Principal``).

    One HTTP/1.1 connection is kept open and used for every request of the command, so that
    ``--wait`` and ``logs --follow`` poll over one connection instead of opening one a look (the
    rules of reuse are :class:`app.httpclient.Connection`'s). A proxy of the environment
    (``http_proxy``, ``https_proxy``, ``no_proxy``) is used as urllib would use it. Like the
    connection it keeps, a client serves one thread at a time."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        principal: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.principal = principal
        self.timeout = timeout
        headers = {"Accept": "application/json", "User-Agent": "mediator-client"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if principal:
            headers["X-Enode-Principal"] = principal
        try:
            self._conn = Connection(self.url, timeout=timeout, headers=headers, use_proxy=True)
        except ValueError:
            raise Refused(
                f"the Mediator's URL must be http://HOST[:PORT] or https://..., got {url!r}",
                exit_code=EXIT_USAGE,
            ) from None

    # ------------------------------------------------------------------------------ requests

    def close(self) -> None:
        """Close the kept connection (the next request opens a new one)."""
        self._conn.close()

    def _open(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> http.client.HTTPResponse:
        extra = dict(headers or {})
        if body is not None:
            extra.setdefault("Content-Type", "application/json; charset=utf-8")
        try:
            resp = self._conn.open(method, with_query(path, query), body=body, headers=extra)
        except ConnectionFailed as exc:
            raise self._unreachable(exc.cause) from None
        if resp.status < 300:
            return resp
        raw = self._read(resp)
        self._conn.done(resp)
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = None
        reason = _reason(doc, raw)
        if 300 <= resp.status < 400:
            where = resp.getheader("Location") or "elsewhere"
            raise Refused(
                f"the Mediator at {self.url} answered {resp.status}, sending the client to "
                f"{where}: set that as the URL",
                exit_code=EXIT_REFUSED,
                status=resp.status,
            )
        if resp.status >= 500:
            raise Unreachable(
                f"the Mediator at {self.url} failed ({resp.status}): {reason}",
                exit_code=EXIT_UNREACHABLE,
                status=resp.status,
                body=doc,
            )
        raise Refused(
            f"{reason}{_hint(resp.status)}",
            exit_code=EXIT_CREDENTIALS if resp.status in CREDENTIALS_REFUSED else EXIT_REFUSED,
            status=resp.status,
            body=doc,
        )

    def _read(self, resp: http.client.HTTPResponse, size: int = -1) -> bytes:
        try:
            return self._conn.read(resp, size)
        except ConnectionFailed as exc:
            raise self._unreachable(exc.cause) from None

    def _unreachable(self, exc: BaseException) -> Unreachable:
        why: object = getattr(exc, "reason", None) or exc
        if isinstance(why, ConnectionRefusedError):
            why = "connection refused"
        elif isinstance(why, (socket.timeout, TimeoutError)):
            why = f"no answer within {self.timeout:g} s"
        elif isinstance(why, http.client.RemoteDisconnected):
            why = "the connection closed without an answer"
        elif isinstance(why, OSError) and why.strerror:
            why = why.strerror
        return Unreachable(
            f"cannot reach the Mediator at {self.url} ({why}): start it, or set --url, "
            "MEDIATOR_CLIENT_URL or a profile's url",
            exit_code=EXIT_UNREACHABLE,
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: bytes | None = None,
        doc: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """One request; ``doc`` is sent as JSON, ``body`` as it is. Raises :class:`ClientError`
        for anything but a 2xx."""
        if doc is not None:
            body = json.dumps(doc).encode("utf-8")
        resp = self._open(method, path, query=query, body=body, headers=headers)
        data = self._read(resp)
        self._conn.done(resp)
        names = {k.lower(): v for k, v in resp.getheaders()}
        return Answer(resp.status, names, data)

    def get(self, path: str, query: Query | None = None) -> Any:
        """GET a JSON document."""
        return self.request("GET", path, query=query).json()

    def post(self, path: str, doc: Any = None, *, body: bytes | None = None) -> Answer:
        if doc is None and body is None:
            body = b""
        return self.request("POST", path, doc=doc, body=body)

    def stream(self, path: str) -> Iterator[bytes]:
        """GET ``path`` as a sequence of chunks (a Record's tar can be large)."""
        resp = self._open("GET", path, headers={"Accept": "*/*"})
        finished = False
        try:
            while True:
                chunk = self._read(resp, CHUNK)
                if not chunk:
                    finished = True
                    self._conn.done(resp)
                    return
                yield chunk
        finally:
            if not finished:  # left half-read: the connection cannot take another request
                self.close()
