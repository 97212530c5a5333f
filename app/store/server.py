"""What the database server itself provides: its clock and NOTIFY (SPEC §1: the database clock is
the one that matters; SPEC §8: claim notifications)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, func, literal, select
from sqlalchemy.orm import Session


def database_now(s: Session) -> datetime:
    """``now()``: the transaction's time on the database clock."""
    return s.execute(select(func.now())).scalar_one()


def has_passed(s: Session, when: datetime) -> bool:
    """Whether ``when`` is at or before ``now()`` on the database clock."""
    return bool(s.execute(select(literal(when) <= func.now())).scalar_one())


def notify(s: Session | Connection, channel: str, payload: str) -> None:
    """``pg_notify``: delivered to the channel's listeners when the transaction commits (at once
    on an autocommit connection)."""
    if isinstance(s, Connection):
        # Sent as it is, with no statement to build or compile: once after most requests.
        s.exec_driver_sql(_NOTIFY, {"channel": channel, "payload": payload})
    else:
        s.execute(select(func.pg_notify(channel, payload)))


_NOTIFY = "SELECT pg_notify(%(channel)s, %(payload)s)"


def durable_commit(s: Session) -> None:
    """This transaction's commit waits for the WAL to reach the disk again (after a statement
    that made it soft state, such as a heartbeat's)."""
    s.execute(select(func.set_config("synchronous_commit", "on", True)))
