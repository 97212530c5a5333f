"""An operator's hold (drain) and quarantine from the nodes page
(docs/operators.md#holding-a-node-the-api-the-client-and-the-nodes-page, docs/pages.md#nodes-nodes):
over Flask's test client, the Drain, Resume, Quarantine and Lift forms change what ``GET /v1/nodes``
shows; the forms are shown to operators only and refused (403) to anyone else; a form without the
CSRF token, or with a reason the service refuses, changes nothing. And in chromium against a live
gunicorn: an operator drains a board with a reason and resumes it, the tile showing the hold and
then none, and what they typed survives the page's live refresh."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.expected_conditions import staleness_of

from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.apps import TOKEN, client_of
from tests.support.browser import BrowserUser
from tests.support.contracts import one_step
from tests.support.http import Http
from tests.support.pages import PageUser, csrf_of
from tests.support.submitter import submit
from tests.support.tokens import ENTRIES, SECRETS

# The browser test's gunicorn (one for the module, as tests/pages/test_pages_browser.py has it).
one_server_per_module = True
live_server_env = {"MEDIATOR_TOKENS": json.dumps(ENTRIES), "MEDIATOR_UI_INSECURE_COOKIE": "1"}

NOT_OPERATORS = ("reader", "submitter", "answerer", "node")


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"tokens": ENTRIES}


def fleet(app: Any) -> Any:
    """The legacy token's client (every role), with two boards advertised."""
    api = client_of(app)
    advertise(api, "board-1", cap("board"))
    advertise(api, "board-2", cap("board"))
    return api


def line(api: Any, node_id: str) -> dict[str, Any]:
    """The node's line of ``GET /v1/nodes``."""
    nodes = api.get("/v1/nodes").get_json()["nodes"]
    return next(n for n in nodes if n["node_id"] == node_id)


def operator(app: Any) -> PageUser:
    return PageUser(app).signed_in(SECRETS["operator"], principal="ops@lab.test")


def forms_of(html: str) -> list[tuple[str, str]]:
    """The node forms of a page: (action, node) for each."""
    return re.findall(r'data-action="([^"]+)" data-for="([^"]+)"', html)


def tile(html: str, node_id: str) -> dict[str, str]:
    """The data attributes of the node's tile."""
    found = re.search(
        rf'data-node="{re.escape(node_id)}" data-tile="([^"]*)" data-health="([^"]*)" '
        r'data-hold="([^"]*)"',
        html,
    )
    assert found, f"no tile for {node_id}"
    return dict(zip(("tile", "health", "hold"), found.groups(), strict=True))


def held(api: Any, node_id: str) -> None:
    """An operator's graceful hold of the node, set over the API."""
    resp = api.post(f"/v1/nodes/{node_id}/drain", json={"mode": "graceful", "reason": "rewiring"})
    assert resp.status_code == 200, resp.get_json()


# ---------------------------------------------------------------- drain and resume


def test_an_operators_drain_form_holds_the_node_and_resume_lifts_it(app) -> None:
    api = fleet(app)
    user = operator(app)
    html = user.page("/nodes")
    assert ("drain", "board-1") in forms_of(html) and ("quarantine", "board-1") in forms_of(html)
    assert ("resume", "board-1") not in forms_of(html)  # nothing held yet

    resp = user.send_form(
        "/nodes", "/nodes/board-1/drain", {"mode": "graceful", "reason": "rewiring"}
    )

    assert resp.status_code == 303
    assert resp.headers["Location"] == "/nodes?done=drain&node=board-1#node-board-1"
    node = line(api, "board-1")
    assert node["drain_mode"] == "graceful"
    hold = node["hold"]
    assert (hold["mode"], hold["reason"], hold["by"]) == ("graceful", "rewiring", "ops@lab.test")
    assert hold["at"]
    assert line(api, "board-2")["hold"] is None
    html = user.page("/nodes?done=drain&node=board-1")
    assert tile(html, "board-1") == {"tile": "draining", "health": "ok", "hold": "graceful"}
    assert 'id="node-notice"><code>board-1</code> is held' in html
    assert "<bdi>rewiring</bdi>" in html and "<bdi>ops@lab.test</bdi>" in html
    assert ("resume", "board-1") in forms_of(html) and ("resume", "board-2") not in forms_of(html)

    resp = user.send_form("/nodes", "/nodes/board-1/resume", {})

    assert resp.status_code == 303
    assert resp.headers["Location"] == "/nodes?done=resume&node=board-1#node-board-1"
    node = line(api, "board-1")
    assert (node["hold"], node["draining"], node["drain_mode"]) == (None, False, None)
    html = user.page("/nodes")
    assert tile(html, "board-1") == {"tile": "free", "health": "ok", "hold": ""}
    assert ("resume", "board-1") not in forms_of(html)


def test_an_at_boundary_drain_from_the_form_is_held_in_that_mode(app) -> None:
    api = fleet(app)
    form = {"mode": "at-boundary", "reason": "kernel swap"}
    assert operator(app).send_form("/nodes", "/nodes/board-2/drain", form).status_code == 303
    node = line(api, "board-2")
    assert (node["draining"], node["drain_mode"], node["hold"]["mode"]) == (
        True,
        "at-boundary",
        "at-boundary",
    )


def test_a_held_board_takes_no_new_run_and_resume_lets_the_queued_run_on(app) -> None:
    api = client_of(app)
    advertise(api, "board-1", cap("board"))
    user = operator(app)
    form = {"mode": "graceful", "reason": "x"}
    assert user.send_form("/nodes", "/nodes/board-1/drain", form).status_code == 303
    submit(api, one_step("waits"), 202)
    assert user.send_form("/nodes", "/nodes/board-1/resume", {}).status_code == 303
    assert api.get("/v1/runs/waits").get_json()["state"] == "RUNNING"


# ---------------------------------------------------------------- quarantine and lift


def test_an_operators_quarantine_form_quarantines_the_node_and_lift_returns_it(app, sql) -> None:
    api = fleet(app)
    user = operator(app)

    resp = user.send_form("/nodes", "/nodes/board-2/quarantine", {"reason": "flaky USB hub"})

    assert resp.status_code == 303
    assert resp.headers["Location"] == "/nodes?done=quarantine&node=board-2#node-board-2"
    health = line(api, "board-2")["health"]
    assert (health["state"], health["reason"]) == ("quarantined", "flaky USB hub")
    assert health["since"]
    html = user.page("/nodes")
    assert tile(html, "board-2") == {"tile": "quarantined", "health": "quarantined", "hold": ""}
    assert '<section class="tile quarantined" id="node-board-2"' in html
    assert (
        "<bdi>flaky USB hub</bdi>" in html and "1 free, 0 leased, 0 draining, 1 quarantined" in html
    )
    assert ("lift", "board-2") in forms_of(html) and ("lift", "board-1") not in forms_of(html)
    assert 'class="strikes"' not in html
    sql.execute("UPDATE node_health SET strikes = 2 WHERE node_id = 'board-2'")
    assert '<span class="strikes">(2 strikes)</span>' in user.page("/nodes")

    resp = user.send_form("/nodes", "/nodes/board-2/lift", {})

    assert resp.status_code == 303
    assert resp.headers["Location"] == "/nodes?done=lift&node=board-2#node-board-2"
    assert line(api, "board-2")["health"] == {"state": "ok", "strikes": 0}
    html = user.page("/nodes")
    assert tile(html, "board-2") == {"tile": "free", "health": "ok", "hold": ""}
    assert ("lift", "board-2") not in forms_of(html)


# ---------------------------------------------------------------- who may


@pytest.mark.parametrize("role", NOT_OPERATORS)
def test_a_caller_without_the_operator_role_sees_no_node_form(app, role) -> None:
    api = fleet(app)
    held(api, "board-1")
    assert api.post("/v1/nodes/board-2/quarantine", json={"reason": "r"}).status_code == 200
    html = PageUser(app).signed_in(SECRETS[role]).page("/nodes")
    assert forms_of(html) == []
    assert 'class="operate"' not in html and "Lift quarantine" not in html
    assert tile(html, "board-1")["hold"] == "graceful"  # the hold is shown all the same
    assert tile(html, "board-2")["health"] == "quarantined"
    assert '<div id="fleet" data-live-part>' in html  # no form: the whole fleet stays live


def test_a_readers_forged_node_forms_are_refused_and_change_nothing(app) -> None:
    api = fleet(app)
    held(api, "board-1")
    assert api.post("/v1/nodes/board-1/quarantine", json={"reason": "r"}).status_code == 200
    before = line(api, "board-1"), line(api, "board-2")
    user = PageUser(app).signed_in(SECRETS["reader"])
    token = csrf_of(user.page("/nodes"))
    forged = {
        "/nodes/board-2/drain": {"mode": "graceful", "reason": "mine now"},
        "/nodes/board-1/resume": {},
        "/nodes/board-2/quarantine": {"reason": "mine now"},
        "/nodes/board-1/lift": {},
    }
    for path, form in forged.items():
        resp = user.post(path, {"csrf_token": token, **form})
        assert resp.status_code == 403, path
        assert "token reader lacks the role: operator" in resp.text, path
    assert (line(api, "board-1"), line(api, "board-2")) == before


def test_node_forms_without_the_csrf_token_are_refused_and_change_nothing(app) -> None:
    api = fleet(app)
    held(api, "board-1")
    assert api.post("/v1/nodes/board-1/quarantine", json={"reason": "r"}).status_code == 200
    before = line(api, "board-1"), line(api, "board-2")
    user = operator(app)
    other = operator(app)  # another session's token is no better than none
    for path, form in (
        ("/nodes/board-2/drain", {"mode": "graceful", "reason": "forged"}),
        ("/nodes/board-1/resume", {}),
        ("/nodes/board-2/quarantine", {"reason": "forged"}),
        ("/nodes/board-1/lift", {}),
    ):
        for token in ({}, {"csrf_token": csrf_of(other.page("/nodes"))}):
            resp = user.post(path, {**form, **token})
            assert resp.status_code == 400, path
            assert "Form refused" in resp.text, path
    assert (line(api, "board-1"), line(api, "board-2")) == before


def test_a_node_form_signed_out_is_refused(app) -> None:
    api = fleet(app)
    user = PageUser(app)
    token = csrf_of(user.page("/signin"))
    resp = user.post(
        "/nodes/board-1/drain", {"csrf_token": token, "mode": "graceful", "reason": "x"}
    )
    assert resp.status_code == 401
    assert line(api, "board-1")["hold"] is None


# ---------------------------------------------------------------- refused reasons


def test_a_drain_without_a_reason_shows_the_error_beside_its_form_and_holds_nothing(app) -> None:
    api = fleet(app)
    user = operator(app)
    for reason in ("", "   "):
        form = {"mode": "at-boundary", "reason": reason}
        resp = user.send_form("/nodes", "/nodes/board-1/drain", form)
        assert resp.status_code == 400
        assert (
            '<p class="error form-error" data-error-for="drain">'
            "<bdi>reason: required, a text of 1 byte to 1 KiB</bdi>"
        ) in resp.text
        assert resp.text.count('data-error-for="') == 1  # beside board-1's drain form alone
        assert '<option value="at-boundary" selected>' in resp.text  # the mode chosen is kept
    assert line(api, "board-1")["hold"] is None


def test_a_reason_over_a_kib_keeps_what_was_typed_and_quarantines_nothing(app) -> None:
    api = fleet(app)
    long_reason = "é" * 600  # 1200 bytes
    resp = operator(app).send_form("/nodes", "/nodes/board-2/quarantine", {"reason": long_reason})
    assert resp.status_code == 400
    assert 'data-error-for="quarantine"><bdi>reason: at most 1024 bytes, got 1200' in resp.text
    assert f'name="reason" required maxlength="1024" value="{long_reason}"' in resp.text
    assert line(api, "board-2")["health"]["state"] == "ok"


def test_a_bad_mode_is_refused_with_the_services_reason(app) -> None:
    api = fleet(app)
    resp = operator(app).send_form("/nodes", "/nodes/board-1/drain", {"mode": "now", "reason": "x"})
    assert resp.status_code == 400
    assert "mode: must be one of graceful, at-boundary, got &#34;now&#34;" in resp.text
    assert line(api, "board-1")["hold"] is None


def test_a_node_that_never_advertised_is_a_404_page(app) -> None:
    fleet(app)
    user = operator(app)
    for path in ("/nodes/board-9/drain", "/nodes/bad%00id/drain", "/nodes/" + "x" * 300 + "/lift"):
        resp = user.send_form("/nodes", path, {"mode": "graceful", "reason": "x"})
        assert resp.status_code == 404, path
        assert "no such node" in resp.text, path


def test_an_operators_reason_fields_are_outside_the_live_parts(app) -> None:
    """The page refreshes its live parts every few seconds: a reason being typed must not be
    replaced, so for an operator each tile is live on its own and the forms are not."""
    fleet(app)
    html = operator(app).page("/nodes")
    assert '<div id="fleet">' in html
    assert 'id="node-board-1" data-live-part data-node="board-1"' in html
    box = html[html.index('id="node-board-1"') : html.index('id="node-board-2"')]
    section_end = box.index("</section>")
    assert box.index('data-action="drain"') > section_end
    assert box.index('data-action="quarantine"') > section_end


# ---------------------------------------------------------------- in chromium


def node_form(person: BrowserUser, action: str, node_id: str) -> WebElement:
    return person.find(f'form[data-action="{action}"][data-for="{node_id}"]')


def shown(person: BrowserUser, node_id: str) -> dict[str, str]:
    """What the node's tile shows now: its data attributes and its hold's line."""
    found = person.find(f'[data-node="{node_id}"]')
    shown = {name: found.get_attribute(f"data-{name}") or "" for name in ("tile", "hold")}
    return shown | {"line": found.find_element(By.CSS_SELECTOR, ".hold").text}


def press(person: BrowserUser, css: str) -> None:
    """Press a button inside a tile and wait for the page that answers: a tile refreshed between
    finding the button and clicking it is looked up again (``until`` ignores stale elements)."""
    leaving = person.find("html")

    def clicked() -> bool:
        person.find(css).click()
        return True

    person.until(clicked, f"{css} pressed")
    person.until(lambda: staleness_of(leaving)(person.driver), f"the answer to {css}")


@pytest.mark.needs_chromium
def test_an_operator_drains_a_board_with_a_reason_and_resumes_it_in_chromium(
    person, live_server
) -> None:
    api = Http(live_server.url, TOKEN)
    advertise(live_server, "board-1", cap("board", soc="imx8mp"), label="Board in rack 3")
    advertise(live_server, "board-2", cap("board", soc="rk3588"))

    person.sign_in(SECRETS["operator"], "ops@lab.test")
    person.open("/nodes")
    board = person.find('[data-node="board-1"]')
    assert board.get_attribute("data-hold") == ""
    assert not person.driver.find_elements(By.CSS_SELECTOR, 'form[data-action="resume"]')
    reason = node_form(person, "drain", "board-1").find_element(By.NAME, "reason")
    reason.send_keys("rewiring the rack")
    # The tile refreshes itself (a live part); the reason being typed under it stays.
    person.until(lambda: staleness_of(board)(person.driver), "the tile refreshed")
    assert reason.get_attribute("value") == "rewiring the rack"
    person.send('form[data-action="drain"][data-for="board-1"] button.drain')

    assert "board-1 is held" in person.find("#node-notice").text
    now = person.until(lambda: shown(person, "board-1"), "the tile read")
    assert (now["tile"], now["hold"]) == ("draining", "graceful")
    assert "graceful by ops@lab.test" in now["line"] and "rewiring the rack" in now["line"]
    hold = api.get("/v1/nodes").get_json()["nodes"][0]["hold"]
    assert (hold["mode"], hold["reason"], hold["by"]) == (
        "graceful",
        "rewiring the rack",
        "ops@lab.test",
    )
    person.screenshot("nodes-held")

    press(person, 'form[data-action="resume"][data-for="board-1"] button.resume')

    assert "board-1 is no longer held" in person.find("#node-notice").text
    now = person.until(lambda: shown(person, "board-1"), "the tile read")
    assert (now["tile"], now["hold"]) == ("free", "")
    assert now["line"] == "Hold: none"
    assert not person.driver.find_elements(By.CSS_SELECTOR, 'form[data-action="resume"]')
    assert api.get("/v1/nodes").get_json()["nodes"][0]["hold"] is None
