"""Processes and ports of the tests: a port nothing listens on, the children of a process (read
from /proc), and a process stopped as systemd stops a service."""

from __future__ import annotations

import os
import socket
import subprocess
from typing import Any


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on (bound, then closed): free for a server of the
    test to bind, and refused to a client that connects."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def children_of(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (a gunicorn master's workers, say), from /proc; one
    that exited and that its parent has not reaped yet included."""
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid ...: comm may hold spaces, so split after its closing bracket
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            out.add(int(entry))
    return out


def stop(proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """SIGTERM, and SIGKILL if ``proc`` has not exited ``timeout`` seconds later; it is reaped."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
