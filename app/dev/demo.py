"""``mediator demo``: a Mediator, real node agents and the contracts of ``examples/``, told as it
happens.

A database (the one given, else a throwaway embedded PostgreSQL), ``mediator server serve`` on a
free port of 127.0.0.1 (the API, its reaper thread), and three ``mediator agent`` processes:
``board-1`` (a board), ``host-1`` (a build host wired to that board) and ``board-2`` (another
board, whose host keeps hanging). Three runs are submitted at once:

- ``build-and-test`` is placed at once on both nodes; its build step releases the build host;
- ``sign-off`` needs the same board: it waits QUEUED behind ``build-and-test`` and is promoted by
  the very request that ends that run; its ask is answered with ``mediator answer``;
- ``lint`` needs the build host: it waits QUEUED until the build step gives the host back.

Beside them, ``board-2`` runs ``burn-in`` after ``burn-in`` and hangs in the middle of each: the
demo freezes its agent (SIGSTOP) once the step runs, so it stops advertising, and lets it go on
(SIGCONT) once the reaper has failed the run for its expired lease. Each is a strike; at
``health.failures_in_a_row`` strikes the board is quarantined, the reaper queues its health run
(``examples/health-check.json``), which passes and lifts the quarantine (docs/operators.md).

Every child runs in its own session and gets SIGTERM should this process die (Linux); they are
stopped in order (agents, then the server, then the database) when the demo ends, on Ctrl-C and
on SIGTERM. The Records stay on disk in the demo's directory.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import click
import yaml

import app
from app.client import render
from app.client.api import Client, ClientError, quote
from app.client.watch import StepChanges
from app.dev.embedded import (
    WHEEL_MISSING,
    EmbeddedPostgres,
    EmbeddedPostgresError,
    _parent_death_signal,
    create_database,
    wheel_installed,
)
from app.healthcheck import health_run_id
from app.httpclient import Connection, ConnectionFailed
from app.records.interface import record_location
from app.states import (
    ASKED,
    CLAIMED,
    DONE,
    FAILED,
    PENDING,
    QUEUED,
    RUN_FINISHED,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
)
from app.wire import parse_ts

TOKEN = "demo-token"  # the legacy single token: every role
SUBMITTER = "dev@lab.example"
ANSWERER = "qa@lab.example"  # sign-off.yaml's answerer
# The agents' heartbeat and the reaper's period; a node is live, and its leases last,
# NOT_AFTER_FACTOR heartbeats after its last advert: short, so that a board gone silent loses its
# run within seconds (the hanging board-2), with room for a slow advert of the healthy ones.
RENEW_SECONDS = 2
NOT_AFTER_FACTOR = 3
# health.failures_in_a_row: the strikes in a row that quarantine a node (3 by default; 2 here:
# each strike waits for a lease to run out, and the whole demo should stay within half a minute).
FAILURES_IN_A_ROW = 2
HEALTH_CHECK = "health-check.json"  # health.check_contract, in examples/
BURN_IN = "burn-in.yaml"  # what the hanging board is given, in examples/
OPERATOR = "ops@lab.example"  # who lifts a quarantine left over by an earlier demo
CLAIM_WAIT_SECONDS = 2  # how long an idle agent takes to notice it should stop
LOOK_SECONDS = 0.2  # between two looks at the runs
START_SECONDS = 60.0  # for the server and each agent to come up
STOP_SECONDS = 15.0  # for each child to stop before it is killed
SUMS = "SHA256SUMS"  # written into a Record directory when it is sealed
EXIT_OK, EXIT_UNEXPECTED, EXIT_INTERRUPTED = 0, 1, 130
FINISHED = RUN_FINISHED


class DemoError(Exception):
    """The demo cannot go on; the message says why and where to look."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM: unwind, stopping every child on the way."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass(frozen=True)
class DemoNode:
    node_id: str
    label: str
    capabilities: tuple[str, ...]  # as the agent's --capability flags


FLEET = (
    DemoNode("board-1", "imx8mp board on the bench", ("board:soc=imx8mp",)),
    DemoNode(
        "host-1",
        "build host, wired to board-1 for flashing",
        ("build:os=linux", "flash:soc=imx8mp"),
    ),
)


@dataclass(frozen=True)
class Planned:
    example: str  # a file of examples/
    expect: str  # the verdict it must end with
    must_queue: bool = False  # it must wait QUEUED when submitted, then be promoted
    answers: tuple[str, ...] = ()  # --set NAME=VALUE for each of its asks


SCENARIO = (
    Planned("build-and-test.yaml", SUCCEEDED),
    Planned("sign-off.yaml", SUCCEEDED, must_queue=True, answers=("verdict=approve",)),
    Planned("lint.yaml", SUCCEEDED),
)

# A board of its own (no run of SCENARIO fits it) that hangs in the middle of every burn-in run
# until it is quarantined (BrokenBoard).
BROKEN = DemoNode(
    "board-2", "am62x board on the bench; its host keeps hanging", ("board:soc=am62x",)
)


def examples_dir() -> Path:
    """``examples/`` of the source tree this package runs from."""
    return Path(app.__file__).resolve().parent.parent / "examples"


# ------------------------------------------------------------------------------ printing


def _stamp() -> str:
    return datetime.now().strftime("%H:%M:%S")


def say(text: str) -> None:
    click.echo(f"{_stamp()}  {text}")


def note(text: str) -> None:
    click.echo(f"{'':8}  {text}")


def _moment(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return parse_ts(text)
    except ValueError:
        return None


def _database_label(url: str) -> str:
    """The database's address without its password."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    user = f"{parts.username}@" if parts.username else ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{user}{host}{port}{parts.path}"


# ---------------------------------------------------------------------------- processes


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


class Children:
    """The processes the demo started; each in a session of its own, so Ctrl-C in the terminal
    reaches only the demo, which stops them in order."""

    def __init__(self) -> None:
        self.all: list[Child] = []
        self.frozen: set[int] = set()  # the pids of the children stopped with SIGSTOP

    def start(self, name: str, argv: Sequence[str], env: dict[str, str], log: Path) -> Child:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_parent_death_signal(signal.SIGTERM),
            )
        child = Child(name, proc, log)
        self.all.append(child)
        return child

    def alive(self) -> list[Child]:
        return [c for c in self.all if c.proc.poll() is None]

    def freeze(self, child: Child) -> None:
        """SIGSTOP to the child's process group: it hangs as a board's host does, answering
        nothing and advertising nothing (its steps run in sessions of their own and go on)."""
        os.killpg(child.proc.pid, signal.SIGSTOP)
        self.frozen.add(child.proc.pid)

    def thaw(self, child: Child) -> None:
        self.frozen.discard(child.proc.pid)
        try:
            os.killpg(child.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def stop(self, children: Sequence[Child]) -> None:
        """SIGTERM to each, then wait; a child still there after STOP_SECONDS is killed with its
        process group. A frozen child is let go on first, or it could not act on the SIGTERM."""
        for c in children:
            if c.proc.poll() is None:
                c.proc.send_signal(signal.SIGTERM)
                if c.proc.pid in self.frozen:
                    self.thaw(c)
        deadline = time.monotonic() + STOP_SECONDS
        for c in children:
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(c.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                c.proc.wait()

    def stop_all(self) -> None:
        """The agents first (they drain: nothing runs by now), then the rest."""
        agents = [c for c in self.all if c.name.startswith("agent ")]
        self.stop(agents)
        self.stop([c for c in self.all if c not in agents])


def mediator_argv(*args: str) -> list[str]:
    """``mediator ARGS`` with this very interpreter and package."""
    return [sys.executable, "-m", "app.commands", *args]


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment without the Mediator's own variables (the children are
    configured here, not by whatever the shell holds), importing this same package."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("MEDIATOR_") and k != "DATABASE_URL"
    }
    root = str(Path(app.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _ready(base: str) -> bool:
    try:
        return Connection(base, timeout=5, keep_alive=False).request("GET", "/readyz").status == 200
    except (ConnectionFailed, ValueError):
        return False


def start_server(
    children: Children, db_url: str, directory: Path, port: int, examples: Path
) -> tuple[str, Child]:
    """``mediator server serve`` (the development server and its reaper thread) on 127.0.0.1;
    returns its base URL once /readyz answers 200. A free port taken meanwhile by someone else is
    tried again on another one."""
    env = child_env(
        MEDIATOR_DATABASE_URL=db_url,
        MEDIATOR_RECORDS_ROOT=str(directory / "records"),
        MEDIATOR_TOKEN=TOKEN,
        # The demo's token is short to type; the server warns about it at start-up.
        MEDIATOR_TOKEN_ALLOW_SHORT="true",
        # The pages are served over plain HTTP on 127.0.0.1: a Secure cookie would never be sent.
        MEDIATOR_UI_INSECURE_COOKIE="true",
        MEDIATOR_LEASE_RENEW_SECONDS=str(RENEW_SECONDS),
        MEDIATOR_LEASE_NOT_AFTER_FACTOR=str(NOT_AFTER_FACTOR),
        # A board whose runs end FAILURES_IN_A_ROW times in a row because it went silent is
        # quarantined; the health run of examples/health-check.json lifts it (docs/operators.md).
        MEDIATOR_HEALTH_FAILURES_IN_A_ROW=str(FAILURES_IN_A_ROW),
        MEDIATOR_HEALTH_CHECK_CONTRACT=str(examples / HEALTH_CHECK),
        MEDIATOR_LOG_FORMAT="console",
        MEDIATOR_LOG_LEVEL="info",
    )
    log = directory / "logs" / "server.log"
    for _attempt in range(3):
        chosen = port or _free_port()
        argv = mediator_argv("server", "serve", "--host", "127.0.0.1", "--port", str(chosen))
        child = children.start("server", argv, env, log)
        base = f"http://127.0.0.1:{chosen}"
        deadline = time.monotonic() + START_SECONDS
        while child.proc.poll() is None and time.monotonic() < deadline:
            if _ready(base):
                return base, child
            time.sleep(0.05)  # a process binding its port: there is no event to await
        if child.proc.poll() is None:
            raise DemoError(f"the server did not answer within {START_SECONDS:g} s; see {log}")
        if port:
            break
    raise DemoError(f"the server stopped while starting; see {log}:\n{_tail(log)}")


_ADVERTISED = re.compile(r"\badvertised\b")


def start_agent(children: Children, node: DemoNode, base: str, directory: Path) -> Child:
    """``mediator agent`` for ``node`` (:func:`await_advert` waits for its first advert)."""
    caps = [arg for cap in node.capabilities for arg in ("--capability", cap)]
    argv = mediator_argv(
        "agent",
        "--url",
        base,
        "--token",
        TOKEN,
        "--principal",
        f"owner-of-{node.node_id}@lab.example",
        "--node-id",
        node.node_id,
        "--label",
        node.label,
        *caps,
        "--work-dir",
        str(directory / "work" / node.node_id),
        "--claim-wait",
        str(CLAIM_WAIT_SECONDS),
        "--log-format",
        "console",
    )
    (directory / "work" / node.node_id).mkdir(parents=True, exist_ok=True)
    log = directory / "logs" / f"agent-{node.node_id}.log"
    log.unlink(missing_ok=True)
    return children.start(f"agent {node.node_id}", argv, child_env(), log)


def await_advert(child: Child) -> None:
    """Until the agent's first advert was taken (its log says so), so that nothing is placed on
    an advert of an earlier start of that node."""
    deadline = time.monotonic() + START_SECONDS
    while not _ADVERTISED.search(_tail(child.log, 200)):
        if child.proc.poll() is not None:
            raise DemoError(
                f"{child.name} stopped (exit {child.proc.returncode}); see {child.log}:\n"
                f"{_tail(child.log)}"
            )
        if time.monotonic() > deadline:
            raise DemoError(f"{child.name} did not advertise within {START_SECONDS:g} s")
        time.sleep(0.05)  # the agent's first advert shows in its log: no event to await


# ---------------------------------------------------------------------------------- runs


@dataclass
class Tracked:
    """One submitted run and what the demo has seen of it."""

    planned: Planned
    run_id: str
    doc: dict[str, Any]
    view: dict[str, Any] = field(default_factory=dict)
    state: str | None = None
    queued_at_submit: bool = False
    promoted: str | None = None  # the cause of its promotion
    steps: StepChanges = field(default_factory=StepChanges)
    answered: set[int] = field(default_factory=set)

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def step_spec(self, step_id: object) -> dict[str, Any]:
        for s in self.doc.get("steps") or []:
            if isinstance(s, dict) and s.get("id") == step_id:
                return s
        return {}


def load_example(directory: Path, name: str, suffix: str) -> dict[str, Any]:
    path = directory / name
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DemoError(f"cannot read {path}: {exc.strerror}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("run_id"), str):
        raise DemoError(f"{path}: not a contract with a run_id")
    doc["run_id"] = f"{doc['run_id']}-{suffix}"  # each demo's runs are new runs
    return doc


def waits_for(view: dict[str, Any]) -> str:
    """``waits for board soc=imx8mp (held by build-and-test-1a2b), position 1``."""
    parts = []
    for line in view.get("requires") or []:
        c = line.get("candidates")
        if not isinstance(c, dict):
            continue
        live, busy, draining = (int(c.get(k, 0)) for k in ("live", "busy", "draining"))
        count = line.get("count") if isinstance(line.get("count"), int) else 1
        what = render.requirement(line)
        if live == 0:
            parts.append(f"waits for {what} (no live node has it)")
        elif live - busy - draining < count:
            held = ", ".join(str(h) for h in line.get("held_by") or [])
            parts.append(f"waits for {what}" + (f" (held by {held})" if held else " (draining)"))
    position = (view.get("queue") or {}).get("position", "?")
    return ", ".join([*(parts or ["waits"]), f"position {position}"])


class Scenario:
    """Submits the planned runs, tells what happens to them, answers their asks."""

    def __init__(
        self,
        client: Client,
        base: str,
        examples: Path,
        records: Path,
        *,
        answer_in_browser: bool = False,
    ) -> None:
        self.client = client
        self.answer_in_browser = answer_in_browser
        self.base = base
        self.examples = examples
        self.records = records
        self.runs: list[Tracked] = []
        self.suffix = secrets.token_hex(2)  # each demo's runs are new runs

    # ------------------------------------------------------------------ submitting

    def submit(self, plan: Sequence[Planned]) -> None:
        docs = [(p, load_example(self.examples, p.example, self.suffix)) for p in plan]
        for p, doc in docs:
            self.submit_one(p, doc)

    def submit_one(self, p: Planned, doc: dict[str, Any]) -> Tracked:
        reply = self.client.post("/v1/runs", doc)
        view = reply.json()
        t = Tracked(p, doc["run_id"], doc, view=view, state=view.get("state"))
        self.runs.append(t)
        if reply.status == 200:
            raise DemoError(f"run {t.run_id} already existed in this database")
        say(f"submitted examples/{p.example} as run {t.run_id}")
        if t.state == QUEUED:
            t.queued_at_submit = True
            note(f"run {t.run_id} QUEUED: {waits_for(view)}")
        elif t.state == RUNNING:
            note(f"run {t.run_id} RUNNING on {render.assigned(view)}")
        else:
            note(f"run {t.run_id} {t.state}")
        return t

    # ------------------------------------------------------------------ following

    def follow(self, timeout: float, stories: Sequence[BrokenBoard] = ()) -> None:
        """Until every run has ended and every story is told: each look tells what changed in
        the runs, then lets each story take its next step (it may add runs)."""
        deadline = time.monotonic() + timeout
        while True:
            for t in list(self.runs):
                if not t.finished:
                    self.see(t, self.client.get(f"/v1/runs/{quote(t.run_id)}"))
            for story in stories:
                story.step()
            if all(t.finished for t in self.runs) and all(s.done for s in stories):
                break
            if time.monotonic() > deadline:
                late = [f"{t.run_id} {t.state}" for t in self.runs if not t.finished]
                late += [s.waiting for s in stories if not s.done]
                raise DemoError(f"not finished within {timeout:g} s: {', '.join(late)}")
            time.sleep(LOOK_SECONDS)

    def see(self, t: Tracked, view: dict[str, Any]) -> None:
        state = str(view.get("state"))
        t.view = view
        ending = state in FINISHED
        if ending:  # the steps that ended the run come before its end
            self._see_steps(t, view)
        if state != t.state:
            before, t.state = t.state, state
            if before == QUEUED and state in (RUNNING, *FINISHED):
                self._promoted(t, view)
            if ending:
                say(f"run {t.run_id} verdict {state}")
                for line in render.verdict_lines(view):
                    note(line)
        if not ending:  # a promotion comes before the steps it starts
            self._see_steps(t, view)

    def _promoted(self, t: Tracked, view: dict[str, Any]) -> None:
        events = self.client.get(f"/v1/runs/{quote(t.run_id)}/events").get("events") or []
        promotion = next(
            (e for e in events if str(e.get("cause", "")).startswith("promoted")), None
        )
        if promotion is None:  # it left the queue otherwise: cancelled, or timed out
            return
        cause = str(promotion.get("cause")).removeprefix("promoted: ")
        t.promoted = cause
        after = self._after_freeing(cause, _moment(promotion.get("at")))
        say(f"run {t.run_id} promoted ({cause}{after}): RUNNING on {render.assigned(view)}")

    def _after_freeing(self, cause: str, at: datetime | None) -> str:
        """``, 0.004 s after the node was freed``: how long after the node was let go (the end of
        the run that held it, or of the step that released it) the promotion committed."""
        if at is None:
            return ""
        freed: list[datetime] = []
        for t in self.runs:
            if f"by {t.run_id}/" not in cause and f", {t.run_id}/" not in cause:
                continue
            view = self.client.get(f"/v1/runs/{quote(t.run_id)}")
            moments = [_moment(view.get("ended_at"))]
            moments += [_moment(s.get("ended_at")) for s in view.get("steps") or []]
            freed += [m for m in moments if m is not None and m <= at]
        if not freed:
            return ""
        return f", {(at - max(freed)).total_seconds():.3f} s after the node was freed"

    def _see_steps(self, t: Tracked, view: dict[str, Any]) -> None:
        for step in view.get("steps") or []:
            self._see_step(t, step)

    def _see_step(self, t: Tracked, step: dict[str, Any]) -> None:
        if not t.steps.changed(step):
            return
        state, name, node = step.get("state"), step.get("id"), step.get("node")
        where = f"run {t.run_id}: step {name}"
        if state == PENDING:
            return  # pending again after a rollback: the demo tells only what moves on
        if state == CLAIMED:
            say(f"{where} running on {node}")
        elif state == ASKED:
            self._ask(t, int(step.get("seq", 0)), step)
        elif state == DONE:
            say(f"{where} {self._done(t, step)}")
        elif state == FAILED:
            say(f"{where} FAILED: {step.get('error') or 'did not complete'}")
        elif state == SKIPPED:
            say(f"{where} skipped (a branch not taken)")
        else:
            say(f"{where} {state}")

    def _done(self, t: Tracked, step: dict[str, Any]) -> str:
        kind, code = step.get("kind"), step.get("exit_code")
        if kind == "ask":
            return "answered"
        if kind == "acquire":
            return "done (the Mediator looked for one more node)"
        if code is None:
            text = "done"
        else:
            text = "succeeded (exit 0)" if code == 0 else f"done, exit {code}"
        if step.get("node"):
            text += f" on {step['node']}"
        released = t.step_spec(step.get("id")).get("release") or []
        if released:
            text += f"; releases {', '.join(released)} ({step.get('node')})"
        return text

    def _ask(self, t: Tracked, seq: int, step: dict[str, Any]) -> None:
        ask = t.step_spec(step.get("id")).get("ask") or {}
        who = ", ".join(ask.get("answerers") or []) or "anyone"
        say(f"run {t.run_id}: step {step.get('id')} asks {who}: {ask.get('prompt', '?')}")
        if seq in t.answered or not t.planned.answers:
            return
        t.answered.add(seq)
        if self.answer_in_browser:
            note(f"answer it in your browser: {self.base}/asks")
            note(f"  (sign in at {self.base}/signin with token {TOKEN}, principal {ANSWERER})")
            return
        sets = [arg for pair in t.planned.answers for arg in ("--set", pair)]
        args = ["--principal", ANSWERER, "answer", t.run_id, str(seq), *sets]
        note(f"$ mediator {' '.join(args)}")
        done = subprocess.run(
            mediator_argv("--url", self.base, "--token", TOKEN, *args),
            env=child_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        for line in (done.stdout + done.stderr).splitlines():
            note(f"  {line}")
        if done.returncode != 0:
            raise DemoError(f"mediator answer exited {done.returncode}")

    # ------------------------------------------------------------------ the end

    def records_sealed(self, timeout: float = 20.0) -> list[Path]:
        """The Record directory of every run, once sealed (the seal follows the verdict)."""
        deadline = time.monotonic() + timeout
        paths = [self.records / record_location(t.run_id) for t in self.runs]
        while not all((p / SUMS).exists() for p in paths):
            if time.monotonic() > deadline:
                missing = ", ".join(str(p) for p in paths if not (p / SUMS).exists())
                raise DemoError(f"Records not sealed within {timeout:g} s: {missing}")
            time.sleep(LOOK_SECONDS)  # sealing happens in the server: there is no event here
        return paths

    def problems(self) -> list[str]:
        found = []
        for t in self.runs:
            if t.state != t.planned.expect:
                found.append(f"run {t.run_id} ended {t.state}, expected {t.planned.expect}")
            if t.planned.must_queue and not (t.queued_at_submit and t.promoted):
                found.append(f"run {t.run_id} was expected to wait QUEUED, then be promoted")
        return found


# ------------------------------------------------------------------------ the hanging board


def node_line(client: Client, node_id: str) -> tuple[dict[str, Any] | None, datetime | None]:
    """The node's line of ``GET /v1/nodes`` (None while it is not listed: not live and holding
    no lease) and when the Mediator looked."""
    listing = client.get("/v1/nodes")
    line = next((n for n in listing.get("nodes") or [] if n.get("node_id") == node_id), None)
    return line, _moment(listing.get("observed_at"))


def _strikes(n: object) -> str:
    return f"{n} strike" + ("" if n == 1 else "s")


class BrokenBoard:
    """``board-2`` hangs in the middle of one burn-in run after another until the Mediator
    quarantines it; then the reaper queues its health run, which passes and lifts the quarantine
    (docs/operators.md). Told a look at a time by :meth:`step`, from :meth:`Scenario.follow`."""

    WAITING = {
        "submit": "board-2 to advertise again",
        "running": "board-2 to run its burn-in step",
        "frozen": "the reaper to fail the run of the frozen board-2",
        "back": "board-2 to advertise again",
        "quarantined": "the reaper to queue the health run of board-2",
        "health": "the health run of board-2",
    }

    def __init__(
        self, scenario: Scenario, children: Children, agent: Child, check: dict[str, Any]
    ) -> None:
        self.scenario = scenario
        self.client = scenario.client
        self.operator = Client(scenario.base, TOKEN, OPERATOR)
        self.children = children
        self.agent = agent
        self.node = BROKEN.node_id
        self.check = check  # examples/health-check.json as it is
        self.phase = "submit"
        self.runs: list[Tracked] = []  # the burn-in runs, in order
        self.strikes: list[int] = []  # the node's strikes after each of them
        self.quarantined: str | None = None  # the quarantine's reason
        self.health: Tracked | None = None
        self.lifted = False
        self.known: set[str] = set()  # the node's health runs of earlier demos on this database

    @property
    def done(self) -> bool:
        return self.phase == "done"

    @property
    def waiting(self) -> str:
        return f"waiting for {self.WAITING.get(self.phase, self.phase)}"

    def start(self) -> None:
        line, _ = node_line(self.client, self.node)
        health = (line or {}).get("health") or {}
        if health.get("state") == "quarantined" or health.get("strikes"):
            # An earlier demo on this database stopped half-way: begin with a board in service.
            self.operator.request("DELETE", f"/v1/nodes/{quote(self.node)}/quarantine")
            say(
                f"{self.node} was left {health.get('state')} with {_strikes(health.get('strikes'))}"
                f" by an earlier demo: lifted by hand as {OPERATOR}"
            )
        self.known = set(self._health_runs())
        say(f"{self.node} hangs in the middle of every run, as a board with a failing host does:")
        note("the demo freezes its agent (SIGSTOP) once a step runs there, and lets it go on")
        note(
            f"(SIGCONT) once the reaper has failed the run; {FAILURES_IN_A_ROW} such failures in a "
            "row quarantine it"
        )

    def step(self) -> None:
        if self.phase == "submit":
            self._submit()
        elif self.phase == "running":
            self._hang()
        elif self.phase == "frozen":
            self._thaw()
        elif self.phase == "back":
            self._struck()
        elif self.phase == "quarantined":
            self._health_queued()
        elif self.phase == "health":
            self._health_ended()

    def _health_runs(self) -> list[str]:
        """The node's health runs, newest first (``health-<16 hex>-<n>``, team ``health``)."""
        prefix = health_run_id(self.node, 0).removesuffix("0")
        listing = self.client.get("/v1/runs", {"team": "health", "limit": 1000})
        ids = [str(r.get("run_id")) for r in listing.get("runs") or []]
        return [r for r in ids if r.startswith(prefix)]

    def _submit(self) -> None:
        line, _ = node_line(self.client, self.node)
        if line is None or not line.get("live"):
            return  # not back from its hang yet: a run would find no live board for it
        doc = load_example(
            self.scenario.examples, BURN_IN, f"{self.scenario.suffix}-{len(self.runs) + 1}"
        )
        t = self.scenario.submit_one(Planned(BURN_IN, FAILED), doc)
        self.runs.append(t)
        if t.state != RUNNING:
            raise DemoError(f"run {t.run_id} was to be placed on {self.node} at once: {t.state}")
        self.phase = "running"

    def _hang(self) -> None:
        t = self.runs[-1]
        if t.finished:
            raise DemoError(f"run {t.run_id} ended {t.state} before {self.node} could hang")
        if not any(s.get("state") == CLAIMED for s in t.view.get("steps") or []):
            return
        line, now = node_line(self.client, self.node)
        lease = (line or {}).get("lease") or {}
        not_after = _moment(lease.get("not_after"))
        if lease.get("run_id") != t.run_id or not_after is None or now is None:
            return
        # A lease is granted for lease.ttl_seconds, and the node's next advert shortens it to
        # NOT_AFTER_FACTOR heartbeats: only from then on does silence end the run in seconds.
        left = (not_after - now).total_seconds()
        if left > RENEW_SECONDS * NOT_AFTER_FACTOR + 1:
            return
        self.children.freeze(self.agent)
        say(
            f"{self.node} hangs in the middle of run {t.run_id}: its agent is frozen (SIGSTOP) "
            "and advertises no more"
        )
        note(f"its lease of {t.run_id} runs out in {max(left, 0):.0f} s; the reaper then fails it")
        self.phase = "frozen"

    def _thaw(self) -> None:
        t = self.runs[-1]
        if not t.finished:
            return
        self.children.thaw(self.agent)
        say(f"{self.node} comes back (SIGCONT): its next advert tells it the run is gone")
        self.phase = "back"

    def _struck(self) -> None:
        line, _ = node_line(self.client, self.node)
        if line is None or not line.get("live"):
            return
        health = line.get("health") or {}
        strikes = int(health.get("strikes") or 0)
        self.strikes.append(strikes)
        t = self.runs[-1]
        say(
            f"{self.node}: strike {strikes} of {FAILURES_IN_A_ROW} (its lease of {t.run_id} "
            "expired: the board went silent mid-run)"
        )
        if health.get("state") != "quarantined":
            self.phase = "submit"
            self._submit()
            return
        self.quarantined = str(health.get("reason"))
        say(f"{self.node} quarantined: {self.quarantined}")
        note("no run but its health run is placed on it until that passes or an operator lifts it")
        self.phase = "quarantined"

    def _health_queued(self) -> None:
        new = [r for r in self._health_runs() if r not in self.known]
        if not new:
            return
        run_id = new[0]
        t = Tracked(Planned(HEALTH_CHECK, SUCCEEDED), run_id, {**self.check, "run_id": run_id})
        self.scenario.runs.append(t)
        self.health = t
        say(
            f"the reaper queued health run {run_id} for {self.node} (examples/{HEALTH_CHECK}; "
            "pinned to the board, priority 100, team health)"
        )
        self.phase = "health"

    def _health_ended(self) -> None:
        t = self.health
        if t is None or not t.finished:
            return
        line, _ = node_line(self.client, self.node)
        health = (line or {}).get("health") or {}
        if t.state == SUCCEEDED and health.get("state") == "ok":
            self.lifted = True
            say(
                f"{self.node} quarantine lifted: its health run {t.run_id} passed; "
                f"{_strikes(health.get('strikes', 0))}, it takes runs again"
            )
        self.phase = "done"

    def problems(self) -> list[str]:
        if self.quarantined is None:
            return [f"{self.node} was expected to be quarantined after its failures in a row"]
        if not self.lifted:
            return [f"{self.node} was expected to be lifted by its health run"]
        return []

    def summary(self) -> dict[str, Any]:
        """What demo.json keeps of the story."""
        return {
            "node": self.node,
            "runs": [t.run_id for t in self.runs],
            "strikes": self.strikes,
            "quarantined": self.quarantined,
            "health_run": self.health.run_id if self.health else None,
            "lifted": self.lifted,
        }


# ------------------------------------------------------------------------------ the whole


@dataclass
class Database:
    url: str
    embedded: EmbeddedPostgres | None = None


def open_database(url: str | None) -> Database:
    from app.migrate import upgrade

    if url:
        say(f"PostgreSQL: {_database_label(url)}")
        upgrade(url)
        return Database(url)
    if not wheel_installed():
        raise DemoError(f"no --database-url given and {WHEEL_MISSING}")
    try:
        pg = EmbeddedPostgres().start()
    except EmbeddedPostgresError as exc:
        raise DemoError(f"the embedded PostgreSQL did not start: {exc}") from None
    db = Database(create_database(pg.admin_url, "mediator"), pg)
    say(f"PostgreSQL: a throwaway embedded server (pid {pg.pid}), removed when the demo stops")
    upgrade(db.url)
    return db


def _write_state(directory: Path, state: dict[str, Any]) -> None:
    path = directory / "demo.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@dataclass
class DemoOptions:
    once: bool = False
    database_url: str | None = None
    port: int = 0
    directory: Path | None = None
    timeout: float = 120.0
    examples: Path = field(default_factory=examples_dir)
    answer_in_browser: bool = False  # the sign-off is answered by a person on the asks page


@dataclass
class Demo:
    opts: DemoOptions
    directory: Path
    children: Children = field(default_factory=Children)
    database: Database | None = None
    state: dict[str, Any] = field(default_factory=dict)

    def run(self) -> int:
        """The whole demo; the exit code."""
        handler = self._interrupt
        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._run()
        except Interrupted as stop:
            click.echo("")
            say(f"{stop}: stopping the agents, the server and the database")
            if "expected" not in self.state:  # before the last verdict
                return EXIT_INTERRUPTED
            return EXIT_OK if self.state["expected"] else EXIT_UNEXPECTED
        except (DemoError, ClientError) as exc:
            message = exc.message if isinstance(exc, ClientError) else str(exc)
            click.echo(f"mediator demo: {message}", err=True)
            return EXIT_UNEXPECTED
        finally:
            for s in previous:  # a second Ctrl-C must not cut the clean-up short
                signal.signal(s, signal.SIG_IGN)
            try:
                self._stop()
            finally:
                for s, old in previous.items():
                    signal.signal(s, old)

    def _interrupt(self, signum: int, _frame: FrameType | None) -> None:
        raise Interrupted(signum)

    def _run(self) -> int:
        d = self.directory
        needed = [*(p.example for p in SCENARIO), BURN_IN, HEALTH_CHECK]
        missing = [name for name in needed if not (self.opts.examples / name).is_file()]
        if missing:
            raise DemoError(
                f"{self.opts.examples} lacks {', '.join(missing)}: run the demo from a source "
                "tree, or give --examples DIR"
            )
        for sub in ("records", "logs", "work"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        say(f"demo directory {d} (Records, logs, demo.json)")
        self.database = open_database(self.opts.database_url)
        pids: dict[str, int | None] = {}
        if self.database.embedded is not None:
            pids["postgres"] = self.database.embedded.pid
        base, server = start_server(
            self.children, self.database.url, d, self.opts.port, self.opts.examples
        )
        pids["server"] = server.proc.pid
        self.state = {"url": base, "token": TOKEN, "records": str(d / "records"), "pids": pids}
        _write_state(d, self.state)
        say(f"Mediator serving on {base}/ (pid {server.proc.pid}; pages there, API under /v1)")
        note(f"sign in at {base}/signin with the token {TOKEN}")
        agents = [(node, start_agent(self.children, node, base, d)) for node in (*FLEET, BROKEN)]
        for _node, agent in agents:
            pids[agent.name] = agent.proc.pid
        _write_state(d, self.state)
        for node, agent in agents:
            await_advert(agent)
            caps = "; ".join(c.replace(":", " ").replace(",", " ") for c in node.capabilities)
            say(f"agent {node.node_id} (pid {agent.proc.pid}) advertises {caps}")

        scenario = Scenario(
            Client(base, TOKEN, SUBMITTER),
            base,
            self.opts.examples,
            d / "records",
            answer_in_browser=self.opts.answer_in_browser,
        )
        scenario.submit(SCENARIO)
        self.state["runs"] = [t.run_id for t in scenario.runs]
        _write_state(d, self.state)
        board = BrokenBoard(
            scenario,
            self.children,
            dict(agents)[BROKEN],
            json.loads((self.opts.examples / HEALTH_CHECK).read_text(encoding="utf-8")),
        )
        board.start()
        try:
            scenario.follow(self.opts.timeout, [board])
        finally:
            self.state["board"] = board.summary()
            _write_state(d, self.state)
        paths = scenario.records_sealed()
        problems = scenario.problems() + board.problems()

        click.echo("")
        say(f"the sealed Records, on disk in {d / 'records'}:")
        width = max(len(t.run_id) for t in scenario.runs)
        for t, path in zip(scenario.runs, paths, strict=True):
            note(f"{t.run_id:<{width}} {t.state:<10} {path}")
        note(f"logs of the server and the agents: {d / 'logs'}")
        self.state["verdicts"] = {t.run_id: t.state for t in scenario.runs}
        self.state["expected"] = not problems
        _write_state(d, self.state)
        for problem in problems:
            click.echo(f"mediator demo: {problem}", err=True)
        if not problems:
            say(f"all {len(scenario.runs)} verdicts as expected")
            note(
                f"{board.node} was quarantined after {FAILURES_IN_A_ROW} failures in a row and "
                "lifted by its health run"
            )
        if not self.opts.once:
            self._serve(base)  # until a signal, which ends the demo with the code above
        return EXIT_UNEXPECTED if problems else EXIT_OK

    def _serve(self, base: str) -> None:
        click.echo("")
        say("the Mediator and its agents keep running; Ctrl-C stops them all")
        note(f"pages        {base}/signin  (token {TOKEN})")
        note(f"client       export MEDIATOR_CLIENT_URL={base} MEDIATOR_CLIENT_TOKEN={TOKEN}")
        note("             mediator runs; mediator nodes; mediator status RUN")
        note(f"             mediator submit {self.opts.examples / 'boot-test.yaml'} --wait")
        note("             (each example's run_id can be submitted once: change it to go again)")
        while True:
            gone = [c for c in self.children.all if c.proc.poll() is not None]
            if gone:
                raise DemoError(
                    f"{gone[0].name} stopped (exit {gone[0].proc.returncode}); see {gone[0].log}"
                )
            time.sleep(0.5)  # waiting for Ctrl-C; a child's end is noticed within this

    def _stop(self) -> None:
        self.children.stop_all()
        if self.database is not None and self.database.embedded is not None:
            self.database.embedded.stop()


def run_demo(opts: DemoOptions) -> int:
    directory = opts.directory or Path(tempfile.mkdtemp(prefix="mediator-demo-"))
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    return Demo(opts, directory).run()
