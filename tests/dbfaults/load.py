"""Load on a live Mediator while its database fails: node agents (advertise, claim, report) and a
submitter, each in a thread of its own, as the real agent and client behave — a 503 is retried,
anything else is taken as the answer. Every answer is kept with when it was asked and how long it
took, so a test can say what the service answered while the database was down and after.

Every loop is bounded: by a count (runs submitted) and by the ``stop`` event the test sets; a
request that takes longer than ``REQUEST_TIMEOUT`` is recorded as a hang.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from tests.support.apps import ROOT, LiveServer
from tests.support.processes import stop

REQUEST_TIMEOUT = 20.0

# What each route may answer while its database comes and goes (docs/api.md#conventions,
# docs/reliability.md#database-faults): its documented outcomes, and 503 while the database is
# unreachable. Never a 500, never a hang.
ALLOWED = {
    "advert": {200, 503},
    "claim": {200, 204, 503},
    "result": {200, 409, 503},
    "cancel": {200, 503},
    "submit": {200, 201, 202, 503},
    "readyz": {200, 503},
    "view": {200, 503},
}


@dataclass(frozen=True)
class Answer:
    route: str
    status: int  # 0: no HTTP answer at all (connection dropped or timed out)
    started: float
    seconds: float
    error: str = ""


@dataclass
class Tally:
    """Every answer of every thread, in one list (appends are atomic under the GIL)."""

    answers: list[Answer] = field(default_factory=list)
    timeout: float = REQUEST_TIMEOUT  # a long-poll's clients wait longer (its window and this)

    def call(self, route: str, method: str, url: str, **kw: Any) -> requests.Response | None:
        started = time.monotonic()
        try:
            resp = requests.request(method, url, timeout=self.timeout, **kw)
        except requests.RequestException as exc:
            self.answers.append(
                Answer(route, 0, started, time.monotonic() - started, type(exc).__name__)
            )
            return None
        said = resp.text[:300] if resp.status_code >= 400 else ""
        self.answers.append(
            Answer(route, resp.status_code, started, time.monotonic() - started, said)
        )
        return resp

    def unexpected(self) -> list[Answer]:
        return [a for a in self.answers if a.status not in ALLOWED[a.route]]

    def between(self, start: float, end: float) -> list[Answer]:
        """Answers to requests asked and answered inside [start, end]."""
        return [a for a in self.answers if a.started >= start and a.started + a.seconds <= end]

    def statuses(self) -> Counter[tuple[str, int]]:
        return Counter((a.route, a.status) for a in self.answers)


def one_step(run_id: str) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "requires": [{"as": "dut", "capability": "board"}],
        "steps": [{"id": "work", "uses": "dut", "run": ["true"]}],
    }


class Agent(threading.Thread):
    """A node agent: advertises every ``renew`` seconds in a thread of its own (as the real
    agent does, so a long poll never delays a renewal), claims (a long poll of ``wait``
    seconds) with its instance, so a step whose claim answer was lost is handed out again, works
    ``work`` seconds and reports exit 0, retrying a 503 until the answer is 200 or 409 (already
    reported). What it was told is kept: ``claimed`` (run, seq, when the claim was answered)
    and ``acknowledged`` (results answered 200)."""

    def __init__(
        self,
        server: LiveServer,
        node: str,
        tally: Tally,
        stop: threading.Event,
        renew: float = 1.0,
        work: float = 0.3,
        wait: float = 0.3,
    ) -> None:
        super().__init__(name=f"agent-{node}", daemon=True)
        self.server, self.node, self.tally, self.stop = server, node, tally, stop
        self.instance = f"{node}-instance-1"
        self.renew, self.work, self.wait = renew, work, wait
        self.reported: list[tuple[str, int]] = []
        self.acknowledged: list[tuple[str, int]] = []
        self.claimed: list[tuple[str, int, float]] = []
        self._adverts = threading.Thread(target=self._advertise_loop, daemon=True)

    def _post(self, route: str, path: str, body: Any = None, **headers: str) -> Any:
        return self.tally.call(
            route,
            "POST",
            self.server.url + path,
            json=body,
            headers=self.server.headers(**headers),
        )

    def advertise(self) -> None:
        body = {
            "node_id": self.node,
            "instance": self.instance,
            "capabilities": [{"capability": "board", "attrs": {}}],
        }
        self._post("advert", "/v1/nodes", body)

    def _advertise_loop(self) -> None:
        while not self.stop.is_set():
            self.advertise()
            self.stop.wait(self.renew)

    def run(self) -> None:
        self._adverts.start()
        while not self.stop.is_set():
            resp = self._post(
                "claim",
                f"/v1/nodes/{self.node}/claim?wait={self.wait}",
                **{"X-Enode-Instance": self.instance},
            )
            if resp is None or resp.status_code != 200:
                self.stop.wait(0.05)
                continue
            step = resp.json()
            self.claimed.append((step["run_id"], step["seq"], time.monotonic()))
            self.stop.wait(self.work)  # the step runs a while: runs queue up behind it
            self.report(step["run_id"], step["seq"])
        self._adverts.join(REQUEST_TIMEOUT)

    def report(self, run_id: str, seq: int) -> None:
        body = {"node": self.node, "exit_code": 0, "produced": []}
        while not self.stop.is_set():
            resp = self._post("result", f"/v1/runs/{run_id}/steps/{seq}/result", body)
            if resp is not None and resp.status_code in (200, 409):
                self.reported.append((run_id, seq))
                if resp.status_code == 200:
                    self.acknowledged.append((run_id, seq))
                return
            self.stop.wait(0.05)


class Submitter(threading.Thread):
    """Submits ``count`` one-step runs, one every ``every`` seconds, retrying each on a 503 (the
    run_id is the idempotency key: a retry of a submit that did commit answers 200). A 422 is
    final, as for a CI client: the run is kept in ``rejected`` with its reason."""

    def __init__(
        self,
        server: LiveServer,
        tally: Tally,
        stop: threading.Event,
        count: int,
        every: float = 0.1,
        prefix: str = "load",
    ) -> None:
        super().__init__(name="submitter", daemon=True)
        self.server, self.tally, self.stop = server, tally, stop
        self.count, self.every, self.prefix = count, every, prefix
        self.accepted: list[tuple[str, float]] = []  # run_id, when its submit was answered
        self.statuses: dict[str, int] = {}  # run_id: the status that accepted it
        self.rejected: dict[str, str] = {}  # run_id: the 422's body

    def run(self) -> None:
        for i in range(self.count):
            run_id = f"{self.prefix}-{i:04d}"
            while not self.stop.is_set():
                resp = self.tally.call(
                    "submit",
                    "POST",
                    self.server.url + "/v1/runs",
                    json=one_step(run_id),
                    headers=self.server.headers(),
                )
                if resp is not None and resp.status_code in (200, 201, 202):
                    self.accepted.append((run_id, time.monotonic()))
                    self.statuses[run_id] = resp.status_code
                    break
                if resp is not None and resp.status_code == 422:
                    self.rejected[run_id] = resp.text
                    break
                self.stop.wait(0.05)
            if self.stop.wait(self.every):
                return


class Canceller(threading.Thread):
    """Cancels every ``nth`` run the submitter had accepted (queued ones and running ones), in
    the order accepted, retrying each on a 503 (a cancel is idempotent); ``told`` keeps the
    state each 200 answered."""

    def __init__(
        self,
        server: LiveServer,
        tally: Tally,
        stop: threading.Event,
        submitter: Submitter,
        nth: int,
    ) -> None:
        super().__init__(name="canceller", daemon=True)
        self.server, self.tally, self.stop = server, tally, stop
        self.submitter, self.nth = submitter, nth
        self.told: dict[str, str] = {}

    def run(self) -> None:
        done = 0
        while not self.stop.is_set():
            accepted = self.submitter.accepted[done :: self.nth]
            if not accepted:
                if not self.submitter.is_alive():
                    return
                self.stop.wait(0.05)
                continue
            run_id = accepted[0][0]
            while not self.stop.is_set():
                resp = self.tally.call(
                    "cancel",
                    "POST",
                    f"{self.server.url}/v1/runs/{run_id}/cancel",
                    headers=self.server.headers(),
                )
                if resp is not None and resp.status_code == 200:
                    self.told[run_id] = resp.json()["state"]
                    break
                self.stop.wait(0.05)
            done += self.nth


@contextmanager
def reaper_of(server: LiveServer, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``mediator reaper`` beside the server, configured as the server is (its environment), as
    ops deploy it; stopped (SIGTERM, then SIGKILL) when the block ends."""
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.commands.main", "reaper"],
            cwd=ROOT,
            env=server.env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        yield proc
    finally:
        stop(proc)
