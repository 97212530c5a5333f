"""Webhooks leak nothing and hang nothing (docs/security.md#outgoing-webhooks): a delivery follows
no redirect, uses no proxy from the environment, ends by an overall deadline however slowly the
endpoint answers, and its log lines name only the scheme and host of the URL (its path and query
carry secrets).

Every endpoint is a real HTTP server on 127.0.0.1 in a thread of this process."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
import structlog

from app.logs import configure_logging
from app.services.notify import WebhookQueue
from tests.support.processes import free_port
from tests.support.webhooks import Endpoint

SECRET_PATH = "/hooks/T0KEN-IN-PATH"
SECRET_QUERY = "?key=s3cret-in-query"


@pytest.fixture
def endpoints() -> Iterator[list[Endpoint]]:
    made: list[Endpoint] = []
    try:
        yield made
    finally:
        for e in made:
            e.close()


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    configure_logging("console", "warning")  # an app of an earlier test may have set "error"
    with structlog.testing.capture_logs() as captured:
        yield captured


def deliver(url: str, body: dict[str, Any], *, deadline: float = 3.0) -> WebhookQueue:
    """One webhook through a queue of one sender, waited for (at most 30 s)."""
    webhooks = WebhookQueue(1, senders=1, timeout=deadline)
    assert webhooks.submit(url, body)
    assert webhooks.join(30), "the delivery never ended"
    return webhooks


def failures(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "webhook failed"]


def test_a_webhook_answered_with_a_redirect_is_not_followed(endpoints, logs):
    target = Endpoint()
    endpoints.append(target)

    def redirect(h: BaseHTTPRequestHandler) -> None:
        h.send_response(307)  # 307 keeps the method and the body: a POST would go on as it is
        h.send_header("Location", f"{target.origin}/stolen?from=redirect")
        h.send_header("Content-Length", "0")
        h.end_headers()

    hook = Endpoint(redirect)
    endpoints.append(hook)

    deliver(hook.origin + SECRET_PATH + SECRET_QUERY, {"event": "run", "run_id": "r1"})

    assert hook.requests == [("POST", SECRET_PATH + SECRET_QUERY)]
    assert target.requests == []
    [line] = failures(logs)
    assert line["url"] == hook.origin
    assert line["status"] == 307


def test_a_webhook_redirected_with_302_is_not_followed_as_a_get_either(endpoints, logs):
    target = Endpoint()
    endpoints.append(target)

    def redirect(h: BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", f"{target.origin}/stolen")
        h.send_header("Content-Length", "0")
        h.end_headers()

    hook = Endpoint(redirect)
    endpoints.append(hook)

    deliver(hook.origin + "/hooks", {"event": "run", "run_id": "r1"})

    assert target.requests == []
    assert [(e["url"], e["status"]) for e in failures(logs)] == [(hook.origin, 302)]


def test_a_webhook_ignores_the_proxy_variables_of_the_environment(endpoints, logs, monkeypatch):
    proxy, hook = Endpoint(), Endpoint()
    endpoints.extend([proxy, hook])
    for name in (
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ):
        monkeypatch.setenv(name, proxy.origin)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)

    deliver(hook.origin + "/hooks/runs", {"event": "run", "run_id": "r1"})

    assert proxy.requests == []
    assert hook.requests == [("POST", "/hooks/runs")]
    assert hook.bodies == [{"event": "run", "run_id": "r1"}]
    assert failures(logs) == []


class Trickle:
    """Takes a connection, reads the POST, then answers one byte at a time, each well within any
    socket timeout, for as long as the client listens; ``hung_up`` is set once it stops."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.origin = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.hung_up = threading.Event()
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.recv(65536)
            reply = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"z" * 100_000
            for byte in reply:
                if self.stop.wait(0.05):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    self.hung_up.set()
                    return

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


def test_a_webhook_that_answers_a_byte_at_a_time_is_given_up_at_the_deadline(logs):
    trickle = Trickle()
    try:
        webhooks = WebhookQueue(1, senders=1, timeout=0.5)
        webhooks.submit(trickle.origin + SECRET_PATH, {"event": "run", "run_id": "r1"})

        # Without an overall deadline the sender reads for as long as bytes keep coming (about
        # 80 minutes here): it never hangs up within the 30 s allowed.
        assert trickle.hung_up.wait(30), "the sender kept reading the trickle"
        assert webhooks.join(30)
    finally:
        trickle.close()
    [line] = failures(logs)
    assert line["url"] == trickle.origin
    assert line["error"] == "TimeoutError"


def test_log_lines_name_only_the_scheme_and_host_of_a_webhook_url(logs):
    port = free_port()  # closed and never listened on: the connection is refused
    url = f"http://hook-user:hook-password@127.0.0.1:{port}{SECRET_PATH}{SECRET_QUERY}"

    deliver(url, {"event": "ask", "run_id": "r1"})

    [line] = failures(logs)
    assert line["url"] == f"http://127.0.0.1:{port}"
    text = repr(logs)
    for secret in ("T0KEN-IN-PATH", "s3cret-in-query", "hook-user", "hook-password"):
        assert secret not in text


def test_a_full_queue_logs_only_the_scheme_and_host_of_the_url_it_drops(logs):
    webhooks = WebhookQueue(1, senders=0)
    assert webhooks.submit("https://hooks.example.com/T0KEN-IN-PATH?k=s3cret", {"event": "run"})

    assert not webhooks.submit("https://hooks.example.com/T0KEN-IN-PATH?k=s3cret", {"event": "run"})

    [line] = [e for e in logs if e["event"] == "webhook dropped: the queue is full"]
    assert line["url"] == "https://hooks.example.com"
    assert "T0KEN" not in repr(logs) and "s3cret" not in repr(logs)


def self_signed_for_127_0_0_1(directory: Any) -> tuple[str, str]:
    """A certificate for 127.0.0.1 that signs itself, and its key: (cert path, key path)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "hook.pem", directory / "hook.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


def test_a_webhook_to_an_https_url_is_delivered_over_tls_to_a_certificate_it_trusts(
    endpoints, logs, tmp_path, monkeypatch
):
    import ssl

    cert, key = self_signed_for_127_0_0_1(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", cert)  # the trust store of the default TLS context
    hook = Endpoint()
    endpoints.append(hook)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    hook.server.socket = tls.wrap_socket(hook.server.socket, server_side=True)

    deliver(hook.origin.replace("http://", "https://") + "/hooks", {"event": "run", "n": 1})

    assert hook.requests == [("POST", "/hooks")]
    assert hook.bodies == [{"event": "run", "n": 1}]
    assert failures(logs) == []


def test_a_webhook_to_an_https_url_with_a_certificate_it_does_not_trust_is_not_delivered(
    endpoints, logs, tmp_path
):
    import ssl

    cert, key = self_signed_for_127_0_0_1(tmp_path)
    hook = Endpoint()
    endpoints.append(hook)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    hook.server.socket = tls.wrap_socket(hook.server.socket, server_side=True)
    origin = hook.origin.replace("http://", "https://")

    deliver(origin + "/hooks", {"event": "run"})

    assert hook.requests == []
    [line] = failures(logs)
    assert (line["url"], line["error"]) == (origin, "SSLCertVerificationError")
