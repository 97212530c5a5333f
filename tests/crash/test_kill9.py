"""A gunicorn worker killed with SIGKILL in the middle of a submit, a promotion, a result and a
cancel (docs/queue.md#crashes-and-restarts, docs/reliability.md#crashes).

Each test starts gunicorn (2 workers) on a fresh database with ``MEDIATOR_FAULT=<point>@<file>``
(app/faults.py): the first worker to reach that point dies there by SIGKILL, with its transaction
open or just committed, and writes its pid to the file first. The client sees the connection
drop; gunicorn reports the signal and starts a replacement, which runs through the same point
alive. Then:

- the shared invariant checker holds (tests/support/invariants.py), and nothing is half-created:
  a crash inside a transaction leaves none of it, a crash after a commit leaves all of it;
- what the crash left waiting is promoted by the replacement's start-up wake (wake point 6 of
  docs/design.md#wake-points), or by the reaper's pass when only the reaper can settle it;
- after one ``reap_pass`` every finished run is sealed, and every check holds.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import pytest
import requests

from app.services.reaper import reap_pass
from tests.support.actors import Node, Submitter, cap
from tests.support.apps import LiveServer, app_on, gunicorn_on
from tests.support.concurrency import await_condition, connect
from tests.support.contracts import contract, one_step, role
from tests.support.invariants import check, check_after_reaper_pass, check_quiet, check_settled
from tests.support.processes import children_of
from tests.support.rows import find_run, leases, one, run_row, states

pytestmark = pytest.mark.slow

DEADLINE = 30.0  # a worker's replacement boots in about a second; a hang is a failure


class Crash:
    """A gunicorn whose workers die once at the named fault point."""

    def __init__(self, server: LiveServer, marker: Path, log: Path, records: Path) -> None:
        self.server, self.marker, self.log, self.records = server, marker, log, records
        self.workers = 2

    def post(self, path: str, body: Any = None) -> requests.Response:
        return self.server.post(path, json=body)

    def advertise(self, node_id: str, capability: str = "board") -> None:
        Node(self.server, node_id).advertise(cap(capability))

    def submit(self, doc: dict[str, Any], status: int) -> None:
        Submitter(self.server).submit(doc, status)

    def claim(self, node_id: str) -> dict[str, Any]:
        return Node(self.server, node_id).claimed()

    def result(self, step: dict[str, Any], node_id: str) -> requests.Response:
        reply: requests.Response = Node(self.server, node_id).report(step["run_id"], step["seq"])
        return reply

    def worker_dies(self, request: Callable[[], Any]) -> None:
        """``request`` reaches the fault point: its worker dies by SIGKILL (the client sees the
        connection drop), gunicorn says so and starts a replacement."""
        master = self.server.proc.pid
        self.every_worker_ready()
        before = children_of(master)
        with pytest.raises(requests.ConnectionError):
            request()
        pid = int(self.marker.read_text())
        assert pid in before, (pid, before)
        await_condition(
            lambda: (
                re.search(rf"Worker \(pid:{pid}\) was sent SIGKILL", self.log.read_text())
                is not None
            ),
            "gunicorn to report the SIGKILL",
            DEADLINE,
            interval=0.05,
        )
        await_condition(
            lambda: pid not in (now := children_of(master)) and len(now) == self.workers,
            "gunicorn to replace the killed worker",
            DEADLINE,
            interval=0.05,
        )
        # The replacement's start-up wake is over before the test goes on: a scan of its own
        # running beside the test's next request would make that request's scan skip (the gate:
        # one scan runs, one waits) and promote a moment after its answer instead.
        self.every_worker_ready()

    def every_worker_ready(self) -> None:
        """Every worker has booted and logged that its start-up wake is over."""

        def ready() -> bool:
            workers = children_of(self.server.proc.pid)
            if len(workers) != self.workers:
                return False
            said = set()
            for line in self.log.read_text().splitlines():
                if "process ready" in line:
                    with suppress(ValueError):
                        said.add(json.loads(line).get("pid"))
            return set(workers) <= said

        await_condition(ready, "every worker to finish its start-up", DEADLINE, interval=0.05)

    def reaper_pass(self, url: str) -> None:
        with app_on(url, self.records) as app:
            report = reap_pass(app.extensions["mediator"])
        assert not report.skipped

    def sealed_record(self, run_id: str) -> None:
        resp = requests.get(
            f"{self.server.url}/v1/runs/{run_id}/record", headers=self.server.headers(), timeout=30
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["Content-Type"].startswith("application/x-tar")


def quick_stop(server: LiveServer, log: Path) -> None:
    """Quick shutdown (SIGINT) once the test has seen what it came for."""
    workers = children_of(server.proc.pid)
    server.proc.send_signal(signal.SIGINT)
    try:
        server.proc.wait(20)
    except subprocess.TimeoutExpired:
        left = {p: Path(f"/proc/{p}/stat").read_text() for p in children_of(server.proc.pid)}
        raise AssertionError(
            f"gunicorn did not stop: workers before {workers}, left {left}\n"
            + log.read_text()[-4000:]
        ) from None


@pytest.fixture
def crash_at(fresh_db_url: str, tmp_path: Path) -> Iterator[Callable[[str], Crash]]:
    """``crash_at(point)``: a gunicorn whose first worker to reach ``point`` dies there."""
    with ExitStack() as stack:

        def start(point: str) -> Crash:
            marker = tmp_path / "fault-fired"
            env = {
                "MEDIATOR_FAULT": f"{point}@{marker}",
                "MEDIATOR_WORKERS": "2",
                "MEDIATOR_LOG_LEVEL": "info",  # each worker's "process ready" line
            }
            server = stack.enter_context(gunicorn_on(fresh_db_url, tmp_path, **env))
            stack.callback(quick_stop, server, tmp_path / "gunicorn.log")
            return Crash(server, marker, tmp_path / "gunicorn.log", tmp_path / "records")

        yield start


def promoted_by(sql: Any, run_id: str) -> str:
    """The cause of the run's promotion, from its audit trail."""
    return one(
        sql, "select cause from run_events where run_id = %s and to_state = 'RUNNING'", run_id
    )["cause"]


def settled(url: str) -> None:
    with connect(url) as sql:
        assert check_settled(sql) == []


# ---------------------------------------------------------------- submit


def test_a_worker_killed_inside_a_submit_leaves_no_run_and_the_resubmit_places_it(
    crash_at, fresh_db_url
):
    crash = crash_at("submit.after_insert")
    crash.advertise("n1")
    crash.worker_dies(lambda: crash.post("/v1/runs", one_step("a")))
    with connect(fresh_db_url) as sql:
        assert find_run(sql, "a") is None  # the run row was written, never committed
        assert leases(sql) == []
        assert check(sql) == []
    crash.submit(one_step("a"), 201)  # the submitter retries
    step = crash.claim("n1")
    assert crash.result(step, "n1").json()["run_state"] == "SUCCEEDED"
    crash.reaper_pass(fresh_db_url)
    settled(fresh_db_url)
    crash.sealed_record("a")


def test_a_worker_killed_before_a_queued_run_commits_leaves_nothing_and_the_resubmit_queues_it(
    crash_at, fresh_db_url
):
    crash = crash_at("submit.queued")
    crash.advertise("n1")
    crash.submit(one_step("holder"), 201)
    crash.worker_dies(lambda: crash.post("/v1/runs", one_step("waiter")))
    with connect(fresh_db_url) as sql:
        assert find_run(sql, "waiter") is None  # its Record was opened, the run never committed
        assert check(sql) == []
    crash.submit(one_step("waiter"), 202)  # the Record left behind is opened again
    step = crash.claim("n1")
    assert crash.result(step, "n1").json()["run_state"] == "SUCCEEDED"
    with connect(fresh_db_url) as sql:
        assert run_row(sql, "waiter")["state"] == "RUNNING"
    crash.reaper_pass(fresh_db_url)
    settled(fresh_db_url)


# ---------------------------------------------------------------- promote


def test_a_worker_killed_inside_a_promotion_leaves_the_run_queued_and_the_start_up_wake_of_its_replacement_promotes_it(
    crash_at, fresh_db_url
):
    crash = crash_at("promote.before_commit")
    crash.advertise("n1")
    crash.submit(one_step("holder"), 201)
    crash.submit(one_step("waiter"), 202)
    # The cancel commits, seals the holder, and its wake dies inside the waiter's promotion.
    crash.worker_dies(lambda: crash.post("/v1/runs/holder/cancel"))
    with connect(fresh_db_url) as sql:
        await_condition(
            lambda: run_row(sql, "waiter")["state"] == "RUNNING",
            "the start-up wake",
            DEADLINE,
            interval=0.05,
        )
        assert promoted_by(sql, "waiter") == "promoted: start-up"
        assert run_row(sql, "holder")["state"] == "FAILED"
        assert leases(sql) == [("n1", "waiter")]
        assert check(sql) == []
    crash.reaper_pass(fresh_db_url)
    settled(fresh_db_url)
    crash.sealed_record("holder")


# ---------------------------------------------------------------- result


def test_a_worker_killed_before_a_result_commits_leaves_the_step_claimed_and_the_retried_result_finishes_the_run(
    crash_at, fresh_db_url
):
    crash = crash_at("result.before_commit")
    crash.advertise("n1")
    crash.submit(one_step("holder"), 201)
    crash.submit(one_step("waiter"), 202)
    step = crash.claim("n1")
    crash.worker_dies(lambda: crash.result(step, "n1"))
    with connect(fresh_db_url) as sql:
        assert states(sql, "holder") == {"work": "CLAIMED"}  # rolled back whole
        assert run_row(sql, "holder")["state"] == "RUNNING"
        assert leases(sql) == [("n1", "holder")]
        assert check(sql) + check_quiet(sql) == []
    # The agent retries its result until it gets an answer
    # (docs/api.md#post-v1runsrun_idstepsseqresult--report-a-steps-result).
    assert crash.result(step, "n1").json()["run_state"] == "SUCCEEDED"
    with connect(fresh_db_url) as sql:
        assert run_row(sql, "waiter")["state"] == "RUNNING"
    crash.reaper_pass(fresh_db_url)
    settled(fresh_db_url)
    crash.sealed_record("holder")


def test_a_worker_killed_after_a_release_commits_is_replaced_by_one_whose_start_up_wake_promotes_the_waiting_run(
    crash_at, fresh_db_url
):
    crash = crash_at("result.after_commit")
    crash.advertise("n1")
    crash.advertise("h1", "host")
    holder = contract(
        "holder",
        role("dut"),
        role("host", "host"),
        steps=[
            {"id": "flash", "uses": "dut", "run": ["flash"], "release": ["dut"]},
            {"id": "report", "uses": "host", "run": ["report"]},
        ],
    )
    crash.submit(holder, 201)
    crash.submit(one_step("waiter"), 202)
    step = crash.claim("n1")
    # The release of n1 commits; the worker dies before its wake.
    crash.worker_dies(lambda: crash.result(step, "n1"))
    with connect(fresh_db_url) as sql:
        await_condition(
            lambda: run_row(sql, "waiter")["state"] == "RUNNING",
            "the start-up wake",
            DEADLINE,
            interval=0.05,
        )
        assert promoted_by(sql, "waiter") == "promoted: start-up"
        assert run_row(sql, "holder")["state"] == "RUNNING"
        assert leases(sql) == [("h1", "holder"), ("n1", "waiter")]
        assert check(sql) == []
    # The retried result finds the step reported already: 409, nothing changes.
    assert crash.result(step, "n1").status_code == 409
    crash.reaper_pass(fresh_db_url)
    settled(fresh_db_url)


def test_a_run_left_verifying_by_a_killed_worker_is_settled_sealed_and_its_node_passed_on_by_one_reaper_pass(
    crash_at, fresh_db_url
):
    crash = crash_at("result.after_commit")
    crash.advertise("n1")
    crash.submit(one_step("holder"), 201)
    crash.submit(one_step("waiter"), 202)
    step = crash.claim("n1")
    # VERIFYING commits; the worker dies before the verdict, the seal and the wake.
    crash.worker_dies(lambda: crash.result(step, "n1"))
    with connect(fresh_db_url) as sql:
        assert run_row(sql, "holder")["state"] == "VERIFYING"
        assert leases(sql) == [("n1", "holder")]  # the verdict deletes them, it never ran
        assert check(sql) == []
        assert check_after_reaper_pass(sql) == ["run holder is still VERIFYING after a reaper pass"]
    crash.reaper_pass(fresh_db_url)
    with connect(fresh_db_url) as sql:
        assert run_row(sql, "holder")["state"] == "SUCCEEDED"
        assert run_row(sql, "waiter")["state"] == "RUNNING"
    settled(fresh_db_url)
    crash.sealed_record("holder")


# ---------------------------------------------------------------- cancel


def test_a_worker_killed_before_a_cancel_commits_leaves_the_run_running_and_the_retried_cancel_frees_its_node(
    crash_at, fresh_db_url
):
    crash = crash_at("cancel.before_commit")
    crash.advertise("n1")
    crash.submit(one_step("holder"), 201)
    crash.submit(one_step("waiter"), 202)
    crash.worker_dies(lambda: crash.post("/v1/runs/holder/cancel"))
    with connect(fresh_db_url) as sql:
        assert run_row(sql, "holder")["state"] == "RUNNING"
        assert states(sql, "holder") == {"work": "PENDING"}
        assert leases(sql) == [("n1", "holder")]
        assert check(sql) + check_quiet(sql) == []
    resp = crash.post("/v1/runs/holder/cancel")
    assert resp.json() == {"run_id": "holder", "state": "FAILED"}
    with connect(fresh_db_url) as sql:
        assert run_row(sql, "waiter")["state"] == "RUNNING"
    crash.reaper_pass(fresh_db_url)
    settled(fresh_db_url)


def test_a_worker_killed_after_a_cancel_commits_leaves_the_seal_to_the_reaper_and_the_waiter_to_the_start_up_wake(
    crash_at, fresh_db_url
):
    crash = crash_at("cancel.after_commit")
    crash.advertise("n1")
    crash.submit(one_step("holder"), 201)
    crash.submit(one_step("waiter"), 202)
    crash.worker_dies(lambda: crash.post("/v1/runs/holder/cancel"))
    with connect(fresh_db_url) as sql:
        await_condition(
            lambda: run_row(sql, "waiter")["state"] == "RUNNING",
            "the start-up wake",
            DEADLINE,
            interval=0.05,
        )
        assert promoted_by(sql, "waiter") == "promoted: start-up"
        assert run_row(sql, "holder")["state"] == "FAILED"
        assert check(sql) == []
        assert check_after_reaper_pass(sql) == ["run holder is FAILED but its Record is not sealed"]
    crash.reaper_pass(fresh_db_url)
    settled(fresh_db_url)
    crash.sealed_record("holder")
