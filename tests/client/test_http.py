"""The client's kept connection when the server has closed it meanwhile (its keep-alive time ran
out between two looks): a GET goes again on a new connection instead of failing the watch."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from app.client.api import Client


class OneRequestPerConnection(BaseHTTPRequestHandler):
    """HTTP/1.1 without ``Connection: close``, yet every connection is dropped after its first
    answer, as a server whose keep-alive time ran out drops it."""

    protocol_version = "HTTP/1.1"
    connections = 0

    def setup(self) -> None:
        super().setup()
        type(self).connections += 1

    def do_GET(self) -> None:
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


def test_a_get_on_a_connection_the_server_closed_goes_again_on_a_new_one():
    with ThreadingHTTPServer(("127.0.0.1", 0), OneRequestPerConnection) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        client = Client(f"http://127.0.0.1:{server.server_address[1]}")
        try:
            answers = [client.get("/v1/runs/x") for _ in range(3)]
        finally:
            client.close()
            server.shutdown()

    assert answers == [{"ok": True}] * 3
    assert OneRequestPerConnection.connections == 3
