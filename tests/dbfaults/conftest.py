"""Fixtures of the database-fault tests: a PostgreSQL server of their own (the embedded one),
never the machine's shared server, which must not be restarted under other sessions."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from app.config import to_libpq_url
from tests.dbfaults.replica import PrimaryAndStandby
from tests.dbfaults.server import RestartablePostgres
from tests.support.tables import empty_tables


@pytest.fixture(scope="module")
def own_server() -> Iterator[RestartablePostgres]:
    server = RestartablePostgres().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def module_db(own_server: RestartablePostgres) -> str:
    """One migrated database on that server for the module's tests."""
    return own_server.new_database()


@pytest.fixture
def clean_db(module_db: str) -> str:
    """The module's database, emptied: each test starts from no rows."""
    with psycopg.connect(to_libpq_url(module_db), autocommit=True) as conn:
        empty_tables(conn)
    return module_db


@pytest.fixture
def servers() -> Iterator[PrimaryAndStandby]:
    """A primary of the test's own, started; the test makes its standby when it is ready."""
    pair = PrimaryAndStandby().start()
    try:
        yield pair
    finally:
        pair.close()
