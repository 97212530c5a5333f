"""Logs (docs/metrics.md#logs): records of the standard library (alembic, SQLAlchemy, Python
warnings, any library) come out as the same JSON objects as the Mediator's own lines, once each
however often logging is configured; ``/readyz`` turning 503 logs one line saying why — the database
unreachable or its schema behind — per transition, not per probe, and one line when it is ready
again."""

from __future__ import annotations

import json
import logging
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from app.dev.embedded import create_database, drop_database
from app.logs import StderrHandler, configure_logging
from app.migrate import upgrade
from tests.support.apps import app_on

JSON_LOGS = {"log.format": "json", "log.level": "info"}


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as a JSON object (a line that is not one fails the test)."""
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert all(isinstance(line, dict) for line in lines)
    return lines


@pytest.fixture
def json_logging() -> Iterator[None]:
    logging.captureWarnings(False)  # pytest's own warning capture may stand in the way
    configure_logging("json", "info")
    yield
    logging.captureWarnings(False)
    configure_logging("console", "error")


def test_standard_library_records_from_warning_up_and_warnings_are_json_lines(json_logging, capfd):
    capfd.readouterr()
    configure_logging("json", "info")  # twice: still one handler, one line a record
    logging.getLogger("sqlalchemy.pool").info("an info line of a library: not written")
    logging.getLogger("alembic.runtime.migration").warning("Running upgrade %s -> %s", "a", "b")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("some.library").exception("it failed")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a library's warning", UserWarning, stacklevel=1)
    lines = json_lines(capfd.readouterr().err)

    assert [(x["logger"], x["level"]) for x in lines] == [
        ("alembic.runtime.migration", "warning"),
        ("some.library", "error"),
        ("py.warnings", "warning"),
    ]
    assert lines[0]["event"] == "Running upgrade a -> b"
    assert "ValueError: boom" in lines[1]["exception"]
    assert "a library's warning" in lines[2]["event"]
    assert all("timestamp" in x for x in lines)
    assert sum(isinstance(h, StderrHandler) for h in logging.getLogger().handlers) == 1


class Writes:
    """A stream that keeps each write call apart: what another process sharing the stream could
    slip a line of its own between."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_each_line_of_the_mediator_is_written_whole_in_one_write(monkeypatch):
    """Several gunicorn workers share one stderr: a line written as two writes (the text, then
    its newline, as print() does) let another worker's line in between, and neither was JSON."""
    stream = Writes()
    monkeypatch.setattr("sys.stderr", stream)
    try:
        configure_logging("json", "info")
        log = structlog.get_logger("mediator")
        log.info("request", route="/v1/nodes", status=200)
        log.info("wake scan", promoted=1)
    finally:
        monkeypatch.undo()
        configure_logging("console", "error")
    assert len(stream.calls) == 2, stream.calls
    assert all(c.endswith("\n") and c.count("\n") == 1 for c in stream.calls), stream.calls
    assert [json.loads(c)["event"] for c in stream.calls] == ["request", "wake scan"]


def readyz_lines(text: str) -> list[dict[str, Any]]:
    return [x for x in json_lines(text) if x["event"].startswith("readyz")]


def test_an_unreachable_database_logs_one_line_however_often_readyz_is_asked(tmp_path, capfd):
    with app_on("postgresql://nobody@127.0.0.1:9/none", tmp_path / "r", **JSON_LOGS) as app:
        capfd.readouterr()
        client = app.test_client()
        replies = [client.get("/readyz") for _ in range(3)]
        lines = readyz_lines(capfd.readouterr().err)
    assert [r.status_code for r in replies] == [503] * 3
    assert [(x["event"], x["level"], x["reason"]) for x in lines] == [
        ("readyz: not ready", "error", "database unreachable (OperationalError)")
    ]


def test_a_schema_behind_logs_its_reason_once_and_ready_again_once(pg_admin_url, tmp_path, capfd):
    name = f"mediator_behind_{uuid.uuid4().hex[:8]}"
    url = create_database(pg_admin_url, name)  # not migrated: the schema is behind the code
    try:
        with app_on(url, tmp_path / "r", **JSON_LOGS) as app:
            capfd.readouterr()
            client = app.test_client()
            behind = [client.get("/readyz") for _ in range(2)]
            upgrade(url)
            ready = [client.get("/readyz") for _ in range(2)]
            lines = readyz_lines(capfd.readouterr().err)
    finally:
        drop_database(pg_admin_url, name)
    assert [r.status_code for r in behind + ready] == [503, 503, 200, 200]
    reason = behind[0].get_json()["reason"]
    assert [(x["event"], x.get("reason")) for x in lines] == [
        ("readyz: not ready", reason),
        ("readyz: ready again", None),
    ]
