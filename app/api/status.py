"""The status page at ``/`` (SPEC §14): server-rendered HTML, read-only, refreshing itself. No
token by default; ``ui.require_token`` makes it ask for one (SPEC §13)."""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, current_app, render_template, request

from app.api.auth import verified_token
from app.api.common import ctx
from app.errors import Unauthorized
from app.services.status import status

blp = Blueprint(
    "status", __name__, template_folder=str(Path(__file__).resolve().parent.parent / "templates")
)

REFRESH_SECONDS = 10
# A browser asks its user for credentials on this challenge; the token goes in the password.
CHALLENGE = 'Basic realm="Mediator status", charset="UTF-8"'


def token_is_valid(secret: str) -> bool:
    """Whether ``secret`` is a token this Mediator accepts, of any role (``ui.require_token``
    asks for any valid token, SPEC §13): the configured tokens and the legacy one, through the
    process's cache of checked secrets."""
    return verified_token(secret) is not None


def presented_secret() -> str | None:
    """The token of ``Authorization: Bearer <token>``, or the password of Basic credentials
    (what a browser sends after the challenge; the user name is not read)."""
    auth = request.authorization
    if auth is None:
        return None
    if auth.type == "bearer":
        return auth.token or None
    if auth.type == "basic":
        return auth.password or None
    return None


def require_page_token() -> None:
    if not ctx().config["ui.require_token"]:
        return
    secret = presented_secret()
    if secret is None or not token_is_valid(secret.strip()):
        raise Unauthorized(headers={"WWW-Authenticate": CHALLENGE})


@blp.get("/")
def page() -> tuple[str, int, dict[str, str]]:
    require_page_token()
    current_app.extensions["mediator.schema"].check()  # 503 on a schema not this code's
    html = render_template("status.html", s=status(ctx()), refresh=REFRESH_SECONDS)
    return html, 200, {"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-store"}
