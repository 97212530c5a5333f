"""The Mediator the compatibility tests talk to: one live server for the package, its submitter
and its long-poll window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from app.config import to_libpq_url
from tests.support.apps import LiveServer, empty_records

LONG_POLL_SECONDS = 1
SUBMITTER = "dev@lab.test"


class Mediator:
    """The served Mediator: its URL, its database and its Record store."""

    def __init__(self, server: LiveServer, db_url: str) -> None:
        self.server = server
        self.url = server.url
        self.db_url = db_url
        self.records = Path(server.env["MEDIATOR_RECORDS_ROOT"])

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows as an operator would read them (autocommit, a connection of its own)."""
        with psycopg.connect(to_libpq_url(self.db_url), autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def empty(self) -> None:
        tables = [
            row[0]
            for row in self.sql(
                "select tablename from pg_tables"
                " where schemaname = 'public' and tablename <> 'alembic_version'"
            )
        ]
        if tables:
            self.sql(
                "truncate " + ", ".join(f'"{t}"' for t in tables) + " restart identity cascade"
            )
        empty_records(self.records)
