"""What ``systemctl reload mediator`` (a HUP to gunicorn's master) changes: a token removed where
the deploy samples keep it is refused from then on, on the API and on the pages (its session
ends), and tokens kept in the environment, which a reload does not read again, are named in a
warning when gunicorn starts and at every reload (docs/tokens.md, "Changing tokens")."""

from __future__ import annotations

import hashlib
import json
import secrets
from pathlib import Path
from typing import Any

import psycopg
import requests

from app.config import to_libpq_url
from tests.deploy.sample import Installed
from tests.support.apps import LiveServer, gunicorn_on
from tests.support.pages import PageUser

ENV_WARNING = "tokens in the environment are read only when the service starts"


def entry(name: str, secret: str) -> dict[str, Any]:
    return {
        "name": name,
        "sha256": hashlib.sha256(secret.encode()).hexdigest(),
        "roles": ["reader"],
    }


def runs_status(server: LiveServer, secret: str) -> int:
    """``GET /v1/runs`` with that secret, on a connection of its own."""
    headers = {"Authorization": f"Bearer {secret}"}
    return requests.get(server.url + "/v1/runs", headers=headers, timeout=30).status_code


def logged(server: LiveServer) -> list[dict[str, Any]]:
    assert server.log is not None
    return [
        json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")
    ]


def test_a_token_removed_where_the_samples_keep_it_is_refused_after_a_reload(
    fresh_db_url: str, tmp_path: Path
) -> None:
    legacy, leaving, staying = (secrets.token_urlsafe(32) for _ in range(3))
    installed = Installed(tmp_path / "etc", fresh_db_url, tmp_path / "records")
    installed.set_tokens(legacy, [entry("leaving", leaving), entry("staying", staying)])
    with gunicorn_on(fresh_db_url, tmp_path, **installed.environment()) as server:
        assert [runs_status(server, s) for s in (legacy, leaving, staying)] == [200] * 3
        browser = PageUser(server.url).signed_in(leaving)
        assert browser.get("/runs").status_code == 200

        # The operator removes two tokens where the samples keep them, then reloads.
        installed.set_tokens(None, [entry("staying", staying)])
        server.reload()

        assert runs_status(server, staying) == 200  # new workers serve, with the token left
        assert runs_status(server, leaving) == 401
        assert runs_status(server, legacy) == 401
        ended = browser.get("/runs")
        assert ended.status_code == 303, ended.text[:500]
        assert ended.headers["Location"].startswith("/signin?next=")
        with psycopg.connect(to_libpq_url(fresh_db_url)) as sql:
            assert sql.execute("select count(*) from ui_sessions").fetchone() == (0,)
        warned = [line for line in logged(server) if line["event"].startswith(ENV_WARNING)]
        assert warned == []  # the samples keep no token in the environment


def test_tokens_in_the_environment_are_named_in_a_warning_at_start_and_at_every_reload(
    fresh_db_url: str, tmp_path: Path
) -> None:
    env = {"MEDIATOR_WORKERS": "1", "MEDIATOR_TOKENS": None}  # MEDIATOR_TOKEN: the test's token
    with gunicorn_on(fresh_db_url, tmp_path, **env) as server:
        at_start = [line for line in logged(server) if line["event"].startswith(ENV_WARNING)]
        server.reload()
        warned = [line for line in logged(server) if line["event"].startswith(ENV_WARNING)]
    assert len(at_start) == 1, at_start
    assert len(warned) == 2, warned
    for line in warned:
        assert line["level"] == "warning"
        assert line["variables"] == ["MEDIATOR_TOKEN"]
        assert "a token removed there works until a restart" in line["event"]
