"""The pages' sessions (docs/pages.md#signing-in): rows of ``ui_sessions`` and the CSRF key of
``ui_secret``. Expiry is the database's clock, in the statement that reads the row."""

from __future__ import annotations

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from app.models import UiSecret, UiSession


def create_session(
    s: Session,
    id_digest: str,
    token_name: str,
    entry_digest: str,
    principal: str | None,
    hours: float,
) -> None:
    """One new row; the id is 256 random bits, so its digest never collides with a row's."""
    s.execute(
        insert(UiSession).values(
            id_digest=id_digest,
            token_name=token_name,
            entry_digest=entry_digest,
            principal=principal,
            expires_at=func.now() + func.make_interval(0, 0, 0, 0, 0, 0, hours * 3600),
        )
    )


def live_session(s: Session, id_digest: str) -> UiSession | None:
    """The session of that id digest while ``expires_at`` is ahead of the database's clock."""
    return s.scalars(
        select(UiSession).where(UiSession.id_digest == id_digest, UiSession.expires_at > func.now())
    ).one_or_none()


def end_session(s: Session, id_digest: str) -> bool:
    """Delete the session (sign-out, or its token entry gone or changed): whether a row went."""
    result = s.execute(delete(UiSession).where(UiSession.id_digest == id_digest))
    return bool(result.rowcount)  # type: ignore[attr-defined]


def forget_expired_sessions(s: Session) -> int:
    """Delete the sessions whose expiry passed (the reaper's pass)."""
    result = s.execute(delete(UiSession).where(UiSession.expires_at <= func.now()))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def csrf_key(s: Session) -> str | None:
    """The key the migration stored for signing the pages' CSRF tokens."""
    return s.scalar(select(UiSecret.key).where(UiSecret.id == 1))
