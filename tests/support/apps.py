"""Mediator apps for tests: their configuration, a test client that carries the token, an app
opened and closed around a block, the ``mediator`` command run as a process of the test, and a real
gunicorn serving the Mediator on 127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import requests
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import text

from app import create_app
from tests.support.processes import children_of, free_port, stop

TOKEN = "test-token-of-the-mediator-long-enough"
ROOT = Path(__file__).resolve().parents[2]


def make_config(url: str, records: Any, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "database.url": url,
        "records.root": str(records),
        "token": TOKEN,
        "log.format": "console",
        "log.level": "error",
        # Claims held exactly their window, so tests can time them; the spread has its own tests.
        "claim.long_poll_jitter": 0.0,
    }
    cfg.update(extra)
    return cfg


def client_of(app: Flask) -> FlaskClient:
    """A test client of ``app`` that sends the token on every request."""
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {TOKEN}"
    return c


@contextmanager
def app_on(url: str, records: Any, **keys: Any) -> Iterator[Flask]:
    """A Mediator app on the database ``url``, closed (pool and LISTEN thread) when the block ends."""
    application = create_app(make_config(url, records, **keys))
    try:
        yield application
    finally:
        application.extensions["mediator"].close()


def openapi_document() -> dict[str, Any]:
    """The document an app serves at /v1/openapi.json, built by the app factory alone (it needs
    no database: the app is made on a URL nothing answers at, and closed at once), so a module
    can read it when it is collected, before any server runs."""
    app = create_app(make_config("postgresql://nobody@127.0.0.1:9/none", "/nonexistent"))
    try:
        document: dict[str, Any] = app.test_client().get("/v1/openapi.json").get_json()
        return document
    finally:
        app.extensions["mediator"].close()


@contextmanager
def one_connection_app(url: str, records: Any, probe: str) -> Iterator[Flask]:
    """:func:`app_on` with one connection in its pool (the next unit of work gets the same one)
    and an empty table of the test's own, created by ``probe`` (``CREATE TABLE IF NOT EXISTS
    <name> …``)."""
    table = probe.split()[5]
    with app_on(url, records, **{"database.pool_size": 1}) as application:
        db = application.extensions["mediator"].db
        with db.engine.begin() as conn:
            conn.execute(text(probe))
            conn.execute(text(f"TRUNCATE {table}"))
        yield application


def records_root(app: Flask) -> Path:
    """Where ``app`` keeps its Records (``records.root``)."""
    return Path(app.extensions["mediator"].config["records.root"])


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the Mediator's variables (``MEDIATOR_*`` and
    ``DATABASE_URL``), with ``extra`` added: what a command of the test is given."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("MEDIATOR_") and k != "DATABASE_URL"
    }
    env.update(extra)
    return env


def mediator_cli(
    *args: str, env: dict[str, str], cwd: Path = ROOT, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``mediator ARGS`` (``python -m app.commands``) as a process of its own, in ``env``; its output
    captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "app.commands", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def empty_records(root: Path) -> None:
    """Remove every Record, sealed ones included (files 0444, directories 0555)."""
    if not root.exists():
        return
    for here, dirs, _ in os.walk(root):
        for d in dirs:
            os.chmod(os.path.join(here, d), 0o755)
    for entry in root.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()


# ---------------------------------------------------------------- a real gunicorn


class LiveServer:
    """A real gunicorn (gthread workers) serving the Mediator on 127.0.0.1."""

    def __init__(
        self, url: str, env: dict[str, str], proc: subprocess.Popen[bytes], log: Path | None = None
    ) -> None:
        self.url = url
        self.env = env
        self.proc = proc
        self.log = log  # gunicorn's stderr, the master's and the workers' lines
        self.out: Path | None = None  # gunicorn's stdout (an access log would go there)

    def workers(self) -> set[int]:
        """The master's worker processes, from /proc (one that exited and that the master has
        not reaped yet included)."""
        return children_of(self.proc.pid)

    def reload(self, timeout: float = 120.0) -> set[int]:
        """``kill -HUP`` of the master, what ``systemctl reload`` sends; returns the new workers
        once every worker the master has is one it started after the signal (the old ones
        retired and reaped), so that every request from then on is served by one of them. The
        master shows that only in /proc, hence the looks; the deadline is only a safety net."""
        before = self.workers()
        count = int(self.env.get("MEDIATOR_WORKERS", "2"))
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while True:
            now = self.workers()
            if len(now) == count and not now & before:
                return now
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text()[-3000:] if self.log is not None else ""
                raise AssertionError(f"gunicorn did not reload: workers {before} -> {now}\n{tail}")
            time.sleep(0.05)

    def headers(self, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}", **extra}

    # A new connection per request: gunicorn hands each to whichever worker accepts it.

    def post(
        self, path: str, json: Any = None, headers: dict[str, str] | None = None
    ) -> requests.Response:
        """``POST`` with the token, like the test client's ``post`` (so the agent helpers work)."""
        return requests.post(
            self.url + path, json=json, headers=self.headers(**(headers or {})), timeout=30
        )

    def get(self, path: str) -> requests.Response:
        return requests.get(self.url + path, headers=self.headers(), timeout=30)


@contextmanager
def gunicorn_on(db_url: str, tmp_path: Path, **env_extra: str | None) -> Iterator[LiveServer]:
    """gunicorn -c gunicorn.conf.py wsgi:app on ``db_url``, configured by environment alone
    (docs/deploy.md#6-gunicorn), 2 gthread workers unless ``MEDIATOR_WORKERS`` says otherwise;
    yields once /readyz answers 200 (with one worker, its start-up, wake included, has then
    completed). A variable of ``env_extra`` given as None is left out of gunicorn's environment."""
    port = free_port()
    env = dict(os.environ)
    env.update(
        {
            "MEDIATOR_DATABASE_URL": db_url,
            "MEDIATOR_RECORDS_ROOT": str(tmp_path / "records"),
            "MEDIATOR_TOKEN": TOKEN,
            "MEDIATOR_LOG_LEVEL": "warning",
            "MEDIATOR_BIND": f"127.0.0.1:{port}",
            "MEDIATOR_WORKERS": "2",
            "MEDIATOR_THREADS": "32",
            "MEDIATOR_CLAIM_LONG_POLL_JITTER": "0",  # claims held exactly their window
            **env_extra,
        }
    )
    env = {name: value for name, value in env.items() if value is not None}
    log = tmp_path / "gunicorn.log"
    out = tmp_path / "gunicorn.out"
    with open(log, "wb") as err, open(out, "wb") as std:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"],
            cwd=ROOT,
            env=env,
            stdout=std,
            stderr=err,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(url + "/readyz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass  # not listening yet, or a worker still starting on a busy machine
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(log.read_text()[-3000:])
            time.sleep(0.05)  # waiting for a process to bind its port: there is no event to await
        server = LiveServer(url, env, proc, log)
        server.out = out
        yield server
    finally:
        stop(proc)


def ready_workers(server: LiveServer) -> set[int]:
    """The workers of ``server`` that have logged that their start-up is over."""
    assert server.log is not None
    said = set()
    for line in server.log.read_text().splitlines():
        if "process ready" in line:
            with suppress(ValueError):
                said.add(json.loads(line).get("pid"))
    return said
