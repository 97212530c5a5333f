"""The status page at / (docs/pages.md#overview-) over the Flask test client: what it shows of the
queue, the running runs, the nodes, open asks and recent verdicts, agreeing with the run view; every
stored text escaped; no token by default, and ui.require_token asking for one
(docs/pages.md#overview-)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import TOKEN, app_on, client_of
from tests.support.contracts import contract, one_step, role
from tests.support.pages import PageUser
from tests.support.scenes import build_fleet
from tests.support.status_page import element_text, rows
from tests.support.submitter import submit


def page(client: Any, **headers: str) -> str:
    resp = client.get("/", headers=headers)
    assert resp.status_code == 200, resp.data[:500]
    assert resp.headers["Content-Type"] == "text/html; charset=utf-8"
    return resp.get_data(as_text=True)


def test_the_page_shows_the_queue_the_runs_the_nodes_the_asks_and_the_verdicts(app) -> None:
    client = client_of(app)
    build_fleet(client)
    html = page(app.test_client())  # no token: the page is open by default

    assert '<meta http-equiv="refresh" content="10">' in html
    assert 'name="viewport" content="width=device-width, initial-scale=1"' in html
    assert element_text(html, "queue-depth") == "3"

    queued = rows(html, "queued-run")
    assert list(queued) == ["wait-1", "wait-2", "wait-scope"]
    assert queued["wait-1"].startswith("1 wait-1 QUEUED ana@lab.test")
    assert "dut (board): 2 live, 2 busy; held by run-asks, run-flash" in queued["wait-1"]
    assert queued["wait-2"].startswith("2 wait-2 QUEUED")
    assert "dut (scope): 1 live, 0 busy, 1 draining" in queued["wait-scope"]
    # The page's position and candidates are the run view's.
    for run_id, text in queued.items():
        view = client.get(f"/v1/runs/{run_id}").get_json()
        assert text.startswith(f"{view['queue']['position']} {run_id}")
        c = view["requires"][0]["candidates"]
        assert f"{c['live']} live, {c['busy']} busy" in text

    running = rows(html, "running-run")
    assert list(running) == ["run-flash", "run-asks"]
    assert "RUNNING" in running["run-flash"]
    assert "dut: board-1 Board in rack 3" in running["run-flash"]
    assert "0 of 2 done flash CLAIMED on board-1" in running["run-flash"]
    assert "dut: board-2" in running["run-asks"] and "sign-off ASKED" in running["run-asks"]

    nodes = rows(html, "node")
    assert list(nodes) == ["board-1", "board-2", "scope-1"]
    assert nodes["board-1"].startswith("board-1 Board in rack 3 run-flash expires in ")
    assert "run-asks expires in" in nodes["board-2"]
    assert "free draining: graceful" in nodes["scope-1"]
    assert all(" s ago" in text for text in nodes.values())

    asks = rows(html, "ask")
    assert list(asks) == ["run-asks"]
    assert "sign-off (seq 1) Does the board boot?" in asks["run-asks"]

    finished = rows(html, "finished-run")
    assert list(finished) == ["done-bad", "done-ok"]  # the last to end first
    assert finished["done-bad"].startswith("done-bad FAILED work: exit_code wanted 0, got 1")
    assert finished["done-ok"].startswith("done-ok SUCCEEDED")


def test_an_empty_mediator_says_so(client) -> None:
    html = page(client)
    assert element_text(html, "queue-depth") == "0"
    for text in (
        "Nothing is queued.",
        "Nothing is running.",
        "No node is live.",
        "No ask is open.",
        "No run has finished yet.",
    ):
        assert text in html


HOSTILE = '<script>alert("x")</script>'
HOSTILE_ATTR = '"><img src=x onerror=alert(1)>'


def test_every_stored_text_is_escaped(app) -> None:
    client = client_of(app)
    advertise(client, "board-1", cap("board", soc=HOSTILE), label=HOSTILE)
    advertise(client, "board-2", cap("board", soc=HOSTILE), label=HOSTILE_ATTR)
    asking = contract(
        "asks",
        role("dut", soc=HOSTILE),
        steps=[
            {"id": "q", "ask": {"prompt": HOSTILE}, "out": ["decision"]},
            {"id": "go", "uses": "dut", "run": ["x"], "needs": ["q"]},
        ],
    )
    submit(client, asking, 201, HOSTILE_ATTR)
    submit(client, contract("other", role("dut", soc=HOSTILE)), 201)
    submit(client, contract("waits", role("dut", soc=HOSTILE)), 202, HOSTILE_ATTR)

    html = page(client)
    for raw in (HOSTILE, HOSTILE_ATTR, "<img", "<script>alert"):
        assert raw not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in html
    queued = rows(html, "queued-run")
    assert f"soc={HOSTILE}" in queued["waits"]  # shown as text, not markup
    assert HOSTILE_ATTR in queued["waits"]
    assert HOSTILE in rows(html, "ask")["asks"]
    assert HOSTILE in rows(html, "node")["board-1"]


def test_user_text_is_isolated_in_bdi_so_a_bidi_override_cannot_turn_the_page(app) -> None:
    """A principal, a prompt or a label holding U+202E (right-to-left override) is
    shown inside <bdi>, so it cannot reorder the text around it
    (docs/security.md#input-and-load)."""
    client = client_of(app)
    flipped = "qa\u202eexe.txt"
    advertise(client, "board-1", cap("board"), label=flipped)
    asking = contract(
        "asks",
        role("dut"),
        steps=[
            {"id": "q", "ask": {"prompt": flipped}, "out": ["decision"]},
            {"id": "go", "uses": "dut", "run": ["x"], "needs": ["q"]},
        ],
    )
    submit(client, asking, 201, flipped)
    submit(client, contract("waits", role("dut")), 202, flipped)

    html = page(client)

    shown = html.count(flipped)
    assert shown >= 3  # the label, the prompt, the principals
    assert html.count(f"<bdi>{flipped}</bdi>") == shown


@pytest.fixture
def guarded(db_url: str, tmp_path: Any) -> Any:
    with app_on(db_url, tmp_path / "records", **{"ui.require_token": True}) as application:
        yield application


def test_ui_require_token_sends_a_browser_to_the_sign_in_and_takes_no_credentials(guarded) -> None:
    """With ui.require_token (docs/pages.md#overview-) the overview needs a signed-in session; a
    bearer token or Basic credentials (what a browser sent after the old challenge) no longer open
    it."""
    plain = guarded.test_client()
    asked = plain.get("/")
    assert asked.status_code == 303
    assert asked.headers["Location"] == "/signin?next=/"
    basic = base64.b64encode(f"ops:{TOKEN}".encode()).decode()
    for credentials in (f"Bearer {TOKEN}", f"Basic {basic}"):
        resp = plain.get("/", headers={"Authorization": credentials})
        assert resp.status_code == 303, credentials

    PageUser(guarded).signed_in(TOKEN).page("/")


def test_the_page_asks_no_token_by_default_and_the_api_still_does(client, app) -> None:
    plain = app.test_client()
    page(plain)
    assert plain.get("/v1/runs").status_code == 401
    submit(client, one_step("r1"), 422)  # no node at all: rejected, finished at once
    assert "r1" in rows(page(plain), "finished-run")


def test_on_a_schema_not_this_codes_the_page_is_a_503(fresh_db_url: str, tmp_path: Any) -> None:
    import psycopg

    from app.config import to_libpq_url

    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'an-older-one'")
    with app_on(fresh_db_url, tmp_path / "records") as application:
        resp = application.test_client().get("/")
    assert resp.status_code == 503
    assert "run `mediator server db upgrade`" in resp.get_data(as_text=True)
