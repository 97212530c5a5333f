"""The gunicorn worker the Mediator runs in production: gunicorn's threaded worker (gthread),
whose quick shutdown cannot hang; and gunicorn's logger without a second line per request."""

from __future__ import annotations

from types import FrameType
from typing import Any

from gunicorn import glogging
from gunicorn.workers.base import Worker
from gunicorn.workers.gthread import ThreadWorker as GThreadWorker


class ThreadWorker(GThreadWorker):
    """gthread, except for what SIGINT and SIGQUIT (a quick shutdown) do in the worker.

    gunicorn's threaded worker shuts its thread pool down inside the signal handler. The handler
    runs in the main thread between two bytecodes, and that thread is the one calling
    ``ThreadPoolExecutor.submit`` for every request: ``submit`` holds the pool's lock, which is
    not reentrant, while it starts a new thread (slower on a loaded machine). A quick shutdown that
    lands there waits for that lock forever (CPython issue 121649): the worker neither exits nor
    logs "Worker exiting" until the master kills it after ``graceful_timeout``.

    This handler does the rest of gunicorn's quick exit (the ``worker_int`` hook, then
    ``SystemExit`` in the main thread) and leaves the pool alone: ``concurrent.futures`` stops
    and joins its threads when the interpreter exits, as the handler's ``shutdown(wait=False)``
    would have let them finish what they run.
    """

    def handle_quit(self, sig: int, frame: FrameType | None) -> None:
        Worker.handle_quit(self, sig, frame)


class Logger(glogging.Logger):
    """gunicorn's logger, with its access log only when ``accesslog`` names one.

    The Mediator logs every request itself, one JSON line with its route, status, run and
    duration (SPEC §15). gunicorn counts its access log as enabled whenever a ``logconfig_dict``
    is set, as ``gunicorn.conf.py`` sets one to render gunicorn's own lines as JSON: it would then
    build and write a second line for every request (a few percent of a worker's CPU under
    load)."""

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        if self.cfg.accesslog:
            super().access(resp, req, environ, request_time)
