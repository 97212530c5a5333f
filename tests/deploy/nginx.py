"""Debian's nginx serving the documented ``deploy/nginx.conf`` in front of a live gunicorn, as an
unprivileged instance: its own prefix, pid, logs and temporary directories under the test's
tmp_path, free ports on 127.0.0.1 for its HTTPS and its port-80 server, and a throwaway
certificate for 127.0.0.1 made by the file's own self-signed example. Only the upstream address,
the two listen lines and the two certificate paths of the documented file are replaced."""

from __future__ import annotations

import getpass
import grp
import os
import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from tests.support.apps import ROOT
from tests.support.http import Http
from tests.support.processes import free_port, stop
from tests.support.programs import require_program

DOCUMENTED = ROOT / "deploy" / "nginx.conf"
DOCUMENTED_UPSTREAM = "server 127.0.0.1:8080;"
DOCUMENTED_LISTEN_TLS = "listen 443 ssl http2;"
DOCUMENTED_LISTEN_PLAIN = "listen 80;"
DOCUMENTED_CERT = "/etc/ssl/certs/mediator.pem"
DOCUMENTED_KEY = "/etc/ssl/private/mediator.key"
DOCUMENTED_NAME = "mediator.example.org"


def _once(text: str, pattern: str, what: str) -> re.Match[str]:
    found = list(re.finditer(pattern, text, flags=re.M))
    assert len(found) == 1, f"deploy/nginx.conf: {what} appears {len(found)} times, expected once"
    return found[0]


def render(upstream: str, tls_port: int, plain_port: int, cert: Path, key: Path) -> str:
    """The documented file with gunicorn's address, nginx's two ports and the certificate's paths
    replaced: each of the lines replaced must be in the file exactly once."""
    text = DOCUMENTED.read_text()
    lines = {
        DOCUMENTED_UPSTREAM: f"server {upstream};",
        DOCUMENTED_LISTEN_TLS: f"listen 127.0.0.1:{tls_port} ssl http2;",
        DOCUMENTED_LISTEN_PLAIN: f"listen 127.0.0.1:{plain_port};",
        f"ssl_certificate     {DOCUMENTED_CERT};": f"ssl_certificate     {cert};",
        f"ssl_certificate_key {DOCUMENTED_KEY};": f"ssl_certificate_key {key};",
    }
    for line, replacement in lines.items():
        found = _once(text, rf"^\s*{re.escape(line)}", repr(line))
        text = text[: found.start()] + found[0].replace(line, replacement) + text[found.end() :]
    return text


def documented_certificate_command(cert: Path, key: Path) -> list[str]:
    """The file's self-signed example (the commented ``openssl req -x509`` line), made for
    127.0.0.1 (a certificate for an address needs it as an IP subjectAltName) and writing to
    ``cert`` and ``key``."""
    line = _once(DOCUMENTED.read_text(), r"^\s*#\s*(openssl req -x509 .*)$", "openssl req -x509")[1]
    for documented, replacement in (
        (f"DNS:{DOCUMENTED_NAME}", "IP:127.0.0.1"),
        (f"/CN={DOCUMENTED_NAME}", "/CN=127.0.0.1"),
        (DOCUMENTED_CERT, str(cert)),
        (DOCUMENTED_KEY, str(key)),
    ):
        assert documented in line, f"the self-signed example does not name {documented}"
        line = line.replace(documented, replacement)
    return shlex.split(line)


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A throwaway self-signed certificate for 127.0.0.1 and its key, by the documented command."""
    binary = require_program("openssl", "openssl")
    cert, key = directory / "mediator.pem", directory / "mediator.key"
    command = documented_certificate_command(cert, key)
    assert command[0] == "openssl"
    done = subprocess.run(
        [binary, *command[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    return cert, key


def _main_conf(prefix: Path, site: Path) -> str:
    temp = {
        name: prefix / "temp" / name
        for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    }
    for path in temp.values():
        path.mkdir(parents=True, exist_ok=True)
    # As root (CI), workers would switch to nobody and could not use the temporary directories of
    # a tmp_path only root may enter: they run as the invoking user instead.
    user = ""
    if os.geteuid() == 0:
        user = f"user {getpass.getuser()} {grp.getgrgid(os.getegid()).gr_name};"
    return f"""
{user}
worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {temp["client_body"]};
    proxy_temp_path {temp["proxy"]};
    fastcgi_temp_path {temp["fastcgi"]};
    uwsgi_temp_path {temp["uwsgi"]};
    scgi_temp_path {temp["scgi"]};
    include {site};
}}
"""


class Nginx:
    """``url`` is the HTTPS server (https://127.0.0.1:port), ``plain_url`` the port-80 server's
    stand-in, ``ca`` the certificate a client must trust (``requests``' ``verify=``)."""

    def __init__(
        self, url: str, plain_url: str, ca: Path, prefix: Path, proc: subprocess.Popen[bytes]
    ) -> None:
        self.url = url
        self.plain_url = plain_url
        self.ca = ca
        self.prefix = prefix
        self.proc = proc

    def client(self, token: str | None) -> Http:
        """An HTTPS client of this nginx sending ``token`` (none: no Authorization header)."""
        return Http(self.url, token, verify=str(self.ca))

    def error_log(self) -> str:
        path = self.prefix / "error.log"
        return path.read_text() if path.exists() else ""


@contextmanager
def nginx_in_front(upstream_url: str, tmp_path: Path) -> Iterator[Nginx]:
    binary = require_program("nginx", "nginx")
    prefix = Path(tempfile.mkdtemp(prefix="nginx-", dir=tmp_path))
    cert, key = make_certificate(prefix)
    tls_port, plain_port = free_port(), free_port()
    while plain_port == tls_port:
        plain_port = free_port()
    site = prefix / "mediator.conf"
    site.write_text(render(upstream_url.removeprefix("http://"), tls_port, plain_port, cert, key))
    conf = prefix / "nginx.conf"
    conf.write_text(_main_conf(prefix, site))
    base = [binary, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")]
    checked = subprocess.run([*base, "-t"], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    proc = subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"https://127.0.0.1:{tls_port}"
    server = Nginx(url, f"http://127.0.0.1:{plain_port}", cert, prefix, proc)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(url + "/healthz", timeout=5, verify=str(cert)).status_code == 200:
                    break
            except requests.RequestException:
                pass  # not listening yet
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(server.error_log()[-3000:])
            time.sleep(0.05)  # waiting for a process to bind its port: there is no event to await
        yield server
    finally:
        stop(proc)
