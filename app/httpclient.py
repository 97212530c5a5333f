"""The one HTTP client of the Mediator's own programs, over ``http.client`` (the standard library
only: the agent and the command-line client run on hosts that carry nothing else, and the layer
test keeps this module free of the server's modules).

:class:`Connection` is one HTTP/1.1 connection to one origin, kept alive between requests when the
caller wants it (the client's ``--wait`` and ``logs --follow`` poll over one connection) or opened
anew for each request. Answers of any status come back as a :class:`Response`; a caller that wants
2xx only uses :meth:`Response.raise_for_status`, which raises :class:`HTTPError` carrying the status
and the body. No answer at all raises :class:`ConnectionFailed`.

What differs between the callers stays with them: the client's exit codes and proxies, the agent's
retries with backoff, the webhook's overall deadline, refusal of redirects and status-line limit.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

# A request that is not safe to send twice (a POST) goes on the kept connection only when it was
# used this recently (seconds): servers close idle connections after a few seconds at the least
# (gunicorn's keepalive here is 75), and one closed just as the POST went out would leave the
# caller unable to tell whether it arrived.
KEEP_IDLE = 1.0
# What a kept connection that the server closed meanwhile raises on its next request.
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)

Body = bytes | IO[bytes] | None
Query = Mapping[str, str | int | None]


class ConnectionFailed(Exception):
    """No answer: the connection failed, broke or timed out. ``cause`` is what the socket or
    ``http.client`` raised."""

    def __init__(self, message: str, cause: BaseException) -> None:
        super().__init__(message)
        self.cause = cause


def error_reason(body: bytes) -> str:
    """The ``error.reason`` of the Mediator's error body, else "" (not JSON, or another shape)."""
    try:
        doc = json.loads(body) if body else None
    except ValueError:
        return ""
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        reason = doc["error"].get("reason")
        return reason if isinstance(reason, str) else ""
    return ""


@dataclass
class Response:
    """An answer of any status: its status, headers (names lower-cased) and body."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def raise_for_status(self) -> Response:
        """This response when it is a 2xx; else :class:`HTTPError`."""
        if not self.ok:
            raise HTTPError(self)
        return self


class HTTPError(Exception):
    """An answer outside 2xx, with its status, headers and body."""

    def __init__(self, response: Response) -> None:
        super().__init__(f"HTTP {response.status}")
        self.response = response
        self.status = response.status
        self.body = response.body


@dataclass(frozen=True)
class Proxy:
    host: str
    port: int
    authorization: str | None  # Proxy-Authorization, from the proxy URL's user and password


def proxy_for(scheme: str, host: str) -> Proxy | None:
    """The proxy of the environment for ``scheme`` and ``host``, as urllib chooses it."""
    given = urllib.request.getproxies().get(scheme)
    if not given or urllib.request.proxy_bypass(host):
        return None
    parts = urllib.parse.urlsplit(given if "://" in given else f"http://{given}")
    if not parts.hostname:
        return None
    authorization = None
    if parts.username:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    return Proxy(parts.hostname, parts.port or 80, authorization)


def quote(segment: str) -> str:
    """One path segment of a URL (run ids may hold ``:`` and ``@``, artifact names anything)."""
    return urllib.parse.quote(segment, safe="")


def with_query(path: str, query: Query | None) -> str:
    """``path`` with the parameters of ``query`` that are not None."""
    params = {k: str(v) for k, v in (query or {}).items() if v is not None}
    return path + "?" + urllib.parse.urlencode(params) if params else path


class Connection:
    """HTTP/1.1 to the origin of ``url`` (its path is a prefix of every request's path).

    With ``keep_alive`` one connection serves every request: one that the server closed meanwhile
    is replaced for a GET, and a POST goes on it only when it was used just before (else on a new
    one), so that it is never sent twice. Without it every request opens its own connection and
    says ``Connection: close``. ``use_proxy`` takes the proxy of the environment (``http_proxy``,
    ``https_proxy``, ``no_proxy``) as urllib would; without it the connection goes to the host the
    URL names. Like the connection it keeps, an instance serves one thread at a time.

    Raises ValueError for a URL that is not ``http://HOST[:PORT]...`` or ``https://...``."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        headers: Mapping[str, str] | None = None,
        keep_alive: bool = True,
        use_proxy: bool = False,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
            raise ValueError(f"not an http:// or https:// URL: {url!r}")
        self.timeout = timeout
        self.keep_alive = keep_alive
        self._headers = dict(headers or {})
        self._https = parts.scheme == "https"
        self._host, self._port, self._netloc = parts.hostname, port, parts.netloc
        self._prefix = parts.path.rstrip("/")
        self._proxy = proxy_for(parts.scheme, parts.hostname) if use_proxy else None
        self._ssl = ssl_context
        self._conn: http.client.HTTPConnection | None = None
        self._used_at = 0.0

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        proxy = self._proxy
        if proxy is None:
            if self._https:
                return http.client.HTTPSConnection(
                    self._host, self._port, timeout=timeout, context=self._ssl
                )
            return http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        if not self._https:
            return http.client.HTTPConnection(proxy.host, proxy.port, timeout=timeout)
        conn = http.client.HTTPSConnection(
            proxy.host, proxy.port, timeout=timeout, context=self._ssl
        )
        tunnel = {"Proxy-Authorization": proxy.authorization} if proxy.authorization else None
        conn.set_tunnel(self._host, self._port, headers=tunnel)
        return conn

    def _target(self, path: str) -> str:
        target = self._prefix + path
        if self._proxy is not None and not self._https:
            return f"http://{self._netloc}{target}"  # a plain HTTP proxy takes the whole URL
        return target

    def _all_headers(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        headers = dict(self._headers)
        if self._proxy is not None and not self._https and self._proxy.authorization:
            headers["Proxy-Authorization"] = self._proxy.authorization
        if not self.keep_alive:
            headers["Connection"] = "close"
        headers.update(extra or {})
        return headers

    def close(self) -> None:
        """Close the kept connection (the next request opens a new one)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def open(
        self,
        method: str,
        path: str,
        *,
        body: Body = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> http.client.HTTPResponse:
        """The response to one request, its body still to read (then call :meth:`done`), over
        the kept connection when that is safe. ``timeout`` replaces the connection's for this
        request (a long poll's window comes on top of the usual one)."""
        safe = method in ("GET", "HEAD")
        if not self.keep_alive or (
            self._conn is not None and not safe and time.monotonic() - self._used_at > KEEP_IDLE
        ):
            self.close()  # it may have been closed by the server: a POST goes on a new one
        wait = self.timeout if timeout is None else timeout
        target, all_headers = self._target(path), self._all_headers(headers)
        for attempt in range(2):
            kept = self._conn is not None
            if self._conn is None:
                self._conn = self._connect(wait)
            self._conn.timeout = wait
            if self._conn.sock is not None:
                self._conn.sock.settimeout(wait)
            try:
                self._conn.request(method, target, body=body, headers=all_headers)
                return self._conn.getresponse()
            except STALE as exc:
                self.close()
                if not (kept and safe and attempt == 0):
                    raise ConnectionFailed(f"{method} {path}: {exc}", exc) from None
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise ConnectionFailed(f"{method} {path}: {exc}", exc) from None
        raise AssertionError("unreachable")  # the loop returns or raises

    def send(
        self,
        method: str,
        path: str,
        *,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        timeout: Callable[[], float],
    ) -> socket.socket:
        """Send one request on a new connection and hand over its socket with the answer unread,
        for a caller that reads the answer under its own limits (the webhook reads its status
        line only, within an overall deadline). ``timeout()`` is asked afresh before connecting
        and before sending, so that a deadline bounds each step. The caller closes the socket.
        Raises OSError and ``http.client.HTTPException`` as they come."""
        self.close()
        conn = self._connect(timeout())
        try:
            conn.connect()
            assert conn.sock is not None  # connect() made it or raised
            conn.sock.settimeout(timeout())
            conn.request(method, self._target(path), body=body, headers=self._all_headers(headers))
            sock: socket.socket = conn.sock
            conn.sock = None  # handed over: closing the connection leaves it open
            return sock
        finally:
            conn.close()

    def read(self, resp: http.client.HTTPResponse, size: int = -1) -> bytes:
        """Up to ``size`` bytes of the body (all of it by default); a broken read closes the
        connection and raises :class:`ConnectionFailed`."""
        try:
            return resp.read() if size < 0 else resp.read(size)
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise ConnectionFailed(f"reading the answer: {exc}", exc) from None

    def done(self, resp: http.client.HTTPResponse) -> None:
        """The response is read to its end: its connection is free for the next request."""
        self._used_at = time.monotonic()
        if resp.will_close or not self.keep_alive:
            self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Body = None,
        doc: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Response:
        """One request and its whole answer, whatever its status; ``doc`` goes as JSON."""
        extra = dict(headers or {})
        if doc is not None:
            body = json.dumps(doc).encode("utf-8")
            extra.setdefault("Content-Type", "application/json")
        resp = self.open(method, with_query(path, query), body=body, headers=extra, timeout=timeout)
        data = self.read(resp)
        self.done(resp)
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)

    def get_json(self, path: str, query: Query | None = None) -> Any:
        """GET a JSON document; :class:`HTTPError` for anything but a 2xx."""
        return self.request("GET", path, query=query).raise_for_status().json()

    def post_json(self, path: str, doc: Any) -> Any:
        """POST ``doc`` as JSON and answer the JSON reply; :class:`HTTPError` unless a 2xx."""
        return self.request("POST", path, doc=doc).raise_for_status().json()
