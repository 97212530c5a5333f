"""Fixtures of the database-fault tests: a PostgreSQL server of their own (the embedded one),
never the machine's shared server, which must not be restarted under other sessions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.dbfaults.server import RestartablePostgres


@pytest.fixture(scope="module")
def own_server() -> Iterator[RestartablePostgres]:
    server = RestartablePostgres().start()
    try:
        yield server
    finally:
        server.close()
