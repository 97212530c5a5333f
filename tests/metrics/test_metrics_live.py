"""``GET /metrics`` of a real gunicorn with two workers (docs/metrics.md#get-metrics): whichever
worker answers a scrape, the counters are the sum over both workers (prometheus-client's
multiprocess mode), and the database's figures are read once, never doubled. And every line gunicorn
writes on stderr — its master's, its workers', the app's — is one JSON object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.mmap_dict import MmapedDict

from tests.support.apps import ROOT, LiveServer, gunicorn_on
from tests.support.contracts import one_step
from tests.support.metrics import Samples, parse, value
from tests.support.processes import free_port

SCRAPES = 8  # each on a new connection: both workers answer some of them
HEALTHZ = {"method": "GET", "route": "/healthz", "status": "200"}


@pytest.fixture
def metrics_dir(tmp_path: Path) -> Path:
    return tmp_path / "prometheus"


@pytest.fixture
def live(fresh_db_url: str, tmp_path: Path, metrics_dir: Path) -> Iterator[LiveServer]:
    env = {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "MEDIATOR_LOG_LEVEL": "info"}
    with gunicorn_on(fresh_db_url, tmp_path, **env) as server:
        yield server


def scrape(live: LiveServer) -> Samples:
    resp = requests.get(live.url + "/metrics", timeout=30)
    assert resp.status_code == 200, resp.text
    return parse(resp.text)


def healthz_by_worker(metrics_dir: Path) -> dict[int, float]:
    """GET /healthz answers counted in each worker's own file (counter_<pid>.db). A file that a
    worker is creating at this moment may still be empty (prometheus-client makes it, then sizes
    it): it holds no count yet."""
    counts: dict[int, float] = {}
    for path in metrics_dir.glob("counter_*.db"):
        pid = int(path.stem.split("_")[1])
        if path.stat().st_size < 8:  # not even its header yet
            continue
        for key, count, _, _ in MmapedDict.read_all_values_from_file(str(path)):
            _, name, labels, _ = json.loads(key)
            if name == "mediator_http_requests_total" and labels == HEALTHZ:
                counts[pid] = counts.get(pid, 0) + count
    return counts


def test_both_workers_answer_and_every_scrape_sums_them(live: LiveServer, metrics_dir: Path):
    sent = 0
    # gunicorn hands each new connection to whichever worker accepts it first: send until both
    # workers have answered some (an event the workers' files show), at most a few hundred.
    while len(healthz_by_worker(metrics_dir)) < 2:
        assert sent < 400, f"one worker answered all of {sent} requests"
        assert requests.get(live.url + "/healthz", timeout=30).status_code == 200
        sent += 1
    seen = [value(scrape(live), "mediator_http_requests_total", **HEALTHZ) for _ in range(SCRAPES)]
    assert seen == [sent] * SCRAPES
    assert sum(healthz_by_worker(metrics_dir).values()) == sent


def test_submits_and_database_figures_are_counted_once_whichever_worker_answers(
    live: LiveServer,
):
    advert = {"node_id": "n1", "capabilities": [{"capability": "board", "attrs": {}}]}
    assert live.post("/v1/nodes", advert).status_code == 200
    assert live.post("/v1/runs", one_step("r1")).status_code == 201
    assert live.post("/v1/runs", one_step("r2")).status_code == 202
    for _ in range(SCRAPES):
        samples = scrape(live)
        assert value(samples, "mediator_submits_total", outcome="placed", team="default") == 1
        assert value(samples, "mediator_submits_total", outcome="queued", team="default") == 1
        assert value(samples, "mediator_runs", state="RUNNING") == 1
        assert value(samples, "mediator_runs", state="QUEUED") == 1
        assert value(samples, "mediator_queue_depth") == 1
        assert value(samples, "mediator_leases_held") == 1
        assert value(samples, "mediator_database_figures_failed") == 0

    assert live.post("/v1/runs/r1/cancel").status_code == 200
    for _ in range(SCRAPES):
        samples = scrape(live)
        assert value(samples, "mediator_runs", state="QUEUED") == 0
        assert value(samples, "mediator_runs", state="RUNNING") == 1
        assert value(samples, "mediator_runs", state="FAILED") == 1
        assert value(samples, "mediator_queue_wait_seconds_count") == 1


def test_every_line_gunicorn_writes_is_a_json_object(
    fresh_db_url: str, tmp_path: Path, metrics_dir: Path
):
    # No PROMETHEUS_MULTIPROC_DIR: gunicorn makes a directory of its own.
    env = {"MEDIATOR_LOG_LEVEL": "info"}
    with gunicorn_on(fresh_db_url, tmp_path, **env) as server:
        assert requests.get(server.url + "/metrics", timeout=30).status_code == 200
        assert server.get("/v1/runs/nope").status_code == 404
        log, out = server.log, server.out
        own = server.env.get("PROMETHEUS_MULTIPROC_DIR")
    assert log is not None and out is not None and own is None
    lines: list[dict[str, Any]] = []
    for text in log.read_text(encoding="utf-8").splitlines():
        line = json.loads(text)  # not JSON: the test fails here, naming the line
        assert isinstance(line, dict), text
        lines.append(line)
    gunicorn = [x for x in lines if x.get("logger") == "gunicorn.error"]
    assert any(x["event"].startswith("Starting gunicorn") for x in gunicorn)
    assert sum(x["event"].startswith("Booting worker") for x in gunicorn) == 2
    assert any(x["event"].startswith("Shutting down") for x in gunicorn)
    assert all({"level", "timestamp"} <= set(x) for x in lines)
    routes = {x.get("route") for x in lines if x.get("event") == "request"}
    assert {"/readyz", "/metrics", "/v1/runs/<run_id>"} <= routes
    # One line a request, the app's: no access line of gunicorn's beside it (accesslog unset),
    # which would go to stdout.
    assert [x for x in lines if x.get("logger") == "gunicorn.access"] == []
    assert out.read_text(encoding="utf-8") == ""


def test_a_reaper_process_serves_its_passes_on_its_metrics_port(fresh_db_url: str, tmp_path: Path):
    port = free_port()
    env = {
        **os.environ,
        "MEDIATOR_DATABASE_URL": fresh_db_url,
        "MEDIATOR_RECORDS_ROOT": str(tmp_path / "records"),
        "MEDIATOR_TOKEN": "a-token-of-the-reaper-metrics-test-32+",
        "MEDIATOR_LEASE_RENEW_SECONDS": "1",
        "MEDIATOR_LOG_LEVEL": "warning",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    cmd = [sys.executable, "-m", "app.commands.main", "reaper", "--metrics-port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        passes = 0.0
        while passes < 1:
            assert proc.poll() is None and time.monotonic() < deadline, "no pass served"
            try:
                text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except requests.ConnectionError:
                text = ""  # not listening yet: there is no event to await across processes
            passes = value(parse(text), "mediator_reaper_passes_total", result="done")
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
