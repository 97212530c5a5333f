"""Alembic from code: ``mediator db upgrade``/``check``, the tests, and the schema check that keeps
the app from serving on a schema older than its code (SPEC §15)."""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

ROOT = Path(__file__).resolve().parent.parent
ALEMBIC_INI = ROOT / "alembic.ini"


def alembic_config(url: str | None = None) -> AlembicConfig:
    cfg = AlembicConfig(str(ALEMBIC_INI))
    cfg.attributes["skip_logging"] = True
    if url:
        cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


@functools.cache
def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "alembic/versions has no migration"
    return head


def database_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def schema_problem(engine: Engine) -> str | None:
    """None when the database is at this code's head revision, else why not."""
    current = database_revision(engine)
    if current == head_revision():
        return None
    if current is None:
        return "the database has no Mediator schema: run `mediator db upgrade`"
    return (
        f"the database schema ({current}) is not this Mediator's ({head_revision()}): "
        "run `mediator db upgrade`"
    )
