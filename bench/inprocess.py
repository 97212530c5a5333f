"""The Mediator in the benchmark's own process, for what is not an HTTP request: timing reaper
passes, and the untimed wake scans that settle the reservations of the reserving wake-scan
line."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from bench.contracts import TOKEN


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
