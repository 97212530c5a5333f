"""``Database.transaction`` (app/db.py): its transaction begins with its first write, the reads
before it running in autocommit on the same pooled connection, and the connection goes back to
the pool in transactions again — with one connection in the pool, the next unit of work gets it
and must still be able to roll back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import text

from app.store.pipeline import fetch, pipelined
from tests.support.apps import one_connection_app

PROBE = "CREATE TABLE IF NOT EXISTS late_begin_probe (n int)"
INSERT = text("INSERT INTO late_begin_probe (n) VALUES (:n) RETURNING n")
COUNT = text("SELECT count(*) FROM late_begin_probe")


@pytest.fixture
def app(clean_db: str, tmp_path: Path) -> Iterator[Flask]:
    with one_connection_app(clean_db, tmp_path / "records", PROBE) as application:
        yield application


def count(app: Flask) -> int:
    with app.extensions["mediator"].db.engine.connect() as conn:
        return int(conn.execute(COUNT).scalar_one())


def test_a_write_begins_the_transaction_and_an_error_after_it_rolls_it_back(app: Flask):
    db = app.extensions["mediator"].db
    with pytest.raises(RuntimeError, match="after the write"):
        with db.transaction() as conn:
            driver = conn.connection.driver_connection
            assert driver.info.transaction_status.name == "IDLE"  # the read: no BEGIN yet
            fetch(conn, COUNT, {})
            assert driver.info.transaction_status.name == "IDLE"
            pipelined(conn, (INSERT, {"n": 1}), (INSERT, {"n": 2}), begin=True)
            assert driver.info.transaction_status.name == "INTRANS"
            raise RuntimeError("after the write")
    assert count(app) == 0


def test_a_transaction_commits_what_it_wrote(app: Flask):
    db = app.extensions["mediator"].db
    with db.transaction() as conn:
        assert fetch(conn, INSERT, {"n": 1}, begin=True) == [(1,)]
    assert count(app) == 1


def test_the_connection_goes_back_to_the_pool_in_transactions(app: Flask):
    db = app.extensions["mediator"].db
    with db.transaction() as conn:
        fetch(conn, COUNT, {})
        first = conn.connection.driver_connection
    with db.begin() as s:  # the pool's only connection, the same one
        assert s.connection().connection.driver_connection is first
        assert first.autocommit is False
        s.execute(INSERT, {"n": 3})
        assert first.info.transaction_status.name == "INTRANS"
        s.rollback()
    assert count(app) == 0
