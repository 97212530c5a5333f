"""Liveness, readiness and the refusal to serve on a schema older than the code
(docs/api.md#get-readyz, docs/deploy.md#4-schema), the pool time-out, and ``mediator db upgrade`` /
``mediator db check``."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic import command

from app import create_app
from app.config import to_libpq_url
from app.dev.embedded import create_database, drop_database
from app.migrate import alembic_config, head_revision, upgrade
from tests.support.apps import TOKEN, clean_env, make_config, mediator_cli
from tests.support.processes import free_port

AUTH = {"Authorization": f"Bearer {TOKEN}"}

# A route of every /v1 blueprint, with a body where one is needed.
V1_ROUTES: list[tuple[str, str, Any]] = [
    ("POST", "/v1/nodes", {"node_id": "n1", "capabilities": []}),
    ("GET", "/v1/nodes", None),
    (
        "POST",
        "/v1/runs",
        {
            "run_id": "r1",
            "requires": [{"as": "a", "capability": "board"}],
            "steps": [{"id": "s", "uses": "a", "run": ["true"]}],
        },
    ),
    ("GET", "/v1/runs", None),
    ("GET", "/v1/runs/r1", None),
    ("POST", "/v1/runs/r1/cancel", None),
    ("POST", "/v1/nodes/n1/claim?wait=0", None),
    ("GET", "/v1/asks", None),
    ("GET", "/v1/capabilities", None),
    ("GET", "/v1/runs/r1/ledger", None),
]


def _empty_database(admin_url: str) -> Iterator[str]:
    name = f"mediator_empty_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    url = create_database(admin_url, name)
    try:
        yield url
    finally:
        drop_database(admin_url, name)


@pytest.fixture
def empty_db_url(pg_admin_url: str) -> Iterator[str]:
    """A database with no Mediator schema at all, for a test that migrates it."""
    yield from _empty_database(pg_admin_url)


@pytest.fixture(scope="module")
def never_migrated_url(pg_admin_url: str) -> Iterator[str]:
    """A database with no Mediator schema, shared by the tests that only read it."""
    yield from _empty_database(pg_admin_url)


@contextmanager
def serving(url: str, records: Path, **extra: Any) -> Iterator[Any]:
    app = create_app(make_config(url, records, **extra))
    try:
        yield app
    finally:
        app.extensions["mediator"].close()


def _call(client: Any, method: str, path: str, body: Any) -> Any:
    return client.open(path, method=method, json=body, headers=AUTH)


def _tables(url: str) -> set[str]:
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
    return {r[0] for r in rows}


def _revision(url: str) -> str | None:
    if "alembic_version" not in _tables(url):
        return None
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    return row[0] if row else None


# ------------------------------------------------------------------ a migrated database


def test_healthz_needs_no_token_and_answers_200(app):
    resp = app.test_client().get("/healthz")
    assert resp.status_code == 200


def test_readyz_needs_no_token_and_is_200_on_a_migrated_database(app):
    resp = app.test_client().get("/readyz")
    assert resp.status_code == 200


def test_the_openapi_document_needs_no_token(app):
    resp = app.test_client().get("/v1/openapi.json")
    assert resp.status_code == 200
    assert resp.get_json()["openapi"].startswith("3.")


def test_a_v1_route_without_a_token_is_401_while_health_routes_are_open(app):
    client = app.test_client()
    assert client.get("/v1/runs").status_code == 401
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200


# ------------------------------------------------------------------ refusing an older schema


def test_readyz_is_503_on_a_database_that_was_never_migrated(never_migrated_url, tmp_path):
    with serving(never_migrated_url, tmp_path) as app:
        resp = app.test_client().get("/readyz")
    assert resp.status_code == 503


def test_healthz_stays_200_on_a_database_that_was_never_migrated(never_migrated_url, tmp_path):
    with serving(never_migrated_url, tmp_path) as app:
        resp = app.test_client().get("/healthz")
    assert resp.status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "body"), V1_ROUTES, ids=[f"{m} {p}" for m, p, _ in V1_ROUTES]
)
def test_every_v1_route_is_503_with_the_error_body_on_a_database_that_was_never_migrated(
    never_migrated_url, tmp_path, method, path, body
):
    with serving(never_migrated_url, tmp_path) as app:
        resp = _call(app.test_client(), method, path, body)
    assert resp.status_code == 503
    error = resp.get_json()["error"]
    assert error["code"] == 503
    assert "upgrade" in error["reason"]  # it says what to do
    # nothing was created behind the refusal
    assert _tables(never_migrated_url) == set()


def test_a_database_downgraded_to_base_is_not_ready_and_v1_routes_are_503(fresh_db_url, tmp_path):
    command.downgrade(alembic_config(fresh_db_url), "base")
    with serving(fresh_db_url, tmp_path) as app:
        client = app.test_client()
        ready = client.get("/readyz")
        resp = client.get("/v1/runs", headers=AUTH)
    assert ready.status_code == 503
    assert resp.status_code == 503
    assert resp.get_json()["error"]["code"] == 503


def test_a_schema_at_another_revision_than_the_code_is_refused(fresh_db_url, tmp_path):
    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0000_older'")
    with serving(fresh_db_url, tmp_path) as app:
        client = app.test_client()
        ready = client.get("/readyz")
        resp = client.post("/v1/nodes", json={"node_id": "n1", "capabilities": []}, headers=AUTH)
    assert ready.status_code == 503
    assert resp.status_code == 503
    assert resp.get_json()["error"]["code"] == 503
    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM nodes").fetchone() == (0,)


def test_the_app_serves_once_the_schema_is_upgraded_without_a_restart(empty_db_url, tmp_path):
    with serving(empty_db_url, tmp_path) as app:
        client = app.test_client()
        assert client.get("/v1/runs", headers=AUTH).status_code == 503
        upgrade(empty_db_url)
        assert client.get("/readyz").status_code == 200
        # The schema guard looks again while the schema is wrong (at most once a second).
        deadline = time.monotonic() + 10
        while (status := client.get("/v1/runs", headers=AUTH).status_code) == 503:
            assert time.monotonic() < deadline, "still refusing after the upgrade"
            time.sleep(0.1)  # the guard's re-check is time-based: there is no event to await
        assert status == 200


def test_readyz_is_503_when_the_database_is_unreachable(tmp_path):
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    with serving(url, tmp_path) as app:
        resp = app.test_client().get("/readyz")
    assert resp.status_code == 503


def test_a_v1_route_is_503_with_the_error_body_when_the_database_is_unreachable(tmp_path):
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    with serving(url, tmp_path) as app:
        resp = app.test_client().get("/v1/runs", headers=AUTH)
    assert resp.status_code == 503
    assert resp.get_json()["error"]["code"] == 503


# ------------------------------------------------------------------ the pool time-out


def test_a_request_that_gets_no_pooled_connection_in_time_is_503_not_a_hang(db_url, tmp_path):
    with serving(
        db_url, tmp_path, **{"database.pool_size": 1, "database.pool_timeout": 0.2}
    ) as app:
        client = app.test_client()
        assert client.get("/v1/runs", headers=AUTH).status_code == 200
        with app.extensions["mediator"].db.engine.connect():  # the pool's only connection
            started = time.monotonic()
            resp = client.get("/v1/runs", headers=AUTH)
            waited = time.monotonic() - started
    assert resp.status_code == 503
    assert resp.get_json()["error"]["code"] == 503
    assert waited < 5


# ------------------------------------------------------------------ mediator db upgrade / check


def _mediator(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return mediator_cli(*args, env=clean_env(**env))


def test_db_check_exits_1_on_a_database_that_was_never_migrated(never_migrated_url):
    proc = _mediator("db", "check", MEDIATOR_DATABASE_URL=never_migrated_url)
    assert proc.returncode == 1
    assert "upgrade" in proc.stdout + proc.stderr  # it says what to do


def test_db_check_exits_1_on_a_database_downgraded_to_base(fresh_db_url):
    command.downgrade(alembic_config(fresh_db_url), "base")
    proc = _mediator("db", "check", MEDIATOR_DATABASE_URL=fresh_db_url)
    assert proc.returncode == 1


def test_db_check_exits_0_on_a_migrated_database(db_url):
    proc = _mediator("db", "check", MEDIATOR_DATABASE_URL=db_url)
    assert proc.returncode == 0, proc.stderr
    assert head_revision() in proc.stdout


def test_db_check_reads_database_url_too(db_url):
    proc = _mediator("db", "check", DATABASE_URL=db_url)
    assert proc.returncode == 0, proc.stderr


def test_db_check_reads_the_config_file_named_by_the_option(db_url, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(f"database:\n  url: {db_url}\n", encoding="utf-8")
    proc = _mediator("--config", str(path), "db", "check")
    assert proc.returncode == 0, proc.stderr


def test_db_upgrade_migrates_an_empty_database_to_head(empty_db_url):
    proc = _mediator("db", "upgrade", MEDIATOR_DATABASE_URL=empty_db_url)
    assert proc.returncode == 0, proc.stderr
    assert _revision(empty_db_url) == head_revision()
    assert {"nodes", "runs", "steps", "leases", "run_events", "blobs"} <= _tables(empty_db_url)
    assert _mediator("db", "check", MEDIATOR_DATABASE_URL=empty_db_url).returncode == 0
