"""Fault points for crash tests: a process told to die at a named point dies there, at once.

``MEDIATOR_FAULT=<point>`` makes :func:`fault` called with that point kill its own process with
SIGKILL: no ``finally``, no rollback by Python, no after-commit work; PostgreSQL rolls back the
open transaction and drops the session locks when the connection goes, as after a real crash.
``MEDIATOR_FAULT=<point>@<path>`` dies at most once across every process sharing the variable
(all gunicorn workers and their replacements): only the process that creates ``<path>`` dies, so
the worker that replaces it runs through the same point. The file holds the pid that died.

The points: ``submit.after_insert`` (a RUNNING run's row written, nothing else), ``submit.queued``
(a QUEUED run and its Record written, not committed), ``promote.before_commit``,
``result.before_commit`` (every effect of a result or an answer, not committed),
``result.after_commit`` and ``cancel.after_commit`` (committed, nothing after it done: no verdict,
seal or wake), ``cancel.before_commit``.

The variable is read once, at import. Unset (production), :func:`fault` is one comparison.
"""

from __future__ import annotations

import os
import signal

_POINT, _, _ONCE = os.environ.get("MEDIATOR_FAULT", "").partition("@")


def fault(point: str) -> None:
    """Die here by SIGKILL when ``MEDIATOR_FAULT`` names ``point`` (see the module docstring)."""
    if not _POINT or point != _POINT:
        return
    if _ONCE:
        try:
            fd = os.open(_ONCE, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return  # another process died here already
        os.write(fd, str(os.getpid()).encode())  # which process died, for the test to see
        os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
