"""The pages' sessions (docs/pages.md#signing-in): sign-in makes a server-side session whose random
id is all the cookie holds; every request reads it again with its token's entry, and ends it when
the entry was removed, changed or expired."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from app.context import Context
from app.store.ui_sessions import create_session, csrf_key, end_session, live_session
from app.tokens import Token, entry_digest

MAX_COOKIE_CHARS = 100  # the id is 43 characters; anything much longer is no id of ours


@dataclass(frozen=True)
class PageSession:
    """A live session: its id's digest, the token it signed in with, the principal it gave."""

    id_digest: str
    token: Token
    principal: str | None


def _id_digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


def sign_in(ctx: Context, token: Token, principal: str | None) -> str:
    """A new session for ``token`` (a verified one): the cookie's value, 256 random bits."""
    session_id = secrets.token_urlsafe(32)
    with ctx.db.begin() as s:
        create_session(
            s,
            _id_digest(session_id),
            token.name,
            entry_digest(token),
            principal,
            ctx.config["ui.session_hours"],
        )
    return session_id


def session_of(ctx: Context, session_id: str | None) -> PageSession | None:
    """The live session of a cookie's id, or None. A session whose token entry is gone, changed
    or expired is ended here, so it never comes back with the entry."""
    if not session_id or len(session_id) > MAX_COOKIE_CHARS:
        return None
    key = _id_digest(session_id)
    with ctx.db.read() as s:
        row = live_session(s, key)
        if row is None:
            return None
        name, digest_then, principal = row.token_name, row.entry_digest, row.principal
    token = ctx.tokens.named(name)
    if (
        token is None
        or not hmac.compare_digest(entry_digest(token), digest_then)
        or token.expired(datetime.now(UTC))
    ):
        with ctx.db.begin() as s:
            end_session(s, key)
        return None
    return PageSession(key, token, principal)


def sign_out(ctx: Context, session_id: str | None) -> None:
    if session_id and len(session_id) <= MAX_COOKIE_CHARS:
        with ctx.db.begin() as s:
            end_session(s, _id_digest(session_id))


def page_secret(ctx: Context) -> str:
    """The key the pages' CSRF tokens are signed with: one for every process and host, made by
    the migration."""
    with ctx.db.read() as s:
        key = csrf_key(s)
    if key is None:  # a database migrated before 0011 never serves: the schema check refuses it
        raise RuntimeError("ui_secret has no key: run `mediator server db upgrade`")
    return key


def csrf_seed(key: str, page_session: PageSession) -> str:
    """The CSRF seed of a signed-in browser, derived from its session (docs/pages.md#signing-in): a
    form made for one session is refused in another, and after sign-out."""
    return hmac.new(key.encode(), b"csrf:" + page_session.id_digest.encode(), "sha256").hexdigest()
