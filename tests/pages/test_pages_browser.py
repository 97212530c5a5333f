"""The pages in a real browser (docs/pages.md#pages-for-people): Debian's headless chromium, driven
by selenium through chromium-driver, against a live gunicorn. A person signs in, answers an ask
through its form and sees the run go on, sees a log line uploaded after the page loaded appear,
cancels a queued run; a reader is refused an answer; a forged cross-site POST is refused and changes
nothing. Each page is photographed on the way (tests/artifacts/pages; docs/pages with
MEDIATOR_UPDATE_SCREENSHOTS=1).

One gunicorn and one browser for the module: starting either costs seconds on a small machine."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done
from tests.support.apps import TOKEN
from tests.support.contracts import contract, one_step, role
from tests.support.http import Http
from tests.support.submitter import step_state, submit
from tests.support.tokens import ENTRIES, SECRETS

pytestmark = pytest.mark.needs_chromium

one_server_per_module = True
live_server_env = {"MEDIATOR_TOKENS": json.dumps(ENTRIES), "MEDIATOR_UI_INSECURE_COOKIE": "1"}

DECISION = {
    "type": "object",
    "required": ["verdict"],
    "properties": {
        "verdict": {"enum": ["ship", "hold"], "title": "Verdict"},
        "note": {"type": "string", "title": "Note", "description": "what you saw"},
    },
}


@pytest.fixture
def api(live_server: Any) -> Http:
    return Http(live_server.url, TOKEN)


def asking(run_id: str) -> dict[str, Any]:
    return contract(
        run_id,
        role("dut"),
        steps=[
            {
                "id": "sign-off",
                "ask": {"prompt": "Does the board boot?"},
                "out": ["decision"],
                "schema": {"decision": DECISION},
            },
            {"id": "boot", "uses": "dut", "run": ["boot"], "needs": ["sign-off"]},
        ],
    )


def test_sign_in_answer_an_ask_through_its_form_and_see_the_run_go_on(person, api) -> None:
    advertise(api, "board-1", cap("board", soc="imx8mp"), label="Board in rack 3")
    advertise(api, "scope-1", cap("scope"), policy={"drain": "graceful"})
    submit(api, asking("release-42"), 201, "ana@lab.test")
    submit(api, one_step("nightly-7"), 202, "ci@lab.test")  # waits for the board: a queue to show

    person.open("/asks")  # not signed in: the sign-in comes first, then the asks
    assert "/signin" in person.driver.current_url
    person.screenshot("signin")
    person.sign_in(SECRETS["operator"])
    assert person.driver.current_url.endswith("/asks")
    person.ask_form("release-42", 1).find_element("name", "note").send_keys("boots to a shell")
    person.screenshot("asks")
    person.answer_with_button("release-42", 1, "verdict", "ship")

    person.until(lambda: "/runs/release-42" in person.driver.current_url, "the run's page")
    assert "Your answer to step 1 was taken" in person.text()
    stored = api.get("/v1/runs/release-42/blob/decision").get_json()
    assert stored == {"verdict": "ship", "note": "boots to a shell"}
    # The run goes on: its node takes the next step, and the page shows it without a reload.
    step = claimed(api, "board-1")
    assert (step["run_id"], step["seq"]) == ("release-42", 2)
    person.until(
        lambda: person.find('tr.step[data-seq="2"]').get_attribute("data-state") == "CLAIMED",
        "boot shown CLAIMED",
    )
    # The step started after the page loaded: its log is followed all the same.
    assert api.put("/v1/runs/release-42/steps/2/log", data=b"kernel up\n").status_code == 200
    person.until(lambda: "kernel up" in person.find("#log-2").text, "boot's log shown")
    person.open("/nodes")
    assert person.find('[data-node="board-1"]').get_attribute("data-tile") == "leased"
    person.screenshot("nodes")
    person.open("/")
    person.screenshot("overview")
    person.open("/runs")
    person.screenshot("runs")

    person.open("/runs/release-42")
    done(api, "release-42", 2, "board-1")
    person.until(lambda: person.find("#run-state").text == "SUCCEEDED", "the run shown SUCCEEDED")
    person.until(lambda: person.find("#verdict-state").text == "SUCCEEDED", "the verdict shown")
    person.until(lambda: "kernel up" in person.find("#log-2").text, "boot's log, after its end")
    person.screenshot("run")


def test_a_log_line_uploaded_after_the_page_loaded_appears_on_the_run_page(person, api) -> None:
    advertise(api, "board-1", cap("board"))
    submit(api, one_step("flash-7"), 201)
    step = claimed(api, "board-1")
    api.put(f"/v1/runs/flash-7/steps/{step['seq']}/log", data=b"flashing image\n")

    person.sign_in(SECRETS["reader"])
    person.open("/runs/flash-7")
    log = person.find(f"#log-{step['seq']}")
    person.until(lambda: "flashing image" in log.text, "the log read so far")

    resp = api.put(f"/v1/runs/flash-7/steps/{step['seq']}/log", data=b"written after the load\n")
    assert resp.status_code == 200
    person.until(lambda: "written after the load" in log.text, "the new line appended")
    assert log.text.splitlines() == ["flashing image", "written after the load"]
    person.screenshot("run-live-log")


def test_cancel_a_queued_run_from_its_page(person, api) -> None:
    advertise(api, "board-1", cap("board"))
    submit(api, one_step("holder"), 201)
    submit(api, one_step("waits"), 202, "ana@lab.test")

    person.sign_in(SECRETS["operator"])
    person.open("/runs/waits")
    assert "Position 1 (0 ahead)" in person.find("#queue-position").text
    assert "held by holder" in person.find("#waits-for").text
    person.screenshot("run-queued")
    person.find("#cancel").click()
    person.until(lambda: person.find("#run-state").text == "FAILED", "the run shown FAILED")
    assert api.get("/v1/runs/waits").get_json()["state"] == "FAILED"
    assert "cancelled by op" in person.text()


def test_a_reader_is_refused_an_answer(person, api) -> None:
    advertise(api, "board-1", cap("board"))
    submit(api, asking("release-43"), 201)

    person.sign_in(SECRETS["reader"])
    person.open("/asks")
    assert "lacks the role answerer" in person.ask_form("release-43", 1).text
    person.answer_with_button("release-43", 1, "verdict", "ship")
    person.until(lambda: "Not allowed" in person.text(), "the refusal")
    assert "token reader lacks the role: answerer or operator" in person.text()
    assert step_state(api, "release-43", 1) == "ASKED"


class ForgingSite:
    """Another site's page that posts a cancel form to the Mediator as soon as it loads."""

    def __init__(self, target: str) -> None:
        page = (
            "<!doctype html><title>win a prize</title>"
            f'<form id="f" method="post" action="{target}"><input name="cancel" value="1"></form>'
            "<script>document.getElementById('f').submit()</script>"
        ).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_forged_cross_site_post_is_refused_and_changes_nothing(person, api) -> None:
    advertise(api, "board-1", cap("board"))
    submit(api, one_step("holder"), 201)
    submit(api, one_step("waits"), 202)
    person.sign_in(SECRETS["operator"])  # the victim is signed in

    site = ForgingSite(person.base + "/runs/waits/cancel")
    try:
        person.driver.get(site.url)
        person.until(lambda: "Form refused" in person.text(), "the refusal")
    finally:
        site.close()
    assert "nothing was changed" in person.text()
    assert api.get("/v1/runs/waits").get_json()["state"] == "QUEUED"
    events = api.get("/v1/runs/waits/events").get_json()["events"]
    assert [e["to"] for e in events] == ["QUEUED"]
