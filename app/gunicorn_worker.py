"""The gunicorn worker the Mediator runs in production: gunicorn's threaded worker (gthread),
whose quick shutdown cannot hang."""

from __future__ import annotations

from types import FrameType

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
