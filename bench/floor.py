"""The stack's floor (docs/design.md#targets): a bare Flask app that only parses the body and runs
the statements frozen in ``bench/floor.sql`` (a placed submit's: the candidates, fetched whole, and
the one-statement insert) in one transaction through psycopg 3. What it reaches under the same
gunicorn and client is what Flask, gunicorn and this database allow before any of the
Mediator's own work; the file is frozen, so the floor does not move when the Mediator's
statements change.

Served as ``gunicorn … bench.floor:app`` with BENCH_FLOOR_DATABASE_URL (and BENCH_FLOOR_SQL,
another file of the same form, if given).
"""

from __future__ import annotations

import os
import queue
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from flask import Flask, request

from app.config import to_libpq_url
from bench.database import FLOOR_SQL, FLOOR_VARIABLE, floor_statements

# psycopg's ``%(name)s`` parameters in place of pgbench's ``:name`` variables.
STATEMENTS: list[str] = [
    FLOOR_VARIABLE.sub(r"%(\1)s", st.replace("%", "%%"))
    for st in floor_statements(Path(os.environ.get("BENCH_FLOOR_SQL") or FLOOR_SQL))
]
URL = to_libpq_url(os.environ["BENCH_FLOOR_DATABASE_URL"])
POOL_SIZE = 5  # the Mediator's database.pool_size default

app = Flask(__name__)
_idle: queue.LifoQueue[psycopg.Connection[Any]] = queue.LifoQueue()
_lock = threading.Lock()
_made = 0


@contextmanager
def _connection() -> Iterator[psycopg.Connection[Any]]:
    """A connection of this worker's small pool (opened on first use, after gunicorn's fork)."""
    global _made
    conn: psycopg.Connection[Any] | None = None
    try:
        conn = _idle.get_nowait()
    except queue.Empty:
        with _lock:
            if _made < POOL_SIZE:
                _made += 1
                conn = psycopg.connect(URL, application_name="mediator-bench-floor")
    if conn is None:
        conn = _idle.get(timeout=5)
    try:
        yield conn
    finally:
        _idle.put(conn)


@app.get("/readyz")
def readyz() -> dict[str, str]:
    return {"status": "ready"}


@app.post("/v1/runs")
def submit() -> tuple[dict[str, Any], int]:
    doc = request.get_json()
    # The benchmark's contracts ask for a board of the client thread's slot ("s<N>").
    params = {"bench_id": random.getrandbits(62), "slot": doc["requires"][0]["slot"][1:]}
    with _connection() as conn:
        with conn.transaction():
            for statement in STATEMENTS:
                conn.execute(statement, params).fetchall()
    return {"run_id": doc["run_id"], "state": "RUNNING"}, 201
