"""Pool exhaustion (docs/configuration.md#keys): ``database.pool_size`` 1 and a short
``database.pool_timeout``; while the process's only connection is held, every request that needs the
database answers 503 ``no database connection available in time`` within the time-out — never a
hang, never a 500, nothing stored — and the next request after the connection is back is answered
normally."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from flask import Flask

from app.config import to_libpq_url
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import app_on, client_of
from tests.support.concurrency import race
from tests.support.contracts import one_step
from tests.support.wire import send

POOL_TIMEOUT = 0.5
ANSWER_BOUND = POOL_TIMEOUT + 2.0  # what a busy 2-core machine adds to the time-out
EXHAUSTED = {"error": {"code": 503, "reason": "no database connection available in time"}}

# Every kind of request that needs the database, as a caller sends it.
REQUESTS: list[tuple[str, str, Any]] = [
    ("POST", "/v1/runs", one_step("run-x")),
    ("POST", "/v1/runs/dry-run", one_step("run-y")),
    ("GET", "/v1/runs/run-a", None),
    ("GET", "/v1/runs", None),
    ("POST", "/v1/nodes", {"node_id": "n2", "capabilities": [cap("board")]}),
    ("GET", "/v1/nodes", None),
    ("GET", "/v1/capabilities", None),
    ("POST", "/v1/nodes/n1/claim?wait=0", None),
    ("POST", "/v1/runs/run-a/steps/1/result", {"node": "n1", "exit_code": 0}),
    ("POST", "/v1/runs/run-a/cancel", None),
    ("GET", "/v1/asks", None),
    ("GET", "/v1/runs/run-a/events", None),
    ("PUT", "/v1/runs/run-a/steps/1/log", b"a line\n"),
]


@pytest.fixture
def db_url(clean_db: str) -> str:
    return clean_db


@pytest.fixture
def app(db_url: str, tmp_path: Path) -> Iterator[Flask]:
    keys = {"database.pool_size": 1, "database.pool_timeout": POOL_TIMEOUT}
    with app_on(db_url, tmp_path / "records", **keys) as application:
        yield application


@pytest.fixture
def client(app: Flask) -> Any:
    c = client_of(app)
    advertise(c, "n1", cap("board"))
    assert c.post("/v1/runs", json=one_step("run-a")).status_code == 201
    return c


@pytest.fixture
def held(app: Flask, client: Any) -> Iterator[None]:
    """The process's only pooled connection, checked out and held."""
    conn = app.extensions["mediator"].db.engine.connect()
    try:
        yield
    finally:
        conn.close()


def rows(db_url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(to_libpq_url(db_url), autocommit=True) as conn:
        return conn.execute(
            "select (select count(*) from runs), (select count(*) from nodes),"
            " (select count(*) from run_events), (select state from runs where run_id = 'run-a')"
        ).fetchall()


@pytest.mark.parametrize(
    ("method", "path", "body"), REQUESTS, ids=[f"{m} {p}" for m, p, _ in REQUESTS]
)
def test_a_request_without_a_connection_in_time_is_a_503_within_the_pool_timeout(
    db_url: str, client: Any, held: None, method: str, path: str, body: Any
) -> None:
    before = rows(db_url)
    started = time.monotonic()
    resp = send(client, method, path, body)
    took = time.monotonic() - started

    assert resp.status_code == 503, resp.get_json()
    assert resp.get_json() == EXHAUSTED
    assert POOL_TIMEOUT * 0.9 <= took < ANSWER_BOUND, took
    assert rows(db_url) == before


def test_readyz_is_503_while_the_pool_is_exhausted_and_200_after(app: Flask, client: Any) -> None:
    conn = app.extensions["mediator"].db.engine.connect()
    try:
        resp = client.get("/readyz")
        assert resp.status_code == 503
        assert resp.get_json()["status"] == "unavailable"
    finally:
        conn.close()
    assert client.get("/readyz").status_code == 200


def test_many_requests_at_once_on_an_exhausted_pool_all_answer_503_promptly(
    app: Flask, client: Any, held: None
) -> None:
    clients = [client_of(app) for _ in range(8)]

    def one(c: Any) -> tuple[int, float]:
        started = time.monotonic()
        status = c.get("/v1/runs/run-a").status_code
        return status, time.monotonic() - started

    results = race(*[lambda c=c: one(c) for c in clients], timeout=30)

    assert [status for status, _ in results] == [503] * 8
    assert max(took for _, took in results) < ANSWER_BOUND, results


def test_the_first_request_after_the_connection_is_back_is_answered(
    app: Flask, client: Any
) -> None:
    conn = app.extensions["mediator"].db.engine.connect()
    assert client.get("/v1/runs/run-a").status_code == 503
    released = threading.Timer(0.1, conn.close)
    released.start()
    try:
        # A request that waits for the pool gets the connection the moment it is returned.
        resp = client.get("/v1/runs/run-a")
    finally:
        released.join()
    assert resp.status_code == 200, resp.get_json()
    assert resp.get_json()["state"] == "RUNNING"
