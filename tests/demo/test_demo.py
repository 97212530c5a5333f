"""``mediator demo`` as a person runs it: a process of its own that starts a real server, three real
agent processes and the example runs, on a fresh database of the local PostgreSQL (and once on
the embedded server). It must end with the expected verdicts and exit 0 (non-zero otherwise),
tell the story in readable lines (the hanging board-2 quarantined, then lifted by its health
run, among them), leave sealed Records on disk, and leave no process behind, with ``--once``
and on SIGINT / SIGTERM alike."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from app.config import to_libpq_url
from tests.support.apps import ROOT
from tests.support.pages import PageUser
from tests.support.processes import children_of

pytestmark = pytest.mark.slow  # each test starts a server and three agents

RUN_SECONDS = 120  # a demo run takes about 30 s on a quiet machine
AGENTS = {"agent board-1", "agent host-1", "agent board-2"}
HEALTH_RUN = re.compile(r"health-[0-9a-f]{16}-\d+")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("MEDIATOR_")}


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "app.commands.main", "demo", *args]


def demo_once(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _argv("--once", *args),
        cwd=ROOT,
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS,
        check=False,
    )


def state_of(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "demo.json").read_text())


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def assert_story(out: str, runs: list[str]) -> None:
    """The lines a person reads: placed, queued behind whom, promoted, steps, the ask and its
    answer, the verdicts, where the Records are."""
    build, sign_off, lint = runs
    assert re.search(r"Mediator serving on http://127\.0\.0\.1:\d+/ ", out), out
    # Where a person signs in to the pages, and with which token (docs/pages.md#signing-in).
    assert re.search(r"sign in at http://127\.0\.0\.1:\d+/signin with the token demo-token", out)
    assert f"run {build} RUNNING on builder=host-1 dut=board-1" in out, out
    assert (
        f"run {sign_off} QUEUED: waits for board soc=imx8mp (held by {build}), position 1" in out
    ), out
    assert f"run {build}: step build succeeded (exit 0) on host-1; releases builder" in out, out
    assert f"run {sign_off} promoted (released by {build}/board-1" in out, out
    assert f"run {sign_off}: step sign-off asks qa@lab.example: Boot result looks right?" in out
    assert f"$ mediator --principal qa@lab.example answer {sign_off} 2 --set verdict=approve" in out
    assert f"{sign_off}: step 2 answered, run RUNNING" in out, out
    for run in runs:
        assert f"run {run} verdict SUCCEEDED" in out, out
    assert "all 6 verdicts as expected" in out, out
    # every line of the story starts with a time or is indented under one: no JSON dumps
    for line in out.splitlines():
        assert line == "" or re.match(r"(\d\d:\d\d:\d\d| {8})  ", line), line
        assert not line.lstrip().startswith(("{", "[", '"')), line
    # the order of what happened
    assert out.index(f"run {sign_off} QUEUED") < out.index(f"run {build} verdict SUCCEEDED")
    assert out.index(f"run {build} verdict SUCCEEDED") < out.index(f"run {sign_off} promoted")
    assert out.index(f"run {lint} promoted (released by {build}/host-1") < out.index(
        f"run {build} verdict SUCCEEDED"
    )


def assert_board_story(out: str, board: dict[str, Any]) -> None:
    """board-2 hangs in the middle of two burn-in runs, each failed by the reaper for its expired
    lease (a strike each), is quarantined at the second, and its health run lifts the
    quarantine: in demo.json and in the lines a person reads, in that order."""
    first, second = board["runs"]
    health = board["health_run"]
    assert HEALTH_RUN.fullmatch(health), board
    assert board == {
        "node": "board-2",
        "runs": [first, second],
        "strikes": [1, 2],
        "quarantined": f"2 failures in a row; the last: its lease of {second} expired",
        "health_run": health,
        "lifted": True,
    }
    story = [
        f"run {first} RUNNING on dut=board-2",
        f"board-2 hangs in the middle of run {first}: its agent is frozen (SIGSTOP)",
        f"run {first} verdict FAILED",
        "board-2: strike 1 of 2",
        f"run {second} RUNNING on dut=board-2",
        f"board-2 hangs in the middle of run {second}",
        f"run {second}: step soak FAILED: lease expired: renewal stopped",
        "board-2: strike 2 of 2",
        f"board-2 quarantined: 2 failures in a row; the last: its lease of {second} expired",
        f"the reaper queued health run {health} for board-2",
        f"run {health} verdict SUCCEEDED",
        f"board-2 quarantine lifted: its health run {health} passed; 0 strikes",
    ]
    at = 0
    for line in story:
        found = out.find(line, at)
        assert found >= 0, f"{line!r} missing, or before what it follows:\n{out}"
        at = found


def assert_records(directory: Path, runs: list[str]) -> None:
    for run in runs:
        record = directory / "records" / run
        assert (record / "SHA256SUMS").is_file(), sorted(p.name for p in record.iterdir())
        verdict = json.loads((record / "verdict.json").read_text())
        assert verdict["state"] == "SUCCEEDED", verdict


def assert_all_stopped(state: dict[str, Any], expected: set[str]) -> None:
    pids = state["pids"]
    assert set(pids) == expected
    assert [name for name, pid in pids.items() if alive(pid)] == []


def test_the_demo_once_on_a_local_database(fresh_db_url: str, tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    done = demo_once("--database-url", fresh_db_url, "--dir", str(directory))
    assert done.returncode == 0, done.stdout + done.stderr
    state = state_of(directory)
    runs = state["runs"]
    assert [r.rsplit("-", 1)[0] for r in runs] == ["build-and-test", "sign-off", "lint"]
    board = state["board"]
    assert state["verdicts"] == {
        **dict.fromkeys(runs, "SUCCEEDED"),
        **dict.fromkeys(board["runs"], "FAILED"),
        board["health_run"]: "SUCCEEDED",
    }
    assert_story(done.stdout, runs)
    assert_board_story(done.stdout, board)
    assert f"the sealed Records, on disk in {directory / 'records'}" in done.stdout
    assert_records(directory, [*runs, board["health_run"]])
    assert_all_stopped(state, {"server", *AGENTS})

    # The database says the same: the sign-off run was queued, then promoted by the end of the
    # build-and-test run, and its ask was answered by the demo through the client.
    build, sign_off, lint = runs
    with psycopg.connect(to_libpq_url(fresh_db_url)) as conn:
        states = dict(conn.execute("SELECT run_id, state FROM runs").fetchall())
        events = conn.execute(
            "SELECT from_state, to_state, cause FROM run_events WHERE run_id = %s ORDER BY id",
            (sign_off,),
        ).fetchall()
        ended = conn.execute("SELECT ended_at FROM runs WHERE run_id = %s", (build,)).fetchone()[0]
        promoted_at = conn.execute(
            "SELECT at FROM run_events WHERE run_id = %s AND to_state = 'RUNNING'", (sign_off,)
        ).fetchone()[0]
        answered = conn.execute(
            "SELECT answered_by FROM steps WHERE run_id = %s AND step_id = 'sign-off'",
            (sign_off,),
        ).fetchone()[0]
        leases = conn.execute("SELECT count(*) FROM leases").fetchone()[0]
        node_events = conn.execute(
            "SELECT change, reason, by FROM node_events WHERE node_id = 'board-2' ORDER BY id"
        ).fetchall()
        health = conn.execute(
            "SELECT strikes, quarantined_at, health_runs FROM node_health WHERE node_id = 'board-2'"
        ).fetchone()
        health_run = conn.execute(
            "SELECT principal, team, priority, pinned_node FROM runs WHERE run_id = %s",
            (board["health_run"],),
        ).fetchone()
        struck = conn.execute(
            "SELECT count(*) FROM node_health WHERE strikes > 0 OR quarantined_at IS NOT NULL"
        ).fetchone()[0]
    assert {r: s for r, s in states.items() if r in runs} == dict.fromkeys(runs, "SUCCEEDED")
    # board-2: a strike for each run the reaper failed for its expired lease, quarantined by the
    # Mediator at the second, its health run queued by the reaper, and the quarantine lifted by
    # that run's verdict; no other node was ever struck, and board-2 ends in service.
    first, second = board["runs"]
    assert node_events == [
        ("strike", f"its lease of {first} expired", "mediator"),
        ("strike", f"its lease of {second} expired", "mediator"),
        ("quarantined", board["quarantined"], "mediator"),
        ("health run queued", board["health_run"], "mediator"),
        ("quarantine lifted", f"{board['health_run']} passed", "mediator"),
    ]
    assert health == (0, None, 1)
    assert health_run == ("mediator", "health", 100, "board-2")
    assert struck == 0
    assert events[0][1] == "QUEUED"
    assert events[1][:2] == ("QUEUED", "RUNNING")
    assert events[1][2] == f"promoted: released by {build}/board-1"
    assert promoted_at >= ended
    assert answered == "qa@lab.example"
    assert leases == 0


def test_the_demo_once_on_the_embedded_server(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    started = time.monotonic()
    done = demo_once("--dir", str(directory))
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PostgreSQL: a throwaway embedded server" in done.stdout
    state = state_of(directory)
    assert_story(done.stdout, state["runs"])
    assert_board_story(done.stdout, state["board"])
    assert_records(directory, state["runs"])
    assert_all_stopped(state, {"postgres", "server", *AGENTS})
    assert took < 60, f"the demo took {took:.1f} s"


def test_an_unexpected_verdict_ends_the_demo_non_zero(fresh_db_url: str, tmp_path: Path) -> None:
    examples = tmp_path / "examples"
    shutil.copytree(ROOT / "examples", examples)
    lint = examples / "lint.yaml"
    lint.write_text(lint.read_text().replace('echo "no findings"', 'echo "3 findings"; exit 1'))
    directory = tmp_path / "demo"
    done = demo_once(
        "--database-url", fresh_db_url, "--dir", str(directory), "--examples", str(examples)
    )
    assert done.returncode == 1, done.stdout + done.stderr
    state = state_of(directory)
    build, sign_off, lint_run = state["runs"]
    assert {r: state["verdicts"][r] for r in state["runs"]} == {
        build: "SUCCEEDED",
        sign_off: "SUCCEEDED",
        lint_run: "FAILED",
    }
    assert f"run {lint_run} verdict FAILED" in done.stdout
    assert "FAIL  lint: exit_code want 0, got 1" in done.stdout
    assert f"mediator demo: run {lint_run} ended FAILED, expected SUCCEEDED" in done.stderr
    assert "verdicts as expected" not in done.stdout
    assert_all_stopped(state, {"server", *AGENTS})


def _read_until(proc: subprocess.Popen[str], text: str, seen: list[str], timeout: float) -> None:
    """Read ``proc``'s stdout lines into ``seen`` until one holds ``text``."""
    found = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if text in line:
                found.set()
        found.set()

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout), "".join(seen)
    assert any(text in line for line in seen), "".join(seen)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_without_once_it_keeps_serving_until_a_signal_stops_every_child(
    signum: int, fresh_db_url: str, tmp_path: Path
) -> None:
    directory = tmp_path / "demo"
    proc = subprocess.Popen(
        _argv("--database-url", fresh_db_url, "--dir", str(directory)),
        cwd=ROOT,
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    try:
        _read_until(proc, "Ctrl-C stops them all", seen, RUN_SECONDS)
        state = state_of(directory)
        pids = state["pids"]
        # still serving: the server and both agents run, and answer
        assert [name for name, pid in pids.items() if not alive(pid)] == []
        assert children_of(proc.pid) >= set(pids.values())
        url = state["url"]
        nodes = subprocess.run(
            [
                sys.executable,
                "-m",
                "app.commands.main",
                "--url",
                url,
                "--token",
                state["token"],
                "nodes",
            ],
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert nodes.returncode == 0, nodes.stderr
        assert re.search(r"board-1 .* yes ", nodes.stdout), nodes.stdout
        assert re.search(r"host-1 .* yes ", nodes.stdout), nodes.stdout

        proc.send_signal(signum)
        assert proc.wait(timeout=30) == 0, "".join(seen) + (
            proc.stderr.read() if proc.stderr else ""
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    name = signal.Signals(signum).name
    assert any(f"{name}: stopping the agents, the server and the database" in s for s in seen)
    assert_all_stopped(state, {"server", *AGENTS})


def test_with_answer_in_browser_a_person_answers_the_sign_off_on_the_asks_page(
    fresh_db_url: str, tmp_path: Path
) -> None:
    """The README's walk-through: sign in at the printed address with the printed token and the
    sign-off's answerer as principal, press approve on the asks page, and the run goes on."""
    directory = tmp_path / "demo"
    proc = subprocess.Popen(
        _argv(
            "--once", "--answer-in-browser", "--database-url", fresh_db_url, "--dir", str(directory)
        ),
        cwd=ROOT,
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    try:
        _read_until(proc, "answer it in your browser", seen, RUN_SECONDS)
        out = "".join(seen)
        signin = re.search(r"sign in at (http://127\.0\.0\.1:\d+)/signin with the token (\S+)", out)
        assert signin, out
        base, token = signin.groups()
        sign_off = state_of(directory)["runs"][1]
        person = PageUser(base).signed_in(token, principal="qa@lab.example")
        assert f'data-ask="{sign_off}/2"' in person.page("/asks")
        resp = person.send_form("/asks", f"/asks/{sign_off}/2", {"verdict": "approve"})
        assert resp.status_code == 303, resp.text[:500]
        assert proc.wait(timeout=RUN_SECONDS) == 0, "".join(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    state = state_of(directory)
    assert {r: state["verdicts"][r] for r in state["runs"]} == dict.fromkeys(
        state["runs"], "SUCCEEDED"
    )
    with psycopg.connect(to_libpq_url(fresh_db_url)) as conn:
        answered = conn.execute(
            "SELECT answered_by FROM steps WHERE run_id = %s AND step_id = 'sign-off'",
            (sign_off,),
        ).fetchone()[0]
    assert answered == "qa@lab.example"
    assert_all_stopped(state, {"server", *AGENTS})
