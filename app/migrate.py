"""Alembic from code: ``mediator server db upgrade``/``check``, the tests, and the schema check
that keeps the app from serving on a schema older than its code (docs/deploy.md#4-schema)."""

from __future__ import annotations

import functools
from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, pool

from app.db import conninfo, engine_for

# An installed package carries the scripts of the source tree's alembic/ as app/migrations/
# (setup.cfg); a source tree (an editable install included) has them beside alembic.ini.
PACKAGED_SCRIPTS = Path(__file__).resolve().parent / "migrations"
SOURCE_ROOT = Path(__file__).resolve().parent.parent
ALEMBIC_INI = SOURCE_ROOT / "alembic.ini"


def alembic_config(url: str | None = None) -> AlembicConfig:
    if (PACKAGED_SCRIPTS / "env.py").is_file():
        cfg = AlembicConfig()
        cfg.set_main_option("script_location", str(PACKAGED_SCRIPTS).replace("%", "%%"))
        cfg.set_main_option("path_separator", "os")
    else:
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
    assert head is not None, "the migration scripts have no revision"
    return head


def database_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def database_problem(url: str) -> str | None:
    """:func:`schema_problem` of the database at ``url`` (``database.url``: any form libpq
    takes), on a connection of its own."""
    # A host that drops packets answers nothing: given up after connect_timeout, like a refusal.
    engine = engine_for(url, name="mediator-check", poolclass=pool.NullPool)
    try:
        return schema_problem(engine)
    finally:
        engine.dispose()


def server_reached(url: str) -> str:
    """Which server a connection of the Mediator reaches from ``url`` (every connection it opens
    uses the same string: the pools, the gate, the listeners, the reaper, the migrations), and
    its role, as one line for ``mediator server db check``."""
    with psycopg.connect(conninfo(url), application_name="mediator-check") as conn:
        row = conn.execute(
            "SELECT pg_is_in_recovery(), current_setting('server_version')"
        ).fetchone()
        standby, version = row if row is not None else (None, "?")
        role = "a standby" if standby else "the primary"
        return f"server {conn.info.host}:{conn.info.port}, {role} (PostgreSQL {version})"


# The scan gate's session needs ``idle_session_timeout`` (PostgreSQL 14;
# docs/design.md#the-scan-gate-and-wake-marks).
MINIMUM_SERVER = (14,)


def server_problem(version: tuple[int | str, ...] | None) -> str | None:
    """None when the PostgreSQL server (``version`` as SQLAlchemy's dialect read it when it
    connected: no round trip of its own) is new enough, else why not."""
    if version is None or not isinstance(version[0], int) or (version[0],) >= MINIMUM_SERVER:
        return None
    shown = ".".join(str(v) for v in version)
    return f"PostgreSQL {shown} is too old: the Mediator needs PostgreSQL 14 or newer"


def schema_problem(engine: Engine) -> str | None:
    """None when the database is at this code's head revision on a server new enough, else why
    not."""
    current = database_revision(engine)
    too_old = server_problem(engine.dialect.server_version_info)
    if too_old:
        return too_old
    if current == head_revision():
        return None
    if current is None:
        return "the database has no Mediator schema: run `mediator server db upgrade`"
    return (
        f"the database schema ({current}) is not this Mediator's ({head_revision()}): "
        "run `mediator server db upgrade`"
    )
