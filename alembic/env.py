"""Alembic environment: the database URL comes from the Mediator's configuration
(docs/configuration.md#keys).

``mediator db upgrade`` and the tests pass the URL in ``config.attributes["url"]``; plain
``alembic upgrade head`` reads MEDIATOR_CONFIG / MEDIATOR_DATABASE_URL / DATABASE_URL like the app.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import pool

from app.config import load_config
from app.db import engine_for
from app.models import Base

config = context.config
if config.config_file_name is not None and not config.attributes.get("skip_logging"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    """The database's URL or keyword string as configured (several hosts allowed)."""
    url = config.attributes.get("url")
    if url:
        return str(url)
    return load_config().database_url


def run_migrations_offline() -> None:
    # SQL printed, not run: only the dialect matters.
    context.configure(
        dialect_name="postgresql", target_metadata=target_metadata, literal_binds=True
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = engine_for(_url(), name="mediator-migrate", poolclass=pool.NullPool)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
