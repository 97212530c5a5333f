"""A small HTTP client of the Mediator's API (SPEC §2) over ``urllib.request``.

Every answer outside 2xx becomes a :class:`ClientError` carrying the exit code the commands end
with and one line that names what to fix: the server's own ``error.reason`` for a 4xx (exit 2),
and for no answer at all or a 5xx (exit 3) where the client tried to reach it.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1  # the run's verdict is FAILED
EXIT_REFUSED = 2  # the Mediator refused the request (any 4xx), or the input is invalid
EXIT_UNREACHABLE = 3  # no answer, or the Mediator failed (5xx)

DEFAULT_URL = "http://127.0.0.1:8080"
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
    """A 4xx answer: the request needs fixing (exit 2)."""


class Unreachable(ClientError):
    """No answer, or a 5xx: the Mediator is not there or not well (exit 3)."""


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
        return " (set --token or MEDIATOR_TOKEN)"
    if status == 403:
        return " (use a token with that role, or --principal / MEDIATOR_PRINCIPAL)"
    return ""


class Client:
    """The Mediator at ``url``, called with ``token`` (``Authorization: Bearer``) and on behalf of
    ``principal`` (``X-Enode-Principal``)."""

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

    # ------------------------------------------------------------------------------ requests

    def _headers(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "mediator-client"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.principal:
            headers["X-Enode-Principal"] = self.principal
        headers.update(extra or {})
        return headers

    def _address(self, path: str, query: Mapping[str, str | int | None] | None) -> str:
        address = self.url + path
        params = {k: str(v) for k, v in (query or {}).items() if v is not None}
        if params:
            address += "?" + urllib.parse.urlencode(params)
        return address

    def _open(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | None] | None = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        extra = dict(headers or {})
        if body is not None:
            extra.setdefault("Content-Type", "application/json; charset=utf-8")
        req = urllib.request.Request(
            self._address(path, query), data=body, method=method, headers=self._headers(extra)
        )
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                doc = json.loads(raw) if raw else None
            except ValueError:
                doc = None
            reason = _reason(doc, raw)
            if exc.code >= 500:
                raise Unreachable(
                    f"the Mediator at {self.url} failed ({exc.code}): {reason}",
                    exit_code=EXIT_UNREACHABLE,
                    status=exc.code,
                    body=doc,
                ) from None
            raise Refused(
                f"{reason}{_hint(exc.code)}", exit_code=EXIT_REFUSED, status=exc.code, body=doc
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise self._unreachable(exc) from None

    def _unreachable(self, exc: BaseException) -> Unreachable:
        why: object = getattr(exc, "reason", None) or exc
        if isinstance(why, ConnectionRefusedError):
            why = "connection refused"
        elif isinstance(why, (socket.timeout, TimeoutError)):
            why = f"no answer within {self.timeout:g} s"
        elif isinstance(why, OSError) and why.strerror:
            why = why.strerror
        return Unreachable(
            f"cannot reach the Mediator at {self.url} ({why}): start it, or set --url or "
            "MEDIATOR_URL",
            exit_code=EXIT_UNREACHABLE,
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | None] | None = None,
        body: bytes | None = None,
        doc: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """One request; ``doc`` is sent as JSON, ``body`` as it is. Raises :class:`ClientError`
        for anything but a 2xx."""
        if doc is not None:
            body = json.dumps(doc).encode("utf-8")
        with self._open(method, path, query=query, body=body, headers=headers) as resp:
            try:
                data = resp.read()
            except OSError as exc:
                raise self._unreachable(exc) from None
            names = {k.lower(): v for k, v in resp.headers.items()}
            return Answer(resp.status, names, data)

    def get(self, path: str, query: Mapping[str, str | int | None] | None = None) -> Any:
        """GET a JSON document."""
        return self.request("GET", path, query=query).json()

    def post(self, path: str, doc: Any = None, *, body: bytes | None = None) -> Answer:
        if doc is None and body is None:
            body = b""
        return self.request("POST", path, doc=doc, body=body)

    def stream(self, path: str) -> Iterator[bytes]:
        """GET ``path`` as a sequence of chunks (a Record's tar can be large)."""
        with self._open("GET", path, headers={"Accept": "*/*"}) as resp:
            while True:
                try:
                    chunk = resp.read(CHUNK)
                except OSError as exc:
                    raise self._unreachable(exc) from None
                if not chunk:
                    return
                yield chunk


def quote(segment: str) -> str:
    """One path segment of a URL (run ids may hold ``:`` and ``@``)."""
    return urllib.parse.quote(segment, safe="")
