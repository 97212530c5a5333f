"""The documented ``deploy/nginx.conf`` in front of a real gunicorn configured by the production
sample ``deploy/mediator.yaml`` (docs/deploy.md#7-nginx, docs/security.md#the-deployment), over
HTTPS with a throwaway certificate made by the file's own self-signed example: a long-polling claim
is held and answered with the step a freed node's promotion hands it, a blob of exactly
``max_blob_bytes`` (the default, 10 MiB) goes in and comes back byte for byte while one byte more is
the Mediator's own 413, a sealed Record downloads through nginx exactly as it does directly, and the
request id passes both ways. Port 80 only redirects to HTTPS; every answer carries the security
headers; the status page and the metrics ask for a token; requests without a token are limited by
address, and sign-in whatever it carries, while requests with a token never are. Chromium, trusting
the test's certificate, signs in, cancels a run and signs out through the pages' forms, adding
nothing by hand."""

from __future__ import annotations

import io
import os
import re
import tarfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from app.config import KEYS_BY_NAME
from app.pages.views import REFERRER_POLICY
from tests.deploy.nginx import DOCUMENTED, Nginx, nginx_in_front
from tests.support.actors import cap
from tests.support.agent import claim, claimed, done
from tests.support.apps import ROOT, TOKEN, LiveServer, gunicorn_on
from tests.support.browser import BrowserUser, chromium
from tests.support.concurrency import await_condition, connect, listeners
from tests.support.contracts import contract, one_step, role
from tests.support.http import Answer, Http
from tests.support.pages import csrf_of

pytestmark = pytest.mark.needs_nginx

MAX_BLOB = KEYS_BY_NAME["max_blob_bytes"].default
LONG_POLL = KEYS_BY_NAME["claim.long_poll_seconds"].default
SAMPLE = ROOT / "deploy" / "mediator.yaml"


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: Any, pg_admin_url: str, template_db: tuple[str, str]
) -> Iterator[tuple[LiveServer, Nginx, str]]:
    """One gunicorn worker (its LISTEN connection shows when a claim waits) behind nginx, on a
    database of its own, configured by the production sample (the default body limits and
    long-poll window; a token for / and /metrics; nginx's X-Forwarded-For trusted)."""
    from app.dev.embedded import create_database, drop_database

    tmp = tmp_path_factory.mktemp("nginx-stack")
    name = f"{template_db[0]}_nginx"
    url = create_database(pg_admin_url, name, template=template_db[0])
    try:
        with gunicorn_on(url, tmp, MEDIATOR_WORKERS="1", MEDIATOR_CONFIG=str(SAMPLE)) as server:
            with nginx_in_front(server.url, tmp) as nginx:
                yield server, nginx, url
    finally:
        drop_database(pg_admin_url, name)


def _directive(block: str, name: str) -> str:
    found = re.findall(rf"^\s*{name}\s+([^;]+);", block, flags=re.M)
    assert found, f"no {name} in the block"
    return found[-1].strip()


def _seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m)?", text)
    assert m, text
    return int(m[1]) * {"ms": 0.001, "s": 1, "m": 60, None: 1}[m[2]]


def test_the_documented_limits_are_above_the_mediators_defaults() -> None:
    text = DOCUMENTED.read_text()
    claim_block = text.split("location ~ ^/v1/nodes/[^/]+/claim$", 1)[1].split("}", 1)[0]
    assert _seconds(_directive(claim_block, "proxy_read_timeout")) > LONG_POLL + 30
    assert _directive(claim_block, "proxy_buffering") == "off"
    size = _directive(text, "client_max_body_size")
    assert size.endswith("m") and int(size[:-1]) * 1024 * 1024 > MAX_BLOB


def test_a_long_poll_through_nginx_is_held_and_answered_with_the_promoted_step(stack) -> None:
    server, nginx, url = stack
    http = nginx.client(TOKEN)
    advert = {"node_id": "host-1", "capabilities": [cap("agent.reason")]}
    assert http.post("/v1/nodes", advert).status_code == 200
    assert (
        http.post("/v1/nodes", {"node_id": "board-1", "capabilities": [cap()]}).status_code == 200
    )
    # holder keeps board-1 leased with no step for it; waiter queues behind it.
    holder = contract(
        "holder",
        role("host", "agent.reason"),
        role("dut"),
        steps=[{"id": "build", "uses": "host", "run": ["build"]}],
    )
    assert http.post("/v1/runs", holder).status_code == 201
    assert http.post("/v1/runs", one_step("waiter")).status_code == 202

    answer: dict[str, Any] = {}

    def wait_for_a_step() -> None:
        started = time.monotonic()
        resp = claim(nginx.client(TOKEN), "board-1", wait=8)
        answer.update(
            status=resp.status_code, body=resp.get_json(), took=time.monotonic() - started
        )

    waiting = threading.Thread(target=wait_for_a_step, daemon=True)
    with connect(url) as sql:
        waiting.start()
        # The claim has reached gunicorn and waits there: its worker's LISTEN connection is up.
        await_condition(lambda: listeners(sql) >= 1, "the claim to wait in gunicorn")
    held_from = time.monotonic()
    assert waiting.is_alive(), answer
    step = claimed(http, "host-1")
    assert step["run_id"] == "holder"
    done(http, "holder", step["seq"], "host-1")  # holder ends: board-1 is freed, waiter promoted

    waiting.join(30)
    assert not waiting.is_alive(), "the claim never answered"
    assert answer["status"] == 200, answer
    assert (answer["body"]["run_id"], answer["body"]["name"]) == ("waiter", "work")
    assert answer["took"] < 8  # woken by the promotion, not by the end of its window
    assert time.monotonic() - held_from < 8

    # Nothing to hand out: nginx holds the claim for the whole window it asked, then the 204.
    started = time.monotonic()
    idle = claim(http, "host-1", wait=3)
    assert idle.status_code == 204, idle.get_json()
    assert time.monotonic() - started >= 3


def test_a_blob_of_the_largest_size_goes_through_and_a_record_downloads_as_it_does_directly(
    stack,
) -> None:
    server, nginx, _ = stack
    http = nginx.client(TOKEN)
    direct = Http(server.url, TOKEN)
    advert = {"node_id": "board-2", "capabilities": [cap(soc="big")]}
    assert http.post("/v1/nodes", advert).status_code == 200
    doc = contract(
        "bulky", role("dut", soc="big"), steps=[{"id": "dump", "uses": "dut", "run": ["d"]}]
    )
    assert http.post("/v1/runs", doc).status_code == 201
    step = claimed(http, "board-2")
    assert step["run_id"] == "bulky"

    data = os.urandom(MAX_BLOB)
    put = http.put(f"/v1/runs/bulky/steps/{step['seq']}/blob/dump.bin", data=data)
    assert put.status_code == 204, put.content[:300]
    back = http.get("/v1/runs/bulky/blob/dump.bin")
    assert back.status_code == 200
    assert back.content == data

    # One byte over: refused by the Mediator itself (its JSON error), nothing stored.
    over = http.put(f"/v1/runs/bulky/steps/{step['seq']}/blob/over.bin", data=data + b"x")
    assert over.status_code == 413
    assert over.get_json() == {"error": {"code": 413, "reason": "body exceeds the size limit"}}
    assert http.get("/v1/runs/bulky/blob/over.bin").status_code == 404

    assert done(http, "bulky", step["seq"], "board-2", produced=["dump.bin"])["run_state"] == (
        "SUCCEEDED"
    )
    through = http.get("/v1/runs/bulky/record")
    straight = direct.get("/v1/runs/bulky/record")
    assert through.status_code == straight.status_code == 200
    assert through.headers["Content-Type"] == "application/x-tar"
    assert len(through.content) > MAX_BLOB
    assert through.content == straight.content
    with tarfile.open(fileobj=io.BytesIO(through.content)) as tar:
        blobs = [m for m in tar.getmembers() if m.name.endswith("dump.bin")]
        assert len(blobs) == 1
        extracted = tar.extractfile(blobs[0])
        assert extracted is not None and extracted.read() == data


def test_the_request_id_passes_through_nginx_or_is_made_by_it(stack) -> None:
    _, nginx, _ = stack
    http = nginx.client(TOKEN)
    given = http.get("/healthz", headers={"X-Request-Id": "trace-4711"})
    assert given.headers["X-Request-Id"] == "trace-4711"
    made = http.get("/healthz")
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers["X-Request-Id"])  # nginx's $request_id
    assert http.get("/healthz").headers["X-Request-Id"] != made.headers["X-Request-Id"]


# ---------------------------------------------------------------- HTTPS, headers, limits

SECURITY_HEADERS = {
    "Strict-Transport-Security": "max-age=31536000",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": REFERRER_POLICY,
}


def _limit(zone: str) -> tuple[float, int]:
    """(requests a second, burst) of the documented limit on ``zone``."""
    text = DOCUMENTED.read_text()
    rate = re.search(
        rf"^\s*limit_req_zone\s+\S+\s+zone={zone}:\S+\s+rate=(\d+)r/(s|m);", text, re.M
    )
    burst = re.search(rf"^\s*limit_req\s+zone={zone}\s+burst=(\d+)\s+nodelay;", text, re.M)
    assert rate and burst, f"no limit_req_zone and limit_req for {zone}"
    return int(rate[1]) / {"s": 1, "m": 60}[rate[2]], int(burst[1])


def _limited_by_nginx(answer: Answer) -> bool:
    """nginx's own 429 (limit_req_status), not the Mediator's: its HTML page, no request id."""
    if answer.status_code != 429:
        return False
    assert "429 Too Many Requests" in answer.text and "X-Request-Id" not in answer.headers
    return True


@pytest.fixture
def own_nginx(stack, tmp_path: Path) -> Iterator[Nginx]:
    """Another nginx in front of the stack's gunicorn: rate-limit zones of its own, empty."""
    server, _, _ = stack
    with nginx_in_front(server.url, tmp_path) as nginx:
        yield nginx


def test_the_documented_https_server_takes_tls_1_2_and_newer_only() -> None:
    text = DOCUMENTED.read_text()
    assert _directive(text, "ssl_protocols").split() == ["TLSv1.2", "TLSv1.3"]
    assert _directive(text, "ssl_session_tickets") == "off"


def test_port_80_only_redirects_to_https_and_passes_nothing_on(stack) -> None:
    _, nginx, _ = stack
    page = requests.get(nginx.plain_url + "/runs/r-1?from=3", allow_redirects=False, timeout=60)
    assert page.status_code == 301
    assert page.headers["Location"] == "https://127.0.0.1/runs/r-1?from=3"

    advert = {"node_id": "plain-1", "capabilities": [cap()]}
    posted = requests.post(
        nginx.plain_url + "/v1/nodes",
        json=advert,
        headers={"Authorization": f"Bearer {TOKEN}"},
        allow_redirects=False,
        timeout=60,
    )
    assert posted.status_code == 301
    assert posted.headers["Location"] == "https://127.0.0.1/v1/nodes"
    assert "X-Request-Id" not in posted.headers  # answered by nginx, never by the Mediator
    nodes = nginx.client(TOKEN).get("/v1/nodes").get_json()
    assert "plain-1" not in str(nodes)


def test_every_answer_over_https_carries_the_security_headers_once(stack) -> None:
    _, nginx, _ = stack
    with_token, without = nginx.client(TOKEN), nginx.client(None)
    answers = {
        "the overview, signed in": (signed_in(nginx).get("/"), 200),
        "the overview sending a person to sign in": (without.get("/", allow_redirects=False), 303),
        "the sign-in page": (without.get("/signin"), 200),
        "the metrics asking for a token": (without.get("/metrics"), 401),
        "an API answer": (with_token.get("/v1/runs"), 200),
        "an API error": (with_token.get("/v1/runs/no-such-run"), 404),
        "a health check": (without.get("/healthz"), 200),
    }
    for what, (answer, status) in answers.items():
        assert answer.status_code == status, what
        for name, value in SECURITY_HEADERS.items():
            # requests joins a repeated header with ", ": equality also says "exactly once".
            assert answer.headers.get(name) == value, (what, name, answer.headers)


def test_the_production_sample_asks_a_token_for_the_pages_and_the_metrics(stack) -> None:
    _, nginx, _ = stack
    without, with_token = nginx.client(None), nginx.client(TOKEN)
    asked = without.get("/metrics")
    assert asked.status_code == 401
    assert asked.get_json() == {"error": {"code": 401, "reason": "missing or invalid token"}}
    # Pages take a signed-in session, never the bearer token (docs/pages.md#signing-in): both are
    # sent to sign in.
    for client in (without, with_token):
        sent = client.get("/", allow_redirects=False)
        assert sent.status_code == 303
        assert sent.headers["Location"].startswith("/signin")
    page = signed_in(nginx).get("/")
    assert page.status_code == 200
    assert page.headers["Content-Type"] == "text/html; charset=utf-8"
    assert 'action="/signout"' in page.text  # the overview of a signed-in person
    scraped = with_token.get("/metrics")
    assert scraped.status_code == 200
    assert "mediator_" in scraped.text


def test_requests_without_a_token_are_limited_by_address_and_requests_with_one_never_are(
    own_nginx,
) -> None:
    """From one address, at one pace: each round sends a request without Authorization and one
    with, until nginx has refused 20 of the former. The latter all reach the Mediator."""
    rate, burst = _limit("mediator_anonymous")
    refusals_wanted, most = 20, 5000  # `most`: a bound on the rounds, never reached in practice
    without: list[Answer] = []
    with_token: list[Answer] = []
    lock = threading.Lock()
    enough = threading.Event()

    def rounds() -> None:
        anonymous, fleet = own_nginx.client(None), own_nginx.client(TOKEN)
        while not enough.is_set():
            first, second = anonymous.get("/healthz"), fleet.get("/v1/nodes")
            with lock:
                without.append(first)
                with_token.append(second)
                refused = sum(a.status_code == 429 for a in without)
                if refused >= refusals_wanted or len(without) >= most:
                    enough.set()

    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(rounds) for _ in range(4)]:
            future.result()
    elapsed = time.monotonic() - started

    refused = [a for a in without if _limited_by_nginx(a)]
    passed = [a for a in without if a.status_code != 429]
    assert len(refused) >= refusals_wanted, (len(without), elapsed)
    assert len(with_token) == len(without)
    assert [a.status_code for a in with_token] == [200] * len(with_token)
    assert all(a.status_code == 200 for a in passed)
    # The bucket: burst + 1 at once, then `rate` a second (one went to nginx_in_front's probe).
    assert burst <= len(passed) <= burst + 1 + rate * elapsed + 1


def test_sign_in_is_limited_by_address_whatever_the_request_carries(own_nginx) -> None:
    rate, burst = _limit("mediator_signin")
    http = own_nginx.client(TOKEN)
    answers: list[Answer] = []
    started = time.monotonic()
    while len(answers) < 2000 and not (answers and _limited_by_nginx(answers[-1])):
        answers.append(http.get("/signin"))
    elapsed = time.monotonic() - started
    assert _limited_by_nginx(answers[-1]), len(answers)
    passed = answers[:-1]
    assert burst + 1 <= len(passed) <= burst + 1 + rate * elapsed + 1
    # Those let through reached the Mediator (whatever it answers there).
    assert all(a.status_code != 429 and "X-Request-Id" in a.headers for a in passed)


def test_the_deploy_guide_shows_the_files_own_self_signed_example() -> None:
    guide = (ROOT / "docs" / "deploy.md").read_text().replace("\\\n", " ")
    example = re.search(r"^\s*#\s*(openssl req -x509 .*)$", DOCUMENTED.read_text(), re.M)
    assert example
    shown = re.search(r"^\s*(openssl req -x509 .*)$", guide, re.M)
    assert shown and shown[1].split() == example[1].split()


@pytest.mark.needs_chromium
def test_a_browser_signs_in_cancels_a_run_and_signs_out_through_nginx(stack, tmp_path) -> None:
    """The pages' forms as chromium sends them over HTTPS through the documented nginx, nothing
    added by hand: over HTTPS the pages' CSRF check also wants a Referer of this site, which the
    browser sends only as the Referrer-Policy of the page holding the form allows."""
    _, nginx, _ = stack
    http = nginx.client(TOKEN)
    advert = {"node_id": "board-web", "capabilities": [cap(soc="web")]}
    assert http.post("/v1/nodes", advert).status_code == 200
    doc = contract(
        "from-the-page", role("dut", soc="web"), steps=[{"id": "s", "uses": "dut", "run": ["s"]}]
    )
    assert http.post("/v1/runs", doc).status_code == 201
    profile = tmp_path / "chromium"
    profile.mkdir()
    with chromium(profile, trust=nginx.ca) as driver:
        person = BrowserUser(driver, nginx.url)
        person.open("/runs/from-the-page")  # not signed in: the sign-in comes first
        assert "/signin" in driver.current_url
        person.sign_in(TOKEN)
        assert driver.current_url == nginx.url + "/runs/from-the-page"
        assert person.find("#run-state").text == "RUNNING"
        person.send("#cancel")
        assert "Form refused" not in person.text(), person.text()[:500]
        person.until(lambda: person.find("#run-state").text == "FAILED", "the run shown FAILED")
        assert http.get("/v1/runs/from-the-page").get_json()["state"] == "FAILED"
        person.sign_out()
        person.open("/runs")
        assert "/signin" in driver.current_url  # the session ended


def signed_in(nginx: Any) -> Any:
    """A person signed in over nginx with the test's token, without a browser: the sign-in
    form's CSRF token, then the form posted with the Referer a browser sends under the pages'
    Referrer-Policy (test_a_browser_signs_in_… shows that chromium does); the session cookie
    (``Secure``: this is https) stays in the client."""
    person = nginx.client(None)
    form = person.get("/signin")
    assert form.status_code == 200
    done = person._call(
        "POST",
        "/signin",
        data={"csrf_token": csrf_of(form.text), "token": TOKEN},
        # Over https the CSRF check also wants a Referer of this site; requests sends none.
        headers={"Referer": nginx.url + "/signin"},
        allow_redirects=False,
    )
    assert done.status_code == 303, done.text[:500]
    return person
