"""``app.store.pipeline``'s batches on libpq (``exchange``): statements prepared once per connection
under names of their own, which outlive a rollback; an error raised with its class and
constraint after the whole batch was read, the connection usable after it; the BEGIN of a
session outside autocommit sent in the batch with its isolation level; a statement the server
no longer has prepared fails its batch once and is prepared again; a commit with statements
after it in its round trip (``commit_then``), whose own error is raised and theirs returned."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from flask import Flask
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, ProgrammingError

from app.config import to_libpq_url
from app.store.clock import commit_and_notify
from app.store.pipeline import commit_then, fetch, pipelined
from tests.support.apps import one_connection_app

PROBE = "CREATE TABLE IF NOT EXISTS driver_probe (n int PRIMARY KEY)"
INSERT = text("INSERT INTO driver_probe (n) VALUES (:n) RETURNING n")
COUNT = text("SELECT count(*) FROM driver_probe")
ISOLATION = text("SELECT current_setting('transaction_isolation')")
OURS = text(
    "SELECT name FROM pg_prepared_statements WHERE name LIKE '\\_mediator\\_%' ORDER BY name"
)


@pytest.fixture
def app(clean_db: str, tmp_path: Path) -> Iterator[Flask]:
    with one_connection_app(clean_db, tmp_path / "records", PROBE) as application:
        yield application


def prepared_here(conn) -> list[str]:  # type: ignore[no-untyped-def]
    return [row[0] for row in conn.execute(OURS)]


def test_a_statement_is_prepared_once_on_its_connection_and_outlives_a_rollback(app: Flask):
    db = app.extensions["mediator"].db
    with db.transaction() as conn:
        for _ in range(5):
            assert fetch(conn, COUNT, {}) == [(0,)]
        once = prepared_here(conn)
    assert len(once) == 1, once
    with db.begin() as s:  # the pool's only connection: a write, then a rollback
        fetch(s, INSERT, {"n": 1})
        s.rollback()
    with db.transaction() as conn:
        kept = prepared_here(conn)  # the count's and the insert's: no DEALLOCATE at the rollback
        assert len(kept) == 2 and once[0] in kept, kept
        assert fetch(conn, COUNT, {}) == [(0,)]
        assert prepared_here(conn) == kept  # the count ran on its name again


def test_an_error_in_a_batch_is_raised_with_its_constraint_and_nothing_after_it_runs(app: Flask):
    db = app.extensions["mediator"].db
    with db.transaction() as conn:
        fetch(conn, INSERT, {"n": 1}, begin=True)
    with pytest.raises(IntegrityError) as caught:
        with db.transaction() as conn:
            pipelined(conn, (INSERT, {"n": 2}), (INSERT, {"n": 1}), (INSERT, {"n": 3}), begin=True)
    assert caught.value.orig is not None
    assert caught.value.orig.diag.constraint_name == "driver_probe_pkey"
    with db.transaction() as conn:  # the same connection, usable: the whole batch rolled back
        assert fetch(conn, COUNT, {}) == [(1,)]
        assert pipelined(conn, (INSERT, {"n": 2}), (INSERT, {"n": 3}), begin=True) == [
            [(2,)],
            [(3,)],
        ]
    with db.transaction() as conn:
        assert fetch(conn, COUNT, {}) == [(3,)]


def test_a_session_outside_autocommit_begins_in_the_batch_at_its_isolation_level(app: Flask):
    db = app.extensions["mediator"].db
    with db.read(snapshot=True) as s:
        driver = s.connection().connection.driver_connection
        assert driver.info.transaction_status.name == "IDLE"
        assert fetch(s, ISOLATION, {}) == [("repeatable read",)]
        assert driver.info.transaction_status.name == "INTRANS"
    with db.begin() as s:
        assert fetch(s, ISOLATION, {}) == [("read committed",)]


def test_a_statement_the_server_dropped_fails_its_batch_once_then_is_prepared_again(app: Flask):
    db = app.extensions["mediator"].db
    with db.transaction() as conn:
        assert fetch(conn, COUNT, {}) == [(0,)]
        conn.exec_driver_sql("DEALLOCATE ALL")  # as a pooler's DISCARD ALL would
        with pytest.raises(ProgrammingError, match="does not exist"):
            fetch(conn, COUNT, {})
        assert fetch(conn, COUNT, {}) == [(0,)]
        assert len(prepared_here(conn)) == 1


DEFERRED = text(
    "CREATE TABLE IF NOT EXISTS driver_deferred (n int UNIQUE DEFERRABLE INITIALLY DEFERRED)"
)
SOFT = text("SELECT current_setting('synchronous_commit')")


def test_a_commit_then_runs_what_follows_it_in_a_transaction_of_its_own(app: Flask, clean_db: str):
    """The commit stands and is visible to others; the statement after it ran after it (its
    NOTIFY delivered); the connection is idle after the batch and the notification's soft
    commit setting did not outlive its transaction."""
    db = app.extensions["mediator"].db
    with psycopg.connect(to_libpq_url(clean_db), autocommit=True) as listener:
        listener.execute("LISTEN driver_probe")
        with db.transaction() as conn:
            fetch(conn, INSERT, {"n": 1}, begin=True)
            assert commit_and_notify(conn, "driver_probe", ["one", "two"]) is None
            driver = conn.connection.driver_connection
            assert driver.info.transaction_status.name == "IDLE"
            assert fetch(conn, SOFT, {}) == [("on",)]
        got = [n.payload for n in listener.notifies(timeout=30, stop_after=2)]
        assert got == ["one", "two"]
        assert listener.execute("SELECT n FROM driver_probe").fetchall() == [(1,)]


def test_an_error_after_the_commit_is_returned_and_the_commit_stands(app: Flask):
    db = app.extensions["mediator"].db
    with db.transaction() as conn:
        fetch(conn, INSERT, {"n": 1}, begin=True)
        error = commit_then(conn, (INSERT, {"n": 1}))  # its own transaction: the key is taken
    assert isinstance(error, psycopg.errors.UniqueViolation), error
    with db.transaction() as conn:  # the same connection, usable
        assert fetch(conn, COUNT, {}) == [(1,)]


def test_a_commit_that_fails_is_raised_and_nothing_after_it_runs(app: Flask):
    db = app.extensions["mediator"].db
    with db.engine.begin() as conn:
        conn.execute(DEFERRED)
        conn.execute(text("TRUNCATE driver_deferred"))
    with pytest.raises(IntegrityError) as caught:
        with db.transaction() as conn:
            fetch(conn, text("INSERT INTO driver_deferred VALUES (1), (1)"), {}, begin=True)
            commit_then(conn, (INSERT, {"n": 7}))  # the unique check is deferred to COMMIT
    assert caught.value.orig is not None
    assert caught.value.orig.diag.constraint_name == "driver_deferred_n_key"
    with db.transaction() as conn:  # the same connection, usable; the insert after never ran
        assert fetch(conn, COUNT, {}) == [(0,)]
        assert fetch(conn, text("SELECT count(*) FROM driver_deferred"), {}) == [(0,)]


def test_the_pipeline_answers_what_psycopgs_public_pipeline_answers(app: Flask, clean_db: str):
    """The same statements, the same values: through this module's batches (psycopg's private
    query conversion, libpq's pipeline driven by hand) and through psycopg's public
    ``Connection.pipeline()`` with cursors, the rows are equal, types included (the start-up
    check in ``driver_problem`` guards the private parts; this guards what they compute)."""
    from app.store.nodes import _firsts_statement
    from app.store.pipeline import _compile

    typed = text(
        "SELECT CAST(:doc AS jsonb), CAST(:n AS integer), CAST(:names AS text[]),"
        " CAST(:at AS timestamptz), CAST(NULL AS text), CAST(:big AS bigint), :label"
    )
    wanted = {"want0": [{"capability": "board"}], "limit0": 2, "reserved_for": None}
    statements = [
        (
            typed,
            {
                "doc": '{"a": [1, "x", null]}',
                "n": 42,
                "names": ["n1", "n-2"],
                "at": "2026-12-07T12:00:00+00:00",
                "big": 2**40,
                "label": "é \u202e",
            },
        ),
        (_firsts_statement(1, False), wanted),
        (COUNT, {}),
    ]
    db = app.extensions["mediator"].db
    with db.begin() as s:
        s.execute(
            text(
                "INSERT INTO nodes (node_id, capabilities, attr_count, expires_at) VALUES"
                " ('n1', '[{\"capability\": \"board\", \"attrs\": {}}]', 0, now() + interval '1 h'),"
                " ('n2', '[{\"capability\": \"board\", \"attrs\": {}}]', 0, now() + interval '1 h')"
            )
        )
    with db.transaction() as conn:
        ours = pipelined(conn, *statements)
        dialect = conn.dialect
    with psycopg.connect(to_libpq_url(clean_db)) as plain:
        theirs = []
        with plain.pipeline():
            cursors = []
            for statement, params in statements:
                compiled = _compile(statement, dialect)
                cur = plain.cursor()
                cur.execute(compiled.sql, compiled.values(params))
                cursors.append(cur)
        for cur in cursors:
            theirs.append(cur.fetchall() if cur.description else [])
        plain.rollback()
    assert [[tuple(r) for r in rows] for rows in ours] == [
        [tuple(r) for r in rows] for rows in theirs
    ]
    assert ours[1] == [(0, "n1", None, False, None, None), (0, "n2", None, False, None, None)]
    assert ours[2] == [(0,)]
