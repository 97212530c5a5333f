"""The Mediator in the benchmark's own process, for what is not an HTTP request: capturing the
statements of a placed submit (the transaction pgbench replays), timing reaper passes, and the
untimed wake scans that settle the reservations of the reserving wake-scan line."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import event

from app import create_app
from bench.contracts import TOKEN, advert, two_steps

CAPTURE_RUN = "bench-capture-run"
CAPTURE_NODE = "bench-capture-node"


@contextmanager
def mediator_app(
    db_url: str, records: Path, overrides: Mapping[str, Any] | None = None
) -> Iterator[Flask]:
    """The app on ``db_url``; ``overrides``: configuration keys beyond the benchmark's own (the
    same values the benchmark's gunicorn gets, when both work on one database)."""
    app = create_app(
        {
            "database.url": db_url,
            "records.root": str(records),
            "token": TOKEN,
            "log.format": "console",
            "log.level": "error",
            **(overrides or {}),
        }
    )
    try:
        yield app
    finally:
        app.extensions["mediator"].close()


def client_of(app: Flask) -> FlaskClient:
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {TOKEN}"
    return c


def capture_placed_submit(db_url: str, records: Path) -> list[str]:
    """The INSERTs of one placed two-step submit, exactly as the Mediator sends them (each
    parameter bound client-side by psycopg), with the run's key as ``:bench_id``: the run, its
    event, its lease and its steps (an ``executemany`` gives one statement per row, as psycopg
    sends them)."""
    with mediator_app(db_url, records) as app:
        client = client_of(app)
        engine = app.extensions["mediator"].db.engine
        resp = client.post("/v1/nodes", json=advert(CAPTURE_NODE, soc="capture"))
        assert resp.status_code == 200, resp.get_json()
        seen: list[str] = []

        def on_execute(
            conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
        ) -> None:
            head = statement.lstrip().upper()
            if not (head.startswith("INSERT") or (head.startswith("WITH") and "INSERT" in head)):
                return
            mogrify = psycopg.ClientCursor(cursor.connection).mogrify
            for one in params if many else [params]:
                seen.append(mogrify(statement, one))

        event.listen(engine, "before_cursor_execute", on_execute)
        try:
            resp = client.post("/v1/runs", json=two_steps(CAPTURE_RUN, soc="capture"))
        finally:
            event.remove(engine, "before_cursor_execute", on_execute)
        assert resp.status_code == 201, resp.get_json()
    out = []
    for st in seen:
        st = _INTERVAL.sub(_seconds, st)
        st = _LITERAL.sub(_splice_ids, st)
        st = st.replace(f"'{CAPTURE_RUN}'", "('pgb-r'::text || :bench_id)")
        st = st.replace(f"'{CAPTURE_NODE}'", "('pgb-n'::text || :bench_id)")
        out.append(" ".join(st.split()))
    if not any(re.search(r"INSERT INTO runs\b", st) for st in out):
        raise RuntimeError("the placed submit sent no INSERT INTO runs")
    return out


# psycopg writes a timedelta as '1:00:00'::interval, which pgbench would read as variables.
_INTERVAL = re.compile(r"'(?:(\d+) days?,? )?(\d+):(\d\d):(\d\d(?:\.\d+)?)'::interval")


def _seconds(m: re.Match[str]) -> str:
    days, h, mi, sec = m.groups()
    total = int(days or 0) * 86400 + int(h) * 3600 + int(mi) * 60 + float(sec)
    return f"'{total:g} seconds'::interval"


# A quoted literal with its casts ('…'::jsonb): the ids inside a JSON parameter (a submit's
# leases and steps travel as JSONB rows) are spliced in as text, the literal parenthesised so
# its casts apply to the whole concatenation.
_LITERAL = re.compile(r"'((?:[^']|'')*)'((?:::\w+)+)")


def _splice_ids(m: re.Match[str]) -> str:
    body, casts = m.groups()
    if CAPTURE_RUN not in body and CAPTURE_NODE not in body:
        return m.group(0)
    body = body.replace(f'"{CAPTURE_RUN}"', "\"pgb-r' || :bench_id || '\"")
    body = body.replace(f'"{CAPTURE_NODE}"', "\"pgb-n' || :bench_id || '\"")
    return f"('{body}'){casts}"


def floor_statements(statements: list[str]) -> list[str]:
    """The same statements for psycopg's ``%(name)s`` parameters."""
    return [st.replace("%", "%%").replace(":bench_id", "%(bench_id)s") for st in statements]
