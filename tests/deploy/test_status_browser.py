"""The status page in a real browser: Debian's headless chromium loads / over HTTPS from the
documented nginx in front of a live gunicorn holding queued, running and finished runs (made by a
submitter's and node agents' requests), and the page it renders shows the runs, their states, the
nodes, the queue positions and what each queued run waits for. A phone-sized screenshot is saved
under the test's tmp_path and copied to tests/artifacts/status-page.png."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from tests.deploy.nginx import nginx_in_front
from tests.support.apps import ROOT, TOKEN, gunicorn_on
from tests.support.programs import require_program
from tests.support.scenes import build_fleet
from tests.support.status_page import element_text, rows

pytestmark = [pytest.mark.needs_nginx, pytest.mark.needs_chromium]

ARTIFACTS = ROOT / "tests" / "artifacts"
PHONE = (412, 1500)  # CSS pixels: a phone held upright, the page's length


def chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = [
        "--headless",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--window-size={PHONE[0]},{PHONE[1]}",
    ]
    if os.geteuid() == 0:
        flags.append("--no-sandbox")  # chromium refuses to run as root inside its sandbox
    # nginx's certificate is a throwaway self-signed one, made for the test.
    flags.append("--ignore-certificate-errors")
    done = subprocess.run(
        [binary, *flags, *args], capture_output=True, text=True, timeout=120, cwd=profile
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_status_page_renders_in_a_browser_with_the_fleet_on_it(
    fresh_db_url: str, tmp_path: Path
) -> None:
    binary = require_program("chromium", "chromium")
    with (
        gunicorn_on(fresh_db_url, tmp_path) as server,
        nginx_in_front(server.url, tmp_path) as nginx,
    ):
        build_fleet(nginx.client(TOKEN))
        profile = tmp_path / "chromium"
        profile.mkdir()
        dom = chromium(binary, profile, "--dump-dom", nginx.url + "/").stdout
        shot = tmp_path / "status-page.png"
        chromium(binary, profile, f"--screenshot={shot}", nginx.url + "/")

    assert element_text(dom, "queue-depth") == "3"
    queued = rows(dom, "queued-run")
    assert list(queued) == ["wait-1", "wait-2", "wait-scope"]
    assert queued["wait-1"].startswith("1 wait-1 QUEUED")
    assert queued["wait-2"].startswith("2 wait-2 QUEUED")
    assert queued["wait-scope"].startswith("3 wait-scope QUEUED")
    assert "dut (board): 2 live, 2 busy; held by run-asks, run-flash" in queued["wait-1"]
    assert "dut (scope): 1 live, 0 busy, 1 draining" in queued["wait-scope"]

    running = rows(dom, "running-run")
    assert set(running) == {"run-flash", "run-asks"}
    assert "RUNNING" in running["run-flash"] and "board-1" in running["run-flash"]
    assert "flash CLAIMED on board-1" in running["run-flash"]

    nodes = rows(dom, "node")
    assert list(nodes) == ["board-1", "board-2", "scope-1"]
    assert "run-flash" in nodes["board-1"] and "draining: graceful" in nodes["scope-1"]
    assert "Does the board boot?" in rows(dom, "ask")["run-asks"]
    finished = rows(dom, "finished-run")
    assert finished["done-ok"].startswith("done-ok SUCCEEDED")
    assert finished["done-bad"].startswith("done-bad FAILED")

    width, height = png_size(shot)
    assert width == PHONE[0] and height == PHONE[1]
    ARTIFACTS.mkdir(exist_ok=True)
    kept = ARTIFACTS / "status-page.png"
    shutil.copyfile(shot, kept)
    print(f"status page screenshot: {shot} (copied to {kept})")
