"""Running the ``mediator`` client as a process of its own, as people and scripts do: its
environment (where the Mediator is, a token, a principal, and no client configuration file of the
machine's user), and a background command read line by line as it prints."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.apps import ROOT, TOKEN, mediator_cli

TIMEOUT = 60
# A client configuration file that does not exist: the machine's own never leaks into a test.
NO_CONFIG = "/nonexistent/mediator/client.toml"


def client_env(server: Any, **extra: str) -> dict[str, str]:
    """The client's environment: ``server``, the token and a principal in the client's own
    variables, no configuration file; an ``extra`` variable set to "" is left out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIATOR_")}
    env.pop("XDG_CONFIG_HOME", None)
    env.update(
        {
            "MEDIATOR_CLIENT_URL": server.url if server else "http://127.0.0.1:9",
            "MEDIATOR_CLIENT_TOKEN": TOKEN,
            "MEDIATOR_CLIENT_PRINCIPAL": "me@lab.test",
            "MEDIATOR_CLIENT_CONFIG": NO_CONFIG,
            **extra,
        }
    )
    return {k: v for k, v in env.items() if v != ""}


def mediator(
    server: Any, *args: str, cwd: Path = ROOT, **env: str
) -> subprocess.CompletedProcess[str]:
    """``mediator ARGS`` as a process of its own, talking to ``server``."""
    return mediator_cli(*args, env=client_env(server, **env), cwd=cwd, timeout=TIMEOUT)


def complete(server: Any, words: str, **env: str) -> subprocess.CompletedProcess[str]:
    """What bash's completion of ``words`` (the last one being typed) gets from ``mediator``."""
    return mediator(
        server,
        _MEDIATOR_COMPLETE="bash_complete",
        COMP_WORDS=words,
        COMP_CWORD=str(len(words.split(" ")) - 1),
        **env,
    )


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Running:
    """``mediator ARGS`` in the background, its stdout read line by line as it comes."""

    def __init__(self, server: Any, *args: str, **env: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.commands", *args],
            cwd=ROOT,
            env=client_env(server, **env),
            # As from a terminal: a test run started in the background (a shell without job
            # control) would hand its children SIGINT ignored, and Ctrl-C would do nothing.
            preexec_fn=_sigint_default,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._new.put(line.rstrip("\n"))
        self._new.put(None)

    def line_with(self, text: str, timeout: float = 30) -> str:
        """The first line (from now on) that holds ``text``; every line read is kept."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no line with {text!r} in {self.lines}"
            try:
                line = self._new.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, f"ended without a line with {text!r}: {self.lines}"
            self.lines.append(line)
            if text in line:
                return line

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT, as a terminal sends it."""
        self.proc.send_signal(signal.SIGINT)

    def finish(self) -> tuple[int, list[str], str]:
        code = self.proc.wait(timeout=TIMEOUT)
        self._reader.join(timeout=TIMEOUT)
        while True:
            line = self._new.get_nowait() if not self._new.empty() else None
            if line is None:
                break
            self.lines.append(line)
        assert self.proc.stderr is not None
        return code, self.lines, self.proc.stderr.read()


def write(tmp_path: Path, doc: Any, name: str = "contract.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


class CountingProxy:
    """A TCP proxy in front of a live server that counts the connections it accepts and the
    requests that pass through them (by their request lines), so a test can see how many
    connections a command opened, from the server's side of the wire."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        self.sent = bytearray()  # every byte clients sent, in order
        self.lock = threading.Lock()
        self.seen = threading.Condition(self.lock)
        threading.Thread(target=self._accept, daemon=True).start()

    def requests(self, method_and_path: bytes) -> int:
        with self.lock:
            return bytes(self.sent).count(method_and_path)

    def wait_for_requests(self, method_and_path: bytes, count: int, timeout: float = 30) -> None:
        with self.seen:
            assert self.seen.wait_for(
                lambda: bytes(self.sent).count(method_and_path) >= count, timeout
            ), f"fewer than {count} {method_and_path!r} in {bytes(self.sent)[:2000]!r}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, counted: bool) -> None:
        try:
            while data := src.recv(65536):
                if counted:
                    with self.seen:
                        self.sent += data
                        self.seen.notify_all()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()
