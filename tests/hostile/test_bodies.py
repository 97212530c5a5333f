"""Huge and deeply nested bodies through the production stack, gunicorn (docs/api.md#conventions:
over ``max_body_bytes`` — or ``max_blob_bytes`` for logs, blobs and answers — is a 413 with nothing
stored, whether the body has a Content-Length or comes chunked; docs/security.md#input-and-load:
JSON depth is bounded, a body nested deeper is a 400, never a crash of the worker)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import requests

from app.config import to_libpq_url
from tests.support.apps import LiveServer

MAX_BODY = 64 * 1024
MAX_BLOB = 256 * 1024
live_env = {"MEDIATOR_MAX_BODY_BYTES": str(MAX_BODY), "MEDIATOR_MAX_BLOB_BYTES": str(MAX_BLOB)}

RUN = {
    "run_id": "run-a",
    "requires": [{"as": "dut", "capability": "board"}],
    "steps": [
        {
            "id": "approve",
            "ask": {"prompt": "ok?"},
            "out": ["decision"],
            "schema": {"decision": {"type": "object", "properties": {"ok": {"type": "boolean"}}}},
        },
        {"id": "work", "uses": "dut", "run": ["x"], "out": ["out"], "needs": []},
    ],
}

JSON_ROUTES = [
    ("POST", "/v1/runs"),
    ("POST", "/v1/runs/dry-run"),
    ("POST", "/v1/nodes"),
    ("POST", "/v1/runs/run-a/steps/2/result"),
]
BLOB_ROUTES = [
    ("PUT", "/v1/runs/run-a/steps/2/log"),
    ("PUT", "/v1/runs/run-a/steps/2/blob/out"),
    ("POST", "/v1/runs/run-a/steps/1/answer"),
]


def tables(live: LiveServer) -> tuple[Any, ...]:
    """What a refused body must leave as it was."""
    with psycopg.connect(to_libpq_url(live.env["MEDIATOR_DATABASE_URL"]), autocommit=True) as c:
        row = c.execute(
            "select (select count(*) from runs), (select count(*) from nodes),"
            " (select count(*) from blobs), (select count(*) from run_events),"
            " (select string_agg(seq || state, ',' order by seq) from steps"
            "  where run_id = 'run-a')"
        ).fetchone()
    assert row is not None
    return tuple(row)


@pytest.fixture(scope="module")
def started(live: LiveServer) -> Iterator[LiveServer]:
    """run-a on node n1: its ask open (step 1), its work step claimed by n1 (step 2)."""
    advert = {"node_id": "n1", "instance": "i-1", "capabilities": [{"capability": "board"}]}
    assert live.post("/v1/nodes", advert).status_code == 200
    assert live.post("/v1/runs", RUN).status_code == 201
    step = live.post("/v1/nodes/n1/claim?wait=0", headers={"X-Enode-Instance": "i-1"})
    assert step.status_code == 200 and step.json()["seq"] == 2, step.text
    yield live


def send(live: LiveServer, method: str, path: str, data: Any) -> requests.Response:
    headers = live.headers(**{"Content-Type": "application/json"})
    return requests.request(method, live.url + path, data=data, headers=headers, timeout=60)


def chunks(total: int, size: int = 16 * 1024) -> Iterator[bytes]:
    """A body without Content-Length (chunked), as a streaming client sends it."""
    sent = 0
    yield b'{"pad": "'
    while sent < total:
        n = min(size, total - sent)
        yield b"x" * n
        sent += n
    yield b'"}'


def padded(size: int) -> bytes:
    """A JSON object of exactly ``size`` bytes."""
    return b'{"pad": "' + b"x" * (size - 11) + b'"}'


@pytest.mark.parametrize(("method", "path"), JSON_ROUTES, ids=[p for _, p in JSON_ROUTES])
def test_a_json_body_over_max_body_bytes_is_413_with_or_without_a_length(
    started: LiveServer, method: str, path: str
) -> None:
    before = tables(started)
    for body in (padded(MAX_BODY + 1), padded(8 * MAX_BODY), chunks(MAX_BODY + 1)):
        resp = send(started, method, path, body)
        assert resp.status_code == 413, (path, resp.status_code, resp.text[:200])
        assert resp.json()["error"]["code"] == 413
    assert tables(started) == before


@pytest.mark.parametrize(("method", "path"), BLOB_ROUTES, ids=[p for _, p in BLOB_ROUTES])
def test_a_log_blob_or_answer_over_max_blob_bytes_is_413_with_or_without_a_length(
    started: LiveServer, method: str, path: str
) -> None:
    before = tables(started)
    for body in (padded(MAX_BLOB + 1), chunks(4 * MAX_BLOB)):
        resp = send(started, method, path, body)
        assert resp.status_code == 413, (path, resp.status_code, resp.text[:200])
    assert tables(started) == before
    log = started.get("/v1/runs/run-a/steps/2/log")
    assert log.status_code == 200 and log.content == b""
    assert started.get("/v1/runs/run-a/blob/out").status_code == 404


def nested(depth: int, kind: str) -> bytes:
    if kind == "arrays":
        return b'{"a": ' + b"[" * depth + b"]" * depth + b"}"
    return b'{"a":' * depth + b"1" + b"}" * depth


@pytest.mark.parametrize("kind", ["arrays", "objects"])
@pytest.mark.parametrize(
    ("method", "path"),
    [*JSON_ROUTES, BLOB_ROUTES[2]],
    ids=[p for _, p in [*JSON_ROUTES, BLOB_ROUTES[2]]],
)
def test_a_body_nested_far_past_the_bound_is_400(
    started: LiveServer, method: str, path: str, kind: str
) -> None:
    before = tables(started)
    for depth in (40, 10_000):  # past the bound; far past Python's recursion limit (in 64 KiB)
        resp = send(started, method, path, nested(depth, kind))
        assert resp.status_code == 400, (path, depth, resp.status_code, resp.text[:200])
        assert resp.json()["error"]["code"] == 400
    assert tables(started) == before
    # The worker that parsed it is alive and answering.
    assert started.get("/v1/runs/run-a").json()["state"] == "RUNNING"
