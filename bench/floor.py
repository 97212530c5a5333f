"""The stack's floor (docs/design.md#targets): a bare Flask app that only parses the body, runs the
statements frozen in ``bench/floor.sql`` (a placed submit's: the candidates, fetched whole, and the
one-statement insert) in one transaction through psycopg 3, and opens the run's Record as the
Mediator does. What it reaches under the same gunicorn and client is what Flask, gunicorn, this
database and this file system allow before any of the Mediator's own work; the statements and the
Record's opening are frozen here, so the floor does not move when the Mediator changes.

Served as ``gunicorn … bench.floor:app`` with BENCH_FLOOR_DATABASE_URL, BENCH_FLOOR_RECORDS (the
Records root) and BENCH_FLOOR_SQL (``bench/floor.sql`` unless given: ``bench/floor_pinned.sql`` is
the pinned shape's, for a submit that names its board).
"""

from __future__ import annotations

import os
import queue
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import psycopg
from flask import Flask, request

from app.config import to_libpq_url
from bench.database import FLOOR_SQL, FLOOR_VARIABLE, floor_statements

# psycopg's ``%(name)s`` parameters in place of pgbench's ``:name`` variables.
_FROZEN = floor_statements(Path(os.environ.get("BENCH_FLOOR_SQL") or FLOOR_SQL))
STATEMENTS: list[str] = [FLOOR_VARIABLE.sub(r"%(\1)s", st.replace("%", "%%")) for st in _FROZEN]
URL = to_libpq_url(os.environ["BENCH_FLOOR_DATABASE_URL"])
RECORDS = Path(os.environ["BENCH_FLOOR_RECORDS"])
POOL_SIZE = 5  # the Mediator's database.pool_size default

# Each variable of the statements but the key, read from the submitted contract's requirement:
# the benchmark's boards carry attrs {"slot": "s<N>"} on the pool shape (the statements take
# N), {"board": "pin-NNNN"} on the pinned shape.
FROM_REQUIREMENT: dict[str, Callable[[dict[str, Any]], str]] = {
    "slot": lambda requirement: str(requirement["slot"])[1:],
    "board": lambda requirement: str(requirement["board"]),
}
USED = sorted({m.group(1) for st in _FROZEN for m in FLOOR_VARIABLE.finditer(st)} - {"bench_id"})

# The manifest as the Mediator writes it when it opens a Record (indented by two, keys sorted, a
# newline at the end), with orjson as the Mediator's encoder.
_MANIFEST_LAYOUT = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE

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


def open_record(run_id: str, contract: dict[str, Any], created_at: datetime) -> None:
    """The run's Record opened as the Mediator opens one for every run it creates, before its
    commit (docs/design.md#records): a new directory named by the run id under the Records
    root, and ``manifest.json`` created in it exclusively, written in one go and closed, not
    fsynced (the run's row holds what it says). The manifest has the Mediator's fields for a
    run created by a legacy token."""
    directory = RECORDS / run_id
    directory.mkdir()
    body = orjson.dumps(
        {
            "run_id": run_id,
            "work_id": "",
            "requester": None,
            "token": "token",
            "team": "default",
            "contract": contract,
            "created_at": created_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
            "state": "RUNNING",
        },
        option=_MANIFEST_LAYOUT,
    )
    fd = os.open(directory / "manifest.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


@app.get("/readyz")
def readyz() -> dict[str, str]:
    return {"status": "ready"}


@app.post("/v1/runs")
def submit() -> tuple[dict[str, Any], int]:
    doc = request.get_json()
    requirement = doc["requires"][0]
    key = random.getrandbits(62)
    params = {"bench_id": key, **{name: FROM_REQUIREMENT[name](requirement) for name in USED}}
    run_id = f"pgb-r{key}"  # the run's id in the frozen insert
    with _connection() as conn:
        with conn.transaction():
            rows: list[Any] = []
            for statement in STATEMENTS:
                rows = conn.execute(statement, params).fetchall()
            # The insert, last, answers the run's created_at, which its manifest holds.
            open_record(run_id, doc, rows[0][0])
    return {"run_id": doc["run_id"], "state": "RUNNING"}, 201
