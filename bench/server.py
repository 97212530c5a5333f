"""gunicorn serving the Mediator (or the floor app) on 127.0.0.1, started as production starts it:
``gunicorn -c gunicorn.conf.py wsgi:app``, configured by environment alone
(docs/configuration.md#where-values-come-from)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.client import Client
from bench.contracts import TOKEN
from bench.machine import ROOT, children_of, rss_kib


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """A gunicorn process group of our own; :meth:`stop` ends it (SIGTERM, then SIGKILL after a
    short grace: waiting claims would otherwise hold the graceful stop for their whole window)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        workdir: Path,
        ready_path: str = "/readyz",
    ) -> None:
        self.name = name
        self.port = free_port()
        self.log_path = workdir / f"{name}.log"
        self.env = {**os.environ, **env}
        self.env["MEDIATOR_BIND"] = f"127.0.0.1:{self.port}"
        self.argv = [a.replace("{port}", str(self.port)) for a in argv]
        self.ready_path = ready_path
        self.proc: subprocess.Popen[bytes] | None = None
        url = env.get("MEDIATOR_DATABASE_URL") or env.get("BENCH_FLOOR_DATABASE_URL") or ""
        self.database = url.rsplit("/", 1)[-1].split("?", 1)[0]  # whose backends to count

    def start(self, timeout: float = 90.0) -> Server:
        with open(self.log_path, "wb") as err:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        client = Client(self.port, timeout=5)
        while True:
            try:
                if client.get(self.ready_path).status == 200:
                    break
            except OSError:
                client.close()  # not listening yet, or a worker still starting
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"{self.name} did not become ready:\n{tail}")
            time.sleep(0.05)  # waiting for a process to bind its port: no event to await
        client.close()
        self._await_workers(deadline)
        return self

    def _await_workers(self, deadline: float) -> None:
        """Until every worker has booted (each answers /readyz once its start-up is done)."""
        want = int(self.env.get("MEDIATOR_WORKERS", "4"))
        while len(self.worker_pids()) < want and time.monotonic() < deadline:
            time.sleep(0.05)
        # Each worker runs its start-up (schema check, wake) before it serves; a few requests
        # on fresh connections reach most of them.
        for _ in range(want * 4):
            c = Client(self.port, timeout=30)
            try:
                c.get(self.ready_path)
            finally:
                c.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def worker_pids(self) -> list[int]:
        return children_of(self.pid) if self.proc is not None else []

    def pids(self) -> list[int]:
        return [self.pid, *self.worker_pids()]

    @property
    def records(self) -> Path:
        """The Mediator's Records root (``MEDIATOR_RECORDS_ROOT``), where the floor of the same
        line opens its Records too."""
        return Path(self.env["MEDIATOR_RECORDS_ROOT"])

    def rss_kib(self) -> int:
        return sum(rss_kib(p) for p in self.pids())

    def log_lines(self) -> Iterator[dict[str, Any]]:
        """The JSON lines of the server's log (the Mediator logs one JSON object a line)."""
        with open(self.log_path, errors="replace") as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        yield json.loads(line)
                    except ValueError:
                        continue

    def stop(self, grace: float = 3.0) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # our own group: the master and its workers
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def mediator(
    db_url: str,
    workdir: Path,
    *,
    workers: int,
    threads: int | None,
    log_level: str,
    extra: dict[str, str] | None = None,
) -> Server:
    env = {
        "MEDIATOR_DATABASE_URL": db_url,
        "MEDIATOR_RECORDS_ROOT": str(workdir / "records"),
        "MEDIATOR_TOKEN": TOKEN,
        "MEDIATOR_LOG_LEVEL": log_level,
        "MEDIATOR_LOG_FORMAT": "json",
        "MEDIATOR_WORKERS": str(workers),
        **(extra or {}),
    }
    if threads is not None:
        env["MEDIATOR_THREADS"] = str(threads)
    argv = [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"]
    return Server("mediator", argv, env, workdir)


class Reaper:
    """``mediator reaper`` beside a server, as production runs it (its own process, a pass every
    ``lease.renew_seconds``), on the server's environment; its CPU counts as the server's."""

    def __init__(self, server: Server, workdir: Path) -> None:
        self.env = {k: v for k, v in server.env.items() if k != "MEDIATOR_BIND"}
        self.log_path = workdir / "reaper.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Reaper:
        command = str(Path(sys.executable).with_name("mediator"))
        with open(self.log_path, "wb") as err:
            self.proc = subprocess.Popen(
                [command, "reaper"],
                cwd=ROOT,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        self.proc.terminate()  # SIGTERM: the reaper ends after its pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.returncode not in (0, -signal.SIGTERM):
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the reaper exited with {self.proc.returncode}:\n{tail}")
        self.proc = None


def floor(
    db_url: str, workdir: Path, *, workers: int, threads: int, sql: Path, records: Path
) -> Server:
    """The stack's floor (``bench/floor.py``): a bare Flask app that parses the body, runs the
    statements of ``sql`` (``bench/floor.sql`` or ``bench/floor_pinned.sql``) in one transaction
    through psycopg 3 and opens the run's Record under ``records`` (the Mediator's Records root
    of the same line, so that both write on one file system, in one directory), under the same
    gunicorn settings."""
    records.mkdir(parents=True, exist_ok=True)
    env = {
        "BENCH_FLOOR_DATABASE_URL": db_url,
        "BENCH_FLOOR_SQL": str(sql),
        "BENCH_FLOOR_RECORDS": str(records),
        "MEDIATOR_WORKERS": str(workers),
    }
    # An empty settings file of its own: gunicorn would otherwise read ./gunicorn.conf.py.
    settings = workdir / "floor.conf.py"
    settings.write_text("# the floor's settings are all on the command line\n")
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "--config",
        str(settings),
        "--workers",
        str(workers),
        "--worker-class",
        "gthread",
        "--threads",
        str(threads),
        "--worker-connections",  # as gunicorn.conf.py: idle connections kept alive
        str(2 * threads),
        "--keep-alive",
        "75",
        "--bind",
        "127.0.0.1:{port}",
        "bench.floor:app",
    ]
    return Server("floor", argv, env, workdir, ready_path="/readyz")
