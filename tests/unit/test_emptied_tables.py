"""What a test starts from: the tables the fixtures empty are every table the Mediator writes."""

from __future__ import annotations

from tests.support.tables import TABLES, empty_tables

# Not emptied between tests: alembic's own row, and the pages' signing key (made once per database).
KEPT = {"alembic_version", "ui_secret"}


def test_every_table_of_the_schema_is_emptied_except_the_kept_ones(sql):
    names = {
        row[0] for row in sql.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    }
    assert names - KEPT == set(TABLES)


def test_emptying_leaves_no_rows_and_restarts_the_sequences_and_the_wake_marks(sql):
    sql.execute("INSERT INTO wake_debt DEFAULT VALUES")
    sql.execute("SELECT nextval('wake_mark'), nextval('wake_mark')")
    sql.execute("SELECT setval('wake_covered', 7)")

    empty_tables(sql)

    assert sql.execute("SELECT count(*) FROM wake_debt").fetchone()[0] == 0
    assert sql.execute("SELECT last_value, is_called FROM wake_debt_id_seq").fetchone() == (
        1,
        False,
    )
    assert sql.execute("SELECT nextval('wake_mark')").fetchone()[0] == 1
    assert sql.execute("SELECT last_value FROM wake_covered").fetchone()[0] == 0
