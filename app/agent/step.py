"""One claimed step, run on this node (docs/contract.md#steps): a fresh working directory with
``$IN`` (the step's ``in.from`` blobs) and ``$OUT``, the command started without a shell in an
environment limited to what the contract names, its output appended to the step's log while it runs,
every file of ``$OUT`` uploaded after it, and the result it makes.

The agent judges nothing: an exit code other than 0 is a completed step (``success_when`` decides
at settle). Only a step that did not get to its end (it could not start, its lease ended, a
signal ended it) reports an ``error``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from structlog.typing import FilteringBoundLogger as BoundLogger

from app.agent import backoff
from app.agent.backoff import Backoff
from app.agent.config import AgentConfig
from app.agent.leases import HeldLeases
from app.agent.link import Answer, Link, Unreachable, segment

LOG_CHUNK = 64 * 1024  # at most this much output in one append
LOG_INTERVAL = 0.5  # seconds between two appends while output keeps coming
LOG_PENDING_LIMIT = 8 * 1024 * 1024  # output kept while the Mediator cannot be reached
UPLOAD_TRIES = 5
DRAIN_OUTPUT_SECONDS = 2.0  # after the command ends, how long its leftover children may write


class StepError(Exception):
    """The step cannot be run as given; the message becomes the result's ``error``."""


@dataclass
class StepOutcome:
    result: dict[str, Any]
    workdir: Path | None = None
    stopped: str | None = None  # why the agent stopped the command, None when it ran to its end
    produced: list[str] = field(default_factory=list)


def expand(argv: list[str], paths: Mapping[str, str]) -> list[str]:
    """``$IN``/``${IN}``, ``$OUT``/``${OUT}`` (and the harness's ``$PROMPT``, ``$STEP``) in each
    argument: there is no shell to do it, and a build needs to be told where ``$OUT`` is
    (``make install DESTDIR=$OUT``). Nothing else is expanded; ``$OUTPUT`` stays as it is."""
    names = "|".join(re.escape(n) for n in paths)
    pattern = re.compile(rf"\$(?:\{{({names})\}}|({names})(?![A-Za-z0-9_]))")
    return [pattern.sub(lambda m: paths[m.group(1) or m.group(2)], a) for a in argv]


def is_file_name(name: Any) -> bool:
    return (
        isinstance(name, str)
        and name not in {"", ".", ".."}
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
    )


def remove_tree(path: Path) -> None:
    """Remove a working directory, files a step made read-only included."""

    def retry(func: Callable[..., Any], target: str, _exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700)
            func(target)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


class LogStream:
    """The command's output, appended to the step's log on the Mediator while it runs (PUT
    …/log): every ``LOG_INTERVAL`` or ``LOG_CHUNK`` bytes, in order, from one thread.

    An append whose answer was lost is checked against the log's length before it is sent again,
    so a retry does not write the same bytes twice."""

    def __init__(
        self, link: Link, run_id: str, seq: int, log: BoundLogger, rng: random.Random
    ) -> None:
        self.link, self.run_id, self.seq, self.log = link, run_id, seq, log
        self._retry = Backoff(*backoff.LOG_APPEND, rng=rng)
        self._buf = bytearray()
        self._cond = threading.Condition()
        self._closed = False
        self._gone = False  # the run is finished (410) or unknown: nothing more is taken
        self._dropped = 0
        self._length: int | None = None  # the log's length on the Mediator, once known
        self.sent = 0
        self._thread = threading.Thread(target=self._send_loop, name="agent-log", daemon=True)
        self._thread.start()

    def write(self, data: bytes) -> None:
        with self._cond:
            if self._gone:
                return
            if len(self._buf) + len(data) > LOG_PENDING_LIMIT:
                self._dropped += len(data)
                return
            if self._dropped:
                note = f"\n[mediator agent: {self._dropped} bytes of output were dropped]\n"
                self._buf += note.encode()
                self._dropped = 0
            self._buf += data
            if len(self._buf) >= LOG_CHUNK:
                self._cond.notify()

    def note(self, text: str) -> None:
        """A line of the agent's own in the step's log (why it stopped the command, ...)."""
        self.write(f"\n[mediator agent: {text}]\n".encode())

    def close(self, timeout: float = 30.0) -> None:
        """Send what is left and stop (at most ``timeout`` seconds)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    def _send_loop(self) -> None:
        self._length = self._current_length()
        failures = 0
        while True:
            with self._cond:
                if failures:  # the Mediator did not take the last append: back off
                    self._cond.wait(self._retry.next_delay())
                elif not self._closed and len(self._buf) < LOG_CHUNK:
                    self._cond.wait(LOG_INTERVAL)
                chunk = bytes(self._buf[:LOG_CHUNK])
                closing = self._closed
            if chunk:
                if self._send(chunk):
                    failures = 0
                    self._retry.reset()
                    with self._cond:
                        del self._buf[: len(chunk)]
                else:
                    failures += 1
                    if closing and failures >= UPLOAD_TRIES:
                        self.log.warning("step log not fully delivered", pending=len(self._buf))
                        return
            with self._cond:
                if self._gone or (self._closed and not self._buf):
                    return

    def _current_length(self) -> int | None:
        try:
            ans = self.link.call(
                "GET", f"/v1/runs/{segment(self.run_id)}/steps/{self.seq}/log?from=999999999999"
            )
        except Unreachable:
            return None
        text = ans.header("X-Enode-Log-Bytes")
        return int(text) if ans.ok and text and text.isdigit() else None

    def _send(self, chunk: bytes) -> bool:
        """True when the chunk is in the log (or can never be: it is dropped)."""
        try:
            ans = self.link.append_log(self.run_id, self.seq, chunk)
        except Unreachable as exc:
            # The append may have landed with its answer lost: the log's length tells.
            before = self._length
            after = self._current_length()
            if before is not None and after == before + len(chunk):
                self._length = after
                self.sent += len(chunk)
                return True
            self.log.warning("step log append failed; retrying", error=str(exc))
            return False
        if ans.ok:
            total = ans.header("X-Enode-Log-Bytes")
            self._length = int(total) if total and total.isdigit() else None
            self.sent += len(chunk)
            return True
        if ans.status in (404, 409, 410):
            self.log.info("step log no longer taken", status=ans.status, reason=ans.reason())
            with self._cond:
                self._gone = True
                self._buf.clear()
            return True
        if ans.refused:
            self.log.warning("step log append refused", status=ans.status, reason=ans.reason())
            return True
        self.log.warning("step log append failed; retrying", status=ans.status)
        return False


class StepRunner:
    def __init__(
        self,
        cfg: AgentConfig,
        link: Link,
        leases: HeldLeases,
        log: BoundLogger,
        stop: threading.Event,
        rng: random.Random | None = None,
    ) -> None:
        self.cfg, self.link, self.leases, self.log, self.stop = cfg, link, leases, log, stop
        self.rng = rng or random.Random()

    # ------------------------------------------------------------ the whole step

    def run(self, step: dict[str, Any], nonce: str | None) -> StepOutcome:
        run_id, seq = step["run_id"], step["seq"]
        result: dict[str, Any] = {"node": self.cfg.node_id, "produced": []}
        if nonce:
            result["nonce"] = nonce
        base = self.cfg.work_dir or Path(tempfile.gettempdir())
        try:
            base.mkdir(parents=True, exist_ok=True)
            workdir = Path(
                tempfile.mkdtemp(prefix=f"{_safe(run_id)}-{seq:02d}-", dir=base)
            ).resolve()
        except OSError as exc:
            result["error"] = f"cannot create a working directory in {base}: {exc.strerror}"
            return StepOutcome(result)
        stream = LogStream(self.link, run_id, seq, self.log, self.rng)
        outcome = StepOutcome(result, workdir)
        out_dir = workdir / "out"
        try:
            paths = self._prepare(step, workdir)
            argv, env = self._command(step, workdir, paths)
            self._execute(step, argv, env, paths, stream, outcome)
        except (StepError, OSError) as exc:
            reason = str(exc) if isinstance(exc, StepError) else f"node agent: {exc}"
            self.log.warning("step cannot run", reason=reason)
            stream.note(reason)
            result["error"] = reason
        finally:
            stream.close()
        if "error" not in result:
            outcome.produced = self._upload(step, out_dir)
            result["produced"] = outcome.produced
        return outcome

    # ------------------------------------------------------------ before

    def _prepare(self, step: dict[str, Any], workdir: Path) -> dict[str, str]:
        in_dir, out_dir, cwd = workdir / "in", workdir / "out", workdir / "work"
        for d in (in_dir, out_dir, cwd):
            d.mkdir()
        wanted = (step.get("in") or {}).get("from") or []
        for name in wanted:
            if not is_file_name(name):
                raise StepError(f"in.from names {name!r}, which cannot be a file of $IN")
            data = self._fetch(step["run_id"], name)
            if data is None:
                # An input no step produced is absent, not a failure: a branch not taken may
                # have been meant to make it; the command sees that it is missing.
                self.log.info("input not produced in this run; left out of $IN", name=name)
                continue
            (in_dir / name).write_bytes(data)
        if wanted:
            self.log.info("inputs downloaded", names=sorted(os.listdir(in_dir)))
        return {"IN": str(in_dir), "OUT": str(out_dir), "CWD": str(cwd)}

    def _fetch(self, run_id: str, name: str) -> bytes | None:
        retry = Backoff(*backoff.TRANSFER, rng=self.rng)
        for attempt in range(UPLOAD_TRIES):
            try:
                ans = self.link.get_blob(run_id, name)
            except Unreachable as exc:
                problem = str(exc)
            else:
                if ans.status == 200:
                    return ans.body
                if ans.status == 404:
                    return None
                problem = f"{ans.status} {ans.reason()}"
                if ans.refused:
                    break
            if attempt + 1 < UPLOAD_TRIES and self.leases.holds(run_id):
                time.sleep(retry.next_delay())
        raise StepError(f"input {name} could not be fetched: {problem}")

    def _command(
        self, step: dict[str, Any], workdir: Path, paths: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        env: dict[str, str] = {"PATH": self.cfg.path}
        names = [n for n in step.get("env") or [] if isinstance(n, str)]
        kind = step.get("kind")
        if kind == "run":
            argv = step.get("run")
            if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                raise StepError("run must be a non-empty list of strings")
            expanded = {"IN": paths["IN"], "OUT": paths["OUT"]}
        elif kind == "agent":
            argv, expanded = self._harness(step, workdir, paths)
            names += list(self.cfg.harness.env if self.cfg.harness else ())
        else:
            raise StepError(f"this node agent runs run and agent steps, not {kind!r}")
        missing = []
        for name in names:
            if name in os.environ:
                env[name] = os.environ[name]  # PATH too, when the contract names it
            else:
                missing.append(name)
        if missing:
            self.log.info("env names not set on this node", names=missing)
        env.update(expanded)
        return expand(argv, expanded), env

    def _harness(
        self, step: dict[str, Any], workdir: Path, paths: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        harness = self.cfg.harness
        if harness is None:
            raise StepError("this node has no harness for agent steps (harness: in its config)")
        params = step.get("agent") or {}
        wanted = params.get("harness") if isinstance(params, dict) else None
        if wanted and harness.name and wanted != harness.name:
            raise StepError(f"the step asks for harness {wanted!r}; this node has {harness.name!r}")
        prompt = workdir / "prompt.md"
        prompt.write_text(str((step.get("in") or {}).get("prompt") or ""), encoding="utf-8")
        described = workdir / "step.json"
        described.write_text(
            json.dumps({k: v for k, v in step.items() if k != "lease"}, indent=2), encoding="utf-8"
        )
        expanded = {
            "IN": paths["IN"],
            "OUT": paths["OUT"],
            "PROMPT": str(prompt),
            "STEP": str(described),
        }
        return list(harness.command), expanded

    # ------------------------------------------------------------ during

    def _execute(
        self,
        step: dict[str, Any],
        argv: list[str],
        env: dict[str, str],
        paths: dict[str, str],
        stream: LogStream,
        outcome: StepOutcome,
    ) -> None:
        run_id, result = step["run_id"], outcome.result
        try:
            proc = subprocess.Popen(
                argv,
                cwd=paths["CWD"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as a whole
            )
        except OSError as exc:
            raise StepError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
        self.log.info("command started", argv=argv, pid=proc.pid)
        started = time.monotonic()
        assert proc.stdout is not None
        reader = threading.Thread(
            target=_pump, args=(proc.stdout.fileno(), stream), name="agent-output", daemon=True
        )
        reader.start()
        kill_at: float | None = None
        while True:
            try:
                proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if outcome.stopped is None:
                if not self.leases.holds(run_id):
                    outcome.stopped = (
                        f"the lease of {run_id} ended (cancelled, released or expired)"
                    )
                elif self.stop.is_set():
                    outcome.stopped = "the node agent was stopped"
                if outcome.stopped is not None:
                    self.log.warning("stopping the command", why=outcome.stopped, pid=proc.pid)
                    stream.note(f"stopped: {outcome.stopped}")
                    _signal_group(proc.pid, signal.SIGTERM)
                    kill_at = time.monotonic() + self.cfg.kill_after_seconds
            elif kill_at is not None and time.monotonic() >= kill_at:
                self.log.warning("the command outlived its terminate; killing it", pid=proc.pid)
                _signal_group(proc.pid, signal.SIGKILL)
                kill_at = None
        # Children left behind would hold the output open: a step's processes end with it.
        reader.join(DRAIN_OUTPUT_SECONDS)
        if reader.is_alive() or outcome.stopped is not None:
            _signal_group(proc.pid, signal.SIGKILL)
            reader.join(DRAIN_OUTPUT_SECONDS)
        proc.stdout.close()
        took = round(time.monotonic() - started, 3)
        code = proc.returncode
        if outcome.stopped is not None:
            result["error"] = f"stopped: {outcome.stopped}"
            self.log.warning("command stopped", why=outcome.stopped, seconds=took)
        elif code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            result["error"] = f"the command was ended by signal {name}"
            self.log.warning("command ended by a signal", signal=name, seconds=took)
        else:
            result["exit_code"] = code
            self.log.info("command exited", exit_code=code, seconds=took)

    # ------------------------------------------------------------ after

    def _upload(self, step: dict[str, Any], out_dir: Path) -> list[str]:
        """Every file of ``$OUT``, declared in ``out`` or not
        (docs/api.md#put-v1runsrun_idstepsseqblobname--upload-an-artifact): the names the Mediator
        took."""
        run_id, seq = step["run_id"], step["seq"]
        produced: list[str] = []
        for entry in sorted(out_dir.iterdir()):
            name = entry.name
            if entry.is_symlink() or not entry.is_file():
                self.log.warning("not uploaded: only plain files of $OUT are artifacts", name=name)
                continue
            ans = self._put(run_id, seq, name, entry)
            if ans is None:
                continue
            if ans.ok:
                produced.append(name)
            elif ans.status in (404, 409, 410):
                # 409: the step is no longer claimed by this node
                # (docs/security.md#runs-records-and-uploads), 410: its run ended.
                self.log.warning("the step takes no more blobs", status=ans.status)
                break
            else:
                self.log.warning("blob refused", name=name, status=ans.status, reason=ans.reason())
        if produced:
            self.log.info("outputs uploaded", names=produced)
        return produced

    def _put(self, run_id: str, seq: int, name: str, path: Path) -> Answer | None:
        retry = Backoff(*backoff.TRANSFER, rng=self.rng)
        for attempt in range(UPLOAD_TRIES):
            try:
                with path.open("rb") as body:
                    ans = self.link.put_blob(
                        run_id, seq, name, body, os.fstat(body.fileno()).st_size
                    )
            except Unreachable as exc:
                problem = str(exc)
            except OSError as exc:
                self.log.warning("cannot read an output", name=name, error=exc.strerror)
                return None
            else:
                if ans.status < 500:
                    return ans
                problem = f"{ans.status} {ans.reason()}"
            if attempt + 1 < UPLOAD_TRIES and self.leases.holds(run_id):
                time.sleep(retry.next_delay())
            else:
                break
        self.log.warning("blob not delivered", name=name, error=problem)
        return None


def _pump(fd: int, stream: LogStream) -> None:
    while True:
        try:
            data = os.read(fd, LOG_CHUNK)
        except OSError:
            return
        if not data:
            return
        stream.write(data)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _safe(run_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", run_id)[:80]
