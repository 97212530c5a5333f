"""The routes outside /v1: health, readiness and the OpenAPI document never ask for a token;
``/metrics`` and the status page ask for any valid token when ``metrics.require_token`` or
``ui.require_token`` says so, through ``check_token_when`` / ``require_token_when``, which
also give the view the caller (its token's name, roles and max_priority). A route that checks no
token still counts a bad ``Authorization`` header as a failed authentication."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask, g

from app.api.auth import check_token_when, require_token_when
from tests.support.apps import app_on
from tests.support.tokens import ENTRIES, SECRETS, token_client


def _caller_json() -> dict[str, Any]:
    c = g.get("caller")
    if c is None:
        return {"caller": None}
    return {"caller": c.token_name, "max_priority": c.max_priority, "principal": c.principal}


@pytest.fixture
def keys() -> dict[str, Any]:
    return {}


@pytest.fixture
def probed(db_url, tmp_path, keys) -> Iterator[Flask]:
    """A Mediator with two routes outside /v1 standing in for /metrics and the status page:
    one wears the decorator, the other calls the check."""
    with app_on(db_url, tmp_path / "records", tokens=ENTRIES, **keys) as app:

        @app.get("/probe/metrics")
        @require_token_when("metrics.require_token")
        def probe_metrics() -> dict[str, Any]:
            return _caller_json()

        @app.get("/probe/ui")
        def probe_ui() -> dict[str, Any]:
            check_token_when("ui.require_token")
            return _caller_json()

        yield app


OPEN = ["/healthz", "/readyz", "/v1/openapi.json"]


def test_by_default_neither_asks_for_a_token(probed):
    anyone = token_client(probed, None)
    for path in ("/probe/metrics", "/probe/ui", *OPEN):
        resp = anyone.get(path)
        assert resp.status_code == 200, path
    assert anyone.get("/probe/metrics").get_json() == {"caller": None}


@pytest.mark.parametrize(
    ("keys", "closed", "open_"),
    [
        ({"metrics.require_token": True}, "/probe/metrics", "/probe/ui"),
        ({"ui.require_token": True}, "/probe/ui", "/probe/metrics"),
    ],
)
def test_require_token_asks_for_any_valid_token(probed, keys, closed, open_):
    for secret in (None, "not-a-token"):
        resp = token_client(probed, secret).get(closed)
        assert resp.status_code == 401
        assert resp.get_json() == {"error": {"code": 401, "reason": "missing or invalid token"}}
    for who in ("reader", "node-n2", "submitter", "answerer", "operator", "legacy"):
        assert token_client(probed, SECRETS[who]).get(closed).status_code == 200, who
    assert token_client(probed, None).get(open_).status_code == 200
    for path in OPEN:
        assert token_client(probed, None).get(path).status_code == 200, path


@pytest.mark.parametrize("keys", [{"metrics.require_token": True}])
def test_the_view_gets_the_caller_with_its_max_priority(probed, keys):
    def seen(who: str, principal: str | None = None) -> dict[str, Any]:
        return token_client(probed, SECRETS[who], principal).get("/probe/metrics").get_json()

    assert seen("submitter", "bob@example.com") == {
        "caller": "sub",
        "max_priority": 0,
        "principal": "bob@example.com",
    }
    assert seen("operator")["max_priority"] == 100
    assert seen("legacy") == {"caller": "token", "max_priority": 100, "principal": None}
    assert seen("alice")["principal"] == "alice@example.com"


@pytest.mark.parametrize("keys", [{"metrics.require_token": True, "ui.require_token": True}])
def test_health_readiness_and_the_document_stay_open_whatever_is_required(probed, keys):
    for path in OPEN:
        assert token_client(probed, None).get(path).status_code == 200, path


# ------------------------------------------------------------------ a header nobody asked for

# The sample nginx limits by address only the requests without an Authorization header, and leaves
# those with one to the Mediator's limit on failed authentications: a route that checks no token
# must still count a bad header, or any header would step around both limits.
UNCHECKED = {
    "/readyz": 200,  # a query of the database each time
    "/healthz": 200,
    "/v1/openapi.json": 200,
    "/metrics": 200,  # open by default
    "/": 200,  # the overview, open by default
    "/runs": 303,  # a page: to the sign-in
    "/no-such-route": 404,
}


@pytest.mark.parametrize("path", list(UNCHECKED))
def test_a_bad_authorization_to_a_route_that_checks_no_token_counts_as_a_failed_authentication(
    app, sql, path
):
    bogus = token_client(app, "x")
    bogus.environ_base["REMOTE_ADDR"] = "192.0.2.40"

    statuses = [bogus.get(path).status_code for _ in range(31)]

    # Served as without a header while the address is within its 30 failures a minute, then 429.
    assert statuses == [UNCHECKED[path]] * 30 + [429]
    assert sql.execute("select address, failures from auth_failures").fetchall() == [
        ("192.0.2.40", 30)
    ]
    # A good token from another address is served and counts nothing.
    good = token_client(app, SECRETS["legacy"])
    good.environ_base["REMOTE_ADDR"] = "192.0.2.41"
    assert good.get(path).status_code == UNCHECKED[path]
    assert sql.execute("select count(*) from auth_failures").fetchone() == (1,)
