"""A keep-alive HTTP/1.1 client on one connection (http.client): cheap enough per request that
a few threads of it load a server on the same 2-core machine without becoming the bottleneck."""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any

from bench.contracts import HEADERS


class Response:
    __slots__ = ("status", "data")

    def __init__(self, status: int, data: bytes) -> None:
        self.status = status
        self.data = data

    def json(self) -> Any:
        return json.loads(self.data) if self.data else None


class Client:
    """One connection to 127.0.0.1, opened again after the server closes it. Not thread-safe:
    one per thread."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 60.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self._conn.connect()
            assert self._conn.sock is not None
            self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self._conn

    def request(
        self,
        method: str,
        path: str,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        hdrs = {**HEADERS, **(headers or {})}
        for attempt in (0, 1):
            reused = self._conn is not None
            conn = self._connection()
            try:
                conn.request(method, path, body=data, headers=hdrs)
                resp = conn.getresponse()
                payload = resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if reused and attempt == 0:
                    continue  # the server had closed the idle connection: send it again once
                raise
            if resp.will_close:
                self.close()
            return Response(resp.status, payload)
        raise AssertionError("unreachable")

    def post(self, path: str, doc: Any = None, headers: dict[str, str] | None = None) -> Response:
        data = json.dumps(doc).encode() if doc is not None else b""
        return self.request("POST", path, data, headers)

    def get(self, path: str) -> Response:
        return self.request("GET", path)

    def abort(self) -> None:
        """Unblock a thread waiting on this connection (a long poll) from another thread."""
        conn = self._conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
