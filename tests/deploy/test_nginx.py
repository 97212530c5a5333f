"""The documented ``deploy/nginx.conf`` in front of a real gunicorn (SPEC §15): a long-polling
claim is held and answered with the step a freed node's promotion hands it, a blob of exactly
``max_blob_bytes`` (the default, 10 MiB) goes in and comes back byte for byte while one byte
more is the Mediator's own 413, a sealed Record downloads through nginx exactly as it does
directly, and the request id passes both ways."""

from __future__ import annotations

import io
import os
import re
import tarfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.config import KEYS_BY_NAME
from tests.agent import claim, claimed, done
from tests.apps import TOKEN, LiveServer, gunicorn_on
from tests.concurrency.common import await_condition, connect
from tests.deploy.http import Http
from tests.deploy.nginx import DOCUMENTED, Nginx, nginx_in_front
from tests.helpers import cap, contract, one_step, role

MAX_BLOB = KEYS_BY_NAME["max_blob_bytes"].default
LONG_POLL = KEYS_BY_NAME["claim.long_poll_seconds"].default


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: Any, pg_admin_url: str, template_db: tuple[str, str]
) -> Iterator[tuple[LiveServer, Nginx, str]]:
    """One gunicorn worker (its LISTEN connection shows when a claim waits) behind nginx, on a
    database of its own; the default body limits and long-poll window."""
    from app.dev.embedded import create_database, drop_database

    tmp = tmp_path_factory.mktemp("nginx-stack")
    name = f"{template_db[0]}_nginx"
    url = create_database(pg_admin_url, name, template=template_db[0])
    try:
        with gunicorn_on(url, tmp, MEDIATOR_WORKERS="1") as server:
            with nginx_in_front(server.url, tmp) as nginx:
                yield server, nginx, url
    finally:
        drop_database(pg_admin_url, name)


def _listeners(sql: Any) -> int:
    return sql.execute(
        "select count(*) from pg_stat_activity where datname = current_database()"
        " and application_name = 'mediator-listener' and query ilike 'LISTEN%%'"
    ).fetchone()[0]


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
    http = Http(nginx.url, TOKEN)
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
        resp = claim(Http(nginx.url, TOKEN), "board-1", wait=8)
        answer.update(
            status=resp.status_code, body=resp.get_json(), took=time.monotonic() - started
        )

    waiting = threading.Thread(target=wait_for_a_step, daemon=True)
    with connect(url) as sql:
        waiting.start()
        # The claim has reached gunicorn and waits there: its worker's LISTEN connection is up.
        await_condition(lambda: _listeners(sql) >= 1, "the claim to wait in gunicorn")
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
    http = Http(nginx.url, TOKEN)
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
    http = Http(nginx.url, TOKEN)
    given = http.get("/healthz", headers={"X-Request-Id": "trace-4711"})
    assert given.headers["X-Request-Id"] == "trace-4711"
    made = http.get("/healthz")
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers["X-Request-Id"])  # nginx's $request_id
    assert http.get("/healthz").headers["X-Request-Id"] != made.headers["X-Request-Id"]
