"""What the database server itself provides: its clock and NOTIFY (the database clock is the
one that matters, docs/design.md#shape-of-the-service; claim notifications,
docs/design.md#claims-and-the-long-poll)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, func, literal, select, text
from sqlalchemy.orm import Session

from app.store.pipeline import commit_then, fetch


def database_now(s: Session) -> datetime:
    """``now()``: the transaction's time on the database clock."""
    return s.execute(select(func.now())).scalar_one()


def has_passed(s: Session, when: datetime) -> bool:
    """Whether ``when`` is at or before ``now()`` on the database clock."""
    return bool(s.execute(select(literal(when) <= func.now())).scalar_one())


# One ``pg_notify`` per payload, in a transaction that does not wait for the WAL to reach the
# disk at its commit: it holds no data (a notification lost in a crash is one the claims'
# safety net stands in for, docs/design.md#claims-and-the-long-poll), and a NOTIFY's transaction
# keeps the database's notification lock until its commit ends.
_NOTIFY_EACH = text(
    "WITH soft AS (SELECT set_config('synchronous_commit', 'off', true))"
    " SELECT pg_notify(:channel, p) FROM soft, unnest(CAST(:payloads AS text[])) AS p"
)


def notify_each(conn: Connection, channel: str, payloads: list[str]) -> None:
    """One ``pg_notify`` per payload, in one statement (on an autocommit connection: delivered at
    once, as one transaction)."""
    fetch(conn, _NOTIFY_EACH, {"channel": channel, "payloads": payloads})


def commit_and_notify(conn: Connection, channel: str, payloads: list[str]) -> Exception | None:
    """Commit the caller's transaction, then send one ``pg_notify`` per payload in a transaction
    of its own right after it, in the commit's round trip (the notified see what was committed).
    Raises the commit's error; returns the notifications' (the commit stands, they were not
    sent)."""
    return commit_then(conn, (_NOTIFY_EACH, {"channel": channel, "payloads": payloads}))


def durable_commit(s: Session) -> None:
    """This transaction's commit waits for the WAL to reach the disk again (after a statement
    that made it soft state, such as a heartbeat's)."""
    s.execute(select(func.set_config("synchronous_commit", "on", True)))


# A transaction that writes WAL, to be committed: with synchronous replication its COMMIT returns
# once the standby has every commit before it, another session's too
# (docs/deploy.md#11-a-database-with-a-standby). A transaction id alone is not enough: PostgreSQL
# waits for the standby only at the commit of a transaction that wrote WAL. The smallest such
# write is a transactional logical message (no table, no lock; a few dozen bytes of WAL).
_CONFIRM_REPLICATED = text("SELECT pg_logical_emit_message(true, 'mediator', 'replicated')")


def await_replicated(s: Session | Connection) -> None:
    """Make the caller's transaction one whose COMMIT waits for the synchronous standby (a
    read-only transaction's does not wait)."""
    fetch(s, _CONFIRM_REPLICATED, {})
