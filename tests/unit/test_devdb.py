"""app.dev.embedded: the embedded PostgreSQL server and database create/drop.

Self-contained on purpose: no conftest fixtures are used.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
import uuid

import psycopg
import pytest

from app.config import to_libpq_url
from app.dev.embedded import (
    EmbeddedPostgres,
    create_database,
    drop_database,
    resolve_admin_url,
    server_answers,
)
from tests.support.processes import free_port


def _select_one(url: str) -> int:
    with psycopg.connect(url, connect_timeout=5) as conn:
        return conn.execute("select 1").fetchone()[0]


# ------------------------------------------------------------------ embedded


def test_embedded_postgres_starts_answers_and_removes_its_directory():
    with EmbeddedPostgres() as pg:
        assert re.fullmatch(r"postgresql://postgres@127\.0\.0\.1:\d+/postgres", pg.admin_url)
        assert pg.running
        directory = pg.directory
        assert directory is not None and directory.is_dir()
        assert _select_one(pg.admin_url) == 1
        assert server_answers(pg.admin_url)
        with psycopg.connect(pg.admin_url) as conn:
            is_super = conn.execute(
                "select rolsuper from pg_roles where rolname = current_user"
            ).fetchone()[0]
            assert is_super is True
        url = pg.admin_url
    assert not directory.exists()
    assert not pg.running
    assert not server_answers(url, timeout=1)
    pg.stop()  # idempotent


def test_embedded_postgres_cleans_up_on_exception_and_with_linked_binaries():
    # relocate=True exercises the path used as root when the run-as user cannot
    # reach the venv (e.g. a venv under /root).
    pg = EmbeddedPostgres(relocate=True)
    with pytest.raises(RuntimeError, match="boom"):
        with pg:
            directory = pg.directory
            assert _select_one(pg.admin_url) == 1
            raise RuntimeError("boom")
    assert not directory.exists()
    assert not pg.running


def test_embedded_postgres_from_a_thread_and_url_requires_start():
    pg = EmbeddedPostgres()
    with pytest.raises(RuntimeError):
        _ = pg.admin_url
    result: dict[str, object] = {}

    def run() -> None:
        try:
            pg.start()
            result["answers"] = server_answers(pg.admin_url)
        except BaseException as exc:  # pragma: no cover - reported below
            result["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    try:
        assert "error" not in result, result.get("error")
        # the starting thread has ended; the server must still be up
        assert result["answers"] is True
        assert server_answers(pg.admin_url)
    finally:
        directory = pg.directory
        pg.stop()
    assert directory is not None and not directory.exists()


# ------------------------------------------------------------------- helpers


def test_server_answers_false_for_nothing_listening():
    assert (
        server_answers(f"postgresql://postgres@127.0.0.1:{free_port()}/postgres", timeout=1)
        is False
    )


def test_to_libpq_url_strips_the_driver():
    assert to_libpq_url("postgresql+psycopg://u@h:1/d") == "postgresql://u@h:1/d"
    assert to_libpq_url("postgresql://u@h:1/d") == "postgresql://u@h:1/d"
    assert to_libpq_url("postgres://u@h:1/d") == "postgresql://u@h:1/d"
    assert to_libpq_url("postgres+psycopg://u@h:1/d") == "postgresql://u@h:1/d"


def test_to_libpq_url_leaves_any_other_url_as_it_is():
    assert to_libpq_url("mysql://u@h:1/d") == "mysql://u@h:1/d"
    assert to_libpq_url("host=h dbname=d") == "host=h dbname=d"


# ------------------------------------------------------- create/drop databases


@pytest.fixture(scope="module")
def admin_url():
    url, server = resolve_admin_url()
    try:
        yield url
    finally:
        if server is not None:
            server.stop()


def _exists(admin_url: str, name: str) -> bool:
    with psycopg.connect(to_libpq_url(admin_url), autocommit=True) as conn:
        return (
            conn.execute("select count(*) from pg_database where datname = %s", (name,)).fetchone()[
                0
            ]
            == 1
        )


def test_create_connect_and_drop_database(admin_url):
    name = f"mediator_devdb_test_{uuid.uuid4().hex[:12]}"
    url = create_database(admin_url, name)
    try:
        assert url.startswith("postgresql://")
        assert url.endswith("/" + name)
        with psycopg.connect(url) as conn:
            assert conn.execute("select current_database()").fetchone()[0] == name
            conn.execute("create table t (x int)")
            conn.execute("insert into t values (42)")
            conn.commit()
        assert _exists(admin_url, name)

        # a database made from it as a template carries its contents
        copy = name + "_copy"
        copy_url = create_database(admin_url, copy, template=name)
        try:
            with psycopg.connect(copy_url) as conn:
                assert conn.execute("select x from t").fetchone()[0] == 42
        finally:
            drop_database(admin_url, copy)
        assert not _exists(admin_url, copy)

        # dropping disconnects whoever is still connected
        lingering = psycopg.connect(url, autocommit=True)
        try:
            drop_database(admin_url, name)
        finally:
            lingering.close()
    finally:
        drop_database(admin_url, name)
    assert not _exists(admin_url, name)
    drop_database(admin_url, name)  # IF EXISTS: dropping again is fine


def test_database_names_are_quoted(admin_url):
    name = f'Mediator "odd" name-{uuid.uuid4().hex[:8]}'
    url = create_database(admin_url, name)
    try:
        with psycopg.connect(url) as conn:
            assert conn.execute("select current_database()").fetchone()[0] == name
    finally:
        drop_database(admin_url, name)
    assert not _exists(admin_url, name)


def test_resolve_admin_url_prefers_the_env_var(monkeypatch):
    monkeypatch.setenv("MEDIATOR_DEVDB_TEST_URL", "postgresql://someone@db.example:6543/postgres")
    assert resolve_admin_url("MEDIATOR_DEVDB_TEST_URL") == (
        "postgresql://someone@db.example:6543/postgres",
        None,
    )


def test_embedded_postgres_in_a_given_base_dir():
    # as root the server runs as an unprivileged user, so the base dir must be reachable
    base = tempfile.mkdtemp(prefix="mediator-devdb-test-")
    try:
        os.chmod(base, 0o755)
        with EmbeddedPostgres(base_dir=base) as pg:
            assert str(pg.directory.parent) == base
            assert _select_one(pg.admin_url) == 1
        assert os.listdir(base) == []
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_resolve_admin_url_falls_back_to_embedded(monkeypatch):
    import app.dev.embedded as embedded

    monkeypatch.delenv("MEDIATOR_DEVDB_TEST_URL", raising=False)
    monkeypatch.setattr(
        embedded, "DEFAULT_LOCAL_URL", f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    )
    url, server = resolve_admin_url("MEDIATOR_DEVDB_TEST_URL")
    try:
        assert isinstance(server, EmbeddedPostgres)
        assert url == server.admin_url
        name = f"mediator_devdb_test_{uuid.uuid4().hex[:12]}"
        db_url = create_database(url, name)
        assert _select_one(db_url) == 1
        drop_database(url, name)
        assert not _exists(url, name)
    finally:
        if server is not None:
            server.stop()
