"""The node agent: a heartbeat thread and a work loop (docs/api.md#node-agents).

The heartbeat advertises every ``renew_seconds`` (the value the last reply gave), with this
start's fresh instance id and the drain in force; its reply is the node's complete lease list.
The work loop long-polls for a step, runs it, and reports its result until the Mediator answers.

- A step whose run's lease leaves the heartbeat reply (cancel, release, a finished run) is
  stopped within one heartbeat: terminated, then killed.
- SIGTERM or SIGINT drains: ``graceful`` is advertised at once, the running step finishes and is
  reported, no new step is claimed, and the agent exits 0. A second signal stops the step too.
- While the drain file exists the agent advertises drain (``graceful``, or ``at-boundary`` when
  the file says so) and takes no new work: it finishes the runs it holds a lease for (an
  ``at-boundary`` drain claims nothing) and claims again once the file is gone.
- A claim whose answer was lost is asked again by the same instance, which the Mediator answers
  with the same step (a redelivery, docs/api.md#post-v1nodesnode_idclaim--the-next-step-for-a-node);
  a new start is a new instance, and the Mediator fails what the previous one left running (restart
  detection, docs/queue.md#heartbeats-what-a-node-learns).
"""

from __future__ import annotations

import random
import signal
import threading
import time
import uuid
from types import FrameType
from typing import Any

import structlog
from structlog.typing import FilteringBoundLogger

from app.agent import backoff
from app.agent.backoff import Backoff
from app.agent.config import AgentConfig
from app.agent.leases import HeldLeases, lease_of
from app.agent.link import Link, Unreachable
from app.agent.step import StepOutcome, StepRunner, remove_tree

FIRST_RENEW_SECONDS = 60.0  # until the Mediator's first reply says how often
EXIT_OK, EXIT_STOPPED, EXIT_REFUSED = 0, 1, 2


class Agent:
    def __init__(
        self, cfg: AgentConfig, instance: str | None = None, rng: random.Random | None = None
    ) -> None:
        self.cfg = cfg
        self.rng = rng or random.Random()  # the jitter of every retry (app/agent/backoff.py)
        self._claim_retry = Backoff(*backoff.CLAIM, rng=self.rng)
        self.instance = instance or uuid.uuid4().hex
        self.link = Link(cfg.url, cfg.token, cfg.principal, self.instance)
        self.leases = HeldLeases()
        self.log: FilteringBoundLogger = structlog.get_logger("mediator.agent").bind(
            node=cfg.node_id
        )
        self.renew_seconds = FIRST_RENEW_SECONDS
        self.draining = threading.Event()  # a signal came: finish the step, then exit
        self.stop = threading.Event()  # a second signal: stop the step too
        self.advertised = threading.Event()  # the Mediator took an advert
        self.drain_told = threading.Event()  # ... and one that carried a drain
        self.fatal: str | None = None
        self._beat = threading.Event()  # advertise now, not at the next interval
        self._told_drain = ""  # the drain of the last advert the Mediator took
        self._mediator_drain = ""
        self._signals: list[str] = []  # the signals received, in order
        self._signals_noted = 0

    # ------------------------------------------------------------ the whole

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self.log.info(
            "node agent starting",
            url=self.cfg.url,
            instance=self.instance,
            capabilities=[c.advert() for c in self.cfg.capabilities],
        )
        threading.Thread(target=self._heartbeat, name="agent-heartbeat", daemon=True).start()
        while not (self.advertised.is_set() or self.fatal or self.draining.is_set()):
            self.advertised.wait(0.2)
        if self.fatal is None and self.advertised.is_set():
            self._work()
        if self.fatal is not None:
            self.log.error("node agent stops", reason=self.fatal)
            return EXIT_REFUSED
        if self.advertised.is_set() and not self.drain_told.wait(5.0):
            self.log.warning("exiting before the Mediator was told of the drain")
        self.log.info("node agent stopped", drained=not self.stop.is_set())
        return EXIT_STOPPED if self.stop.is_set() else EXIT_OK

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Flags only: a log line written here could wait forever for the lock of the line the
        # interrupted code was writing. The heartbeat thread, woken at once, says what happened.
        self._signals.append(signal.Signals(signum).name)
        if self.draining.is_set():
            self.stop.set()
        else:
            self.draining.set()
        self._beat.set()

    def _note_signals(self) -> None:
        for name in self._signals[self._signals_noted :]:
            if self._signals_noted == 0:
                self.log.info("draining: finishing the running step, then exiting", signal=name)
            else:
                self.log.warning("stopping now: the running step is stopped too", signal=name)
            self._signals_noted += 1

    # ------------------------------------------------------------ drain

    def local_drain(self) -> str:
        """The drain file's drain: absent "", else ``at-boundary`` when it says so, else
        ``graceful``."""
        path = self.cfg.drain_file
        if path is None:
            return ""
        try:
            text = path.read_text(encoding="utf-8", errors="replace").strip()
        except FileNotFoundError:
            return ""
        except OSError:
            return "graceful"  # it is there, only unreadable
        return "at-boundary" if text == "at-boundary" else "graceful"

    def drain_now(self) -> str:
        local = self.local_drain()
        return local or ("graceful" if self.draining.is_set() else "")

    # ------------------------------------------------------------ heartbeat

    def _heartbeat(self) -> None:
        failing: str | None = None
        retry = Backoff(*backoff.ADVERT, rng=self.rng)
        while self.fatal is None:
            self._beat.clear()  # a wake-up from here on is another advert after this one
            self._note_signals()
            drain = self.drain_now()
            sent = time.monotonic()
            problem: str | None = None
            try:
                ans = self.link.advertise(self.cfg.advert(self.instance, drain))
                if ans.status == 200:
                    doc = ans.json()
                    if not isinstance(doc, dict):
                        raise ValueError("the advert's answer is not a JSON object")
                    self._took_advert(doc, ans.server_time(), sent, drain)
                elif ans.status in (400, 401, 403, 404):
                    self.fatal = f"the Mediator refused the advert: {ans.status} {ans.reason()}"
                    return
                else:
                    problem = f"{ans.status} {ans.reason()}"
            except Unreachable as exc:
                problem = str(exc)
            except ValueError as exc:  # not the Mediator answering (a proxy's page?)
                problem = f"unreadable answer: {exc}"
            if problem is not None and problem != failing:
                self.log.warning("advert failed; retrying", error=problem)
            elif problem is None and failing is not None:
                self.log.info("advert taken again")
            failing = problem
            if problem is None:
                retry.reset()
                self._beat.wait(self.renew_seconds)
            else:
                retry.cap = min(self.renew_seconds, backoff.ADVERT[1])
                self._beat.wait(retry.next_delay())

    def _took_advert(self, doc: dict[str, Any], server_now: Any, sent: float, drain: str) -> None:
        now = time.monotonic()
        leases = [lease_of(x, server_now, now) for x in doc.get("leases") or []]
        for run_id in self.leases.replace([x for x in leases if x is not None], sent):
            self.log.info("lease ended", run=run_id)
        renew = doc.get("renew_seconds")
        if isinstance(renew, (int, float)) and renew > 0 and renew != self.renew_seconds:
            self.renew_seconds = float(renew)
            if self.advertised.is_set():
                self.log.info("heartbeat interval changed", renew_seconds=renew)
        self._told_drain = drain
        if drain:
            self.drain_told.set()
        told = str(doc.get("drain") or "")
        if told != self._mediator_drain:
            self._mediator_drain = told
            if told:
                self.log.info("drain acknowledged by the Mediator", drain=told)
            elif self.advertised.is_set():
                self.log.info("drain lifted")
        if not self.advertised.is_set():
            self.log.info(
                "advertised",
                renew_seconds=self.renew_seconds,
                leases=len(leases),
                drain=drain or None,
            )
            self.advertised.set()

    # ------------------------------------------------------------ work

    def _work(self) -> None:
        holding_off = ""
        while self.fatal is None and not self.draining.is_set():
            local = self.local_drain()
            if local != self._told_drain:
                self._beat.set()  # the drain file changed: the Mediator hears of it now
            if local and (local == "at-boundary" or not self.leases.any()):
                if holding_off != local:
                    self.log.info("drain file present: taking no new work", drain=local)
                    holding_off = local
                self.draining.wait(1.0)
                continue
            if local and holding_off != "finishing":
                self.log.info("drain file present: finishing the runs this node holds")
                holding_off = "finishing"
            elif holding_off and not local:
                self.log.info("drain file gone: taking work again")
                holding_off = ""
            step = self._claim()
            if step is not None:
                if self.draining.is_set():
                    self.log.info("a step came while draining; running it before exiting")
                self._do(step)
        if self.draining.is_set():
            self.log.info("drained: no step running, no new one taken")

    def _claim(self) -> dict[str, Any] | None:
        try:
            ans = self.link.claim(self.cfg.node_id, self.cfg.claim_wait_seconds)
        except Unreachable as exc:
            # The answer may have been lost with a step in it: the same instance asks again and
            # the Mediator hands that step out again
            # (docs/api.md#post-v1nodesnode_idclaim--the-next-step-for-a-node).
            self.log.warning("claim failed; asking again", error=str(exc))
            self.draining.wait(self._claim_retry.next_delay())
            return None
        if ans.status == 204:
            self._claim_retry.reset()
            return None
        if ans.status == 200:
            self._claim_retry.reset()
            try:
                step = ans.json()
            except ValueError:
                step = None
            if isinstance(step, dict) and isinstance(step.get("run_id"), str):
                lease = lease_of(step.get("lease") or {}, ans.server_time(), time.monotonic())
                if lease is not None:
                    self.leases.add(lease)
                return step
            self.log.error("claim answered something that is not a step")
        elif ans.status in (401, 403):
            self.fatal = f"the Mediator refused the claim: {ans.status} {ans.reason()}"
            return None
        else:
            self.log.warning("claim refused; asking again", status=ans.status, reason=ans.reason())
        self.draining.wait(self._claim_retry.next_delay())
        return None

    def _do(self, step: dict[str, Any]) -> None:
        run_id, seq = step["run_id"], step.get("seq")
        log = self.log.bind(
            run=run_id,
            seq=seq,
            step=step.get("name"),
            kind=step.get("kind"),
            attempt=step.get("attempt", 0),
        )
        log.info("step taken", step_id=step.get("step_id"), uses=step.get("uses"))
        started = time.monotonic()
        nonce = (step.get("lease") or {}).get("nonce")
        outcome: StepOutcome
        if not isinstance(seq, int):
            outcome = StepOutcome({"node": self.cfg.node_id, "produced": [], "error": "no seq"})
        else:
            try:
                outcome = StepRunner(
                    self.cfg, self.link, self.leases, log, self.stop, self.rng
                ).run(step, nonce if isinstance(nonce, str) else None)
            except Exception as exc:  # the node goes on: one step's surprise is that step's
                log.exception("node agent failure while running the step")
                outcome = StepOutcome(
                    {"node": self.cfg.node_id, "produced": [], "error": f"node agent: {exc}"}
                )
        result = outcome.result
        log.info(
            "step finished",
            exit_code=result.get("exit_code"),
            error=result.get("error"),
            produced=result.get("produced"),
            seconds=round(time.monotonic() - started, 3),
        )
        if isinstance(seq, int):
            self._report(run_id, seq, result, log)
        if outcome.workdir is not None:
            if self.cfg.keep_work_dirs:
                log.info("working directory kept", path=str(outcome.workdir))
            else:
                remove_tree(outcome.workdir)

    def _report(
        self, run_id: str, seq: int, result: dict[str, Any], log: FilteringBoundLogger
    ) -> None:
        """Until the Mediator answers
        (docs/api.md#post-v1runsrun_idstepsseqresult--report-a-steps-result): a result is
        idempotent, and a lost one would leave the step CLAIMED. A 4xx is final; so is the end of
        the run's lease, after which the Mediator settles the run without this result."""
        retry = Backoff(*backoff.REPORT, rng=self.rng)
        while True:
            try:
                ans = self.link.report(run_id, seq, result)
            except Unreachable as exc:
                problem = str(exc)
            else:
                if ans.status == 200:
                    try:
                        doc = ans.json()
                    except ValueError:
                        doc = None
                    doc = doc if isinstance(doc, dict) else {}
                    if doc.get("rolled_back"):
                        log.info("result taken; the run goes back for another attempt")
                    else:
                        log.info("result taken", run_state=doc.get("run_state") or "RUNNING")
                    return
                if ans.refused:
                    log.warning("result refused", status=ans.status, reason=ans.reason())
                    return
                problem = f"{ans.status} {ans.reason()}"
            if not self.leases.holds(run_id):
                log.warning("lease ended before the result was delivered", error=problem)
                return
            delay = retry.next_delay()
            log.warning(
                "result not delivered; sending it again", error=problem, retry_in=round(delay, 3)
            )
            if self.stop.wait(delay):
                log.warning("result abandoned: the node agent was stopped")
                return
