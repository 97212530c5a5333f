"""Debian's nginx serving the documented ``deploy/nginx.conf`` in front of a live gunicorn, as an
unprivileged instance: its own prefix, pid, logs and temporary directories under the test's
tmp_path, a free port on 127.0.0.1. Only the upstream address and the listen port of the
documented file are replaced."""

from __future__ import annotations

import getpass
import grp
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from tests.apps import ROOT
from tests.deploy.programs import require_program

DOCUMENTED = ROOT / "deploy" / "nginx.conf"
DOCUMENTED_UPSTREAM = "server 127.0.0.1:8080;"
DOCUMENTED_LISTEN = "listen 80;"


def render(upstream: str, port: int) -> str:
    """The documented server block with gunicorn's address and nginx's port replaced: each of
    the two lines must be in the file exactly once."""
    text = DOCUMENTED.read_text()
    for line in (DOCUMENTED_UPSTREAM, DOCUMENTED_LISTEN):
        found = len(re.findall(rf"^\s*{re.escape(line)}", text, flags=re.M))
        assert found == 1, f"deploy/nginx.conf: {line!r} appears {found} times, expected once"
    text = text.replace(DOCUMENTED_UPSTREAM, f"server {upstream};", 1)
    return text.replace(DOCUMENTED_LISTEN, f"listen 127.0.0.1:{port};", 1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    def __init__(self, url: str, prefix: Path, proc: subprocess.Popen[bytes]) -> None:
        self.url = url
        self.prefix = prefix
        self.proc = proc

    def error_log(self) -> str:
        path = self.prefix / "error.log"
        return path.read_text() if path.exists() else ""


@contextmanager
def nginx_in_front(upstream_url: str, tmp_path: Path) -> Iterator[Nginx]:
    binary = require_program("nginx", "nginx")
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    port = _free_port()
    site = prefix / "mediator.conf"
    site.write_text(render(upstream_url.removeprefix("http://"), port))
    conf = prefix / "nginx.conf"
    conf.write_text(_main_conf(prefix, site))
    base = [binary, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")]
    checked = subprocess.run([*base, "-t"], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    proc = subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    server = Nginx(url, prefix, proc)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(url + "/healthz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass  # not listening yet
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(server.error_log()[-3000:])
            time.sleep(0.05)  # waiting for a process to bind its port: there is no event to await
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
