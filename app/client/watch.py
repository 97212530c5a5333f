"""Following a run or a step's log as it changes, by polling the API at a short interval.

``mediator submit --wait`` and ``mediator status --wait`` print each change of the run view: the
state, while QUEUED a live line saying what the run waits for
(docs/queue.md#what-a-queued-runs-view-explains), each step as it starts and ends, and the verdict
at the end. ``mediator logs --follow`` prints a step's log as it grows (``GET …/log?from=N``,
docs/api.md#get-v1runsrun_idstepsseqlog--read-a-steps-log).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, BinaryIO, TextIO

from app.client import render
from app.client.api import Client, Refused, Unreachable, quote
from app.client.exits import EXIT_REFUSED
from app.states import ASKED, CLAIMED, DONE, FAILED, PENDING, QUEUED, RUN_FINISHED, RUNNING

FINISHED = RUN_FINISHED
# A Mediator that does not answer for this long while a run is watched ends the watch (exit 3);
# shorter gaps (a restart of the server) are waited out.
UNREACHABLE_GRACE = 10.0


def _stamp() -> str:
    return datetime.now().strftime("%H:%M:%S")


class StepChanges:
    """Which steps of a run's views are worth a line: a step whose state, attempt or node differs
    from the last view of it, except one still PENDING that never started (a promotion only
    names its node). What the line says is the caller's (the client's watch, the demo's story)."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[Any, ...]] = {}

    def changed(self, step: Mapping[str, Any]) -> bool:
        """Whether ``step`` (one of a view's ``steps``) changed since it was last seen."""
        seq = int(step.get("seq", 0))
        key = (step.get("state"), step.get("attempt"), step.get("node"))
        before = self.seen.get(seq)
        self.seen[seq] = key
        if before == key:
            return False
        return not (step.get("state") == PENDING and (before is None or before[0] == PENDING))


class RunWatch:
    """Prints what changed between two views of one run; ``live`` rewrites the waiting line in
    place (a terminal), else a waiting line is printed each time its text changes."""

    def __init__(self, out: TextIO, *, live: bool) -> None:
        self.out = out
        self.live = live
        self.state: str | None = None
        self.steps = StepChanges()
        self.waiting: str | None = None
        self._live_shown = False

    # ---------------------------------------------------------------------------- printing

    def _line(self, text: str) -> None:
        if self._live_shown:  # the last waiting line stays on the screen, above what follows
            self.out.write("\n")
            self._live_shown = False
        self.out.write(f"{_stamp()}  {text}\n")
        self.out.flush()

    def end_live(self) -> None:
        """Leave the waiting line on the screen and end it: what is printed next is below it."""
        if self._live_shown:
            self.out.write("\n")
            self.out.flush()
            self._live_shown = False

    def _clear_live(self) -> None:
        if self._live_shown:
            self.out.write("\r\033[K")
            self._live_shown = False

    def _show_waiting(self, text: str) -> None:
        if text == self.waiting and not self.live:
            return
        self.waiting = text
        if self.live:
            self._clear_live()
            # One screen line: a wrapped one could not be rewritten in place.
            width = shutil.get_terminal_size().columns - 1
            self.out.write(f"{_stamp()}  waiting: {text}"[:width])
            self.out.flush()
            self._live_shown = True
        else:
            self._line(f"waiting: {text}")

    # ----------------------------------------------------------------------------- changes

    def see(self, view: Mapping[str, Any]) -> None:
        """Print what ``view`` shows that the previous one did not."""
        run_id, state = view.get("run_id"), str(view.get("state"))
        ending = state not in (QUEUED, RUNNING)
        if ending:  # the steps that ended the run come before its end
            self._see_steps(view)
        if state != self.state:
            self.state = state
            self.waiting = None
            where = render.assigned(view)
            self._line(f"{run_id} {state}" + (f" on {where}" if state == RUNNING else ""))
        if not ending:  # a promotion comes before the steps it starts
            self._see_steps(view)
        if state == QUEUED:
            self._show_waiting(render.queue_line(view))
        if state in FINISHED:
            for line in render.verdict_lines(view):
                self.out.write(f"{'':8}  {line}\n")
            self.out.flush()

    def _see_steps(self, view: Mapping[str, Any]) -> None:
        for step in view.get("steps") or []:
            self._see_step(view.get("run_id"), step)

    def _see_step(self, run_id: object, step: Mapping[str, Any]) -> None:
        if not self.steps.changed(step):
            return
        seq = int(step.get("seq", 0))
        label = render.step_label(step)
        state = step.get("state")
        attempt = f" (attempt {step['attempt']})" if step.get("attempt") else ""
        if state == CLAIMED:
            self._line(f"{label}: running on {step.get('node')}{attempt}")
        elif state == ASKED:
            self._line(
                f"{label}: waiting for an answer (mediator asks; mediator answer {run_id} "
                f"{seq} --set field=value)"
            )
        elif state == PENDING:
            self._line(f"{label}: pending again{attempt}")
        elif state in (DONE, FAILED):
            details = []
            if step.get("exit_code") is not None:
                details.append(f"exit {step['exit_code']}")
            if step.get("error"):
                details.append(str(step["error"]))
            tail = f" ({', '.join(details)})" if details else ""
            self._line(f"{label}: {state}{tail}")
        else:
            self._line(f"{label}: {state}")


class WaitTimedOut(Exception):
    """``--timeout`` passed before the run finished; ``view`` is the last one seen."""

    def __init__(self, view: Mapping[str, Any]) -> None:
        super().__init__(str(view.get("run_id")))
        self.view = view


def wait_for_verdict(
    client: Client,
    view: Mapping[str, Any],
    out: TextIO,
    *,
    interval: float,
    live: bool,
    timeout: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Mapping[str, Any]:
    """Poll the run view of ``view``'s run until the run has finished, printing every change;
    returns the last view. Past ``timeout`` seconds raises :class:`WaitTimedOut`."""
    watch = RunWatch(out, live=live)
    path = f"/v1/runs/{quote(str(view.get('run_id')))}"
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        return _poll(client, path, view, watch, interval, deadline, sleep)
    except KeyboardInterrupt:
        watch.end_live()  # what the command says next starts on a line of its own
        raise


def _poll(
    client: Client,
    path: str,
    view: Mapping[str, Any],
    watch: RunWatch,
    interval: float,
    deadline: float | None,
    sleep: Callable[[float], None],
) -> Mapping[str, Any]:
    quiet_since: float | None = None
    while True:
        watch.see(view)
        if view.get("state") in FINISHED:
            return view
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            watch.end_live()
            raise WaitTimedOut(view)
        sleep(interval if left is None else min(interval, left))
        try:
            view = client.get(path)
            quiet_since = None
        except Unreachable:
            now = time.monotonic()
            quiet_since = now if quiet_since is None else quiet_since
            if now - quiet_since > UNREACHABLE_GRACE:
                raise


# ------------------------------------------------------------------------------------ logs


def _step_of(client: Client, run_id: str, seq: int) -> tuple[Mapping[str, Any], dict[str, Any]]:
    view = client.get(f"/v1/runs/{quote(run_id)}")
    for step in view.get("steps") or []:
        if step.get("seq") == seq:
            return view, step
    have = len(view.get("steps") or [])
    raise Refused(
        f"run {run_id} has no step {seq} (its steps are 1 to {have})"
        if have
        else f"run {run_id} has no steps",
        exit_code=EXIT_REFUSED,
    )


def print_log(
    client: Client,
    run_id: str,
    seq: int,
    out: BinaryIO,
    note: TextIO,
    *,
    name: str = "step",
    follow: bool = False,
    interval: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Write step ``seq``'s log to ``out``; with ``follow``, go on while the step is open and
    stop once it ended and its log is read to the end."""
    view, step = _step_of(client, run_id, seq)
    path = f"/v1/runs/{quote(run_id)}/steps/{seq}/log"
    offset, attempt = 0, None
    ending = False  # the step had ended when the last read began: this read is the last one
    while True:
        answer = client.request("GET", path, query={"from": offset, "name": name})
        seen = int(answer.headers.get("x-enode-log-attempt", "0") or 0)
        if attempt is not None and seen > attempt > 0:
            # A new attempt's progress starts from its own beginning
            # (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log).
            note.write(f"--- attempt {seen} ---\n")
            note.flush()
            offset = 0
            attempt = seen
            continue
        attempt = seen if seen else attempt
        out.write(answer.body)
        out.flush()
        offset += len(answer.body)
        total = int(answer.headers.get("x-enode-log-bytes", "0") or 0)
        if answer.body and offset < total:
            continue  # a reply holds at most 1 MiB: read on at once
        if not follow or ending:
            return
        if view.get("state") in FINISHED or step.get("state") not in render.OPEN_STEP_STATES:
            ending = True  # one more read: what was written just before the step ended
            continue
        sleep(interval)
        view, step = _step_of(client, run_id, seq)
