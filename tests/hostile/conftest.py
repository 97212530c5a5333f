"""A real gunicorn for the hostile-input tests that go over HTTP, one per module (each on a
database of its own, cloned from the session's migrated template): starting gunicorn costs
seconds, and these tests only read what it answers."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from app.dev.embedded import create_database, drop_database
from tests.support.apps import LiveServer, gunicorn_on


@pytest.fixture(scope="module")
def live(
    pg_admin_url: str, template_db: tuple[str, str], tmp_path_factory: Any, request: Any
) -> Iterator[LiveServer]:
    """gunicorn on a fresh database; a module may set ``live_env`` (environment variables)."""
    name = f"{template_db[0]}_h{uuid.uuid4().hex[:8]}"
    url = create_database(pg_admin_url, name, template=template_db[0])
    try:
        env = {"MEDIATOR_CLAIM_LONG_POLL_SECONDS": "1", **getattr(request.module, "live_env", {})}
        with gunicorn_on(url, tmp_path_factory.mktemp("live"), **env) as server:
            yield server
    finally:
        drop_database(pg_admin_url, name)
