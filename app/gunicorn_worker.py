"""The gunicorn worker the Mediator runs in production: gunicorn's threaded worker (gthread),
whose quick shutdown cannot hang and whose workers share new connections out evenly; and
gunicorn's logger without a second line per request."""

from __future__ import annotations

import mmap
import select
import selectors
import struct
import time
from types import FrameType
from typing import Any

from gunicorn import glogging
from gunicorn.workers.base import Worker
from gunicorn.workers.gthread import ThreadWorker as GThreadWorker


class ConnectionBoard:
    """How many connections each worker of this gunicorn holds open, in memory every worker
    shares (an anonymous shared mapping made when gunicorn imports this module, before it forks
    any worker). Each worker writes only its own slot, its count and when it wrote it; a slot
    not written for ``STALE`` seconds belongs to no live worker (a worker's main loop writes at
    least once a second). Only a hint: two workers that share a slot (``age`` modulo ``SLOTS``)
    or a torn read cost some balance, never a connection."""

    SLOTS = 64
    STALE = 2.0  # seconds
    _ENTRY = struct.Struct("qd")  # open connections, time.monotonic() of the write

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, self.SLOTS * self._ENTRY.size)

    def publish(self, slot: int, connections: int, now: float) -> None:
        self._ENTRY.pack_into(self._map, slot * self._ENTRY.size, connections, now)

    def leave(self, slot: int) -> None:
        self._ENTRY.pack_into(self._map, slot * self._ENTRY.size, 0, 0.0)

    def fewest_elsewhere(self, slot: int, now: float) -> int | None:
        """The fewest connections any other live worker holds; None when there is none."""
        fewest = None
        for other in range(self.SLOTS):
            if other == slot:
                continue
            connections, written = self._ENTRY.unpack_from(self._map, other * self._ENTRY.size)
            if written and now - written < self.STALE and (fewest is None or connections < fewest):
                fewest = connections
        return fewest


BOARD = ConnectionBoard()


class ThreadWorker(GThreadWorker):
    """gthread, with new connections shared out evenly among the workers, and a quick shutdown
    (SIGINT, SIGQUIT) that cannot hang.

    *Even connections.* Every worker's poller wakes for each new connection and the first to call
    ``accept`` takes it; a kept-alive connection then stays with that worker for good (a client's,
    nginx's upstream keep-alive, an agent's). Left to that race, 16 clients' connections were
    seen spread 10/4/1/1 over 4 workers: the worker of 10 ran 10 requests at once on its one
    interpreter lock while others idled, and those clients saw the slowest answers. Here a worker
    that holds more than ``SLACK`` connections more than another live worker leaves a new
    connection to the others for up to ``DEFER`` seconds, looking again every ``RECHECK`` seconds
    (its listening sockets out of its poller meanwhile); past that it takes the connection itself,
    so a worker too slow to accept costs a connection at most ``DEFER`` of waiting, never the
    connection. The slack spares clients that open a connection a request (every worker wakes
    for each, and deferring at every difference of one cost them 4 % of their rate).

    *A kept-alive connection's next request in the same thread.* gthread hands a connection back
    to the worker's main thread after each answer, which puts it in its poller, wakes on the next
    request and hands it to a pool thread: two more turns for the interpreter lock of a busy
    worker. A client that sends its next request within ``LINGER`` seconds (a closed loop, an
    agent reporting a step, nginx's keep-alive) is served by the thread that answered it.
    """

    DEFER = 0.1  # seconds a worker with more connections leaves a new one to the others
    RECHECK = 0.002  # seconds between two looks while it does
    SLACK = 1  # connections more than the fewest elsewhere that a worker still takes at once
    LINGER = 0.005  # seconds a thread waits for a kept-alive connection's next request

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slot = self.age % ConnectionBoard.SLOTS
        self._listening = False  # our listening sockets in the poller
        self._paused_until = 0.0  # deferring a new connection until then
        self._deferred_since = 0.0  # the first look that left it to the others

    def set_accept_enabled(self, enabled: bool) -> None:
        # gunicorn's: accepting while under worker_connections, not while stopping.
        self._accepting = enabled
        self._listen(enabled and not self._paused_until)

    def _listen(self, on: bool) -> None:
        if on == self._listening:
            return
        for listener in self.sockets:
            if on:
                listener.setblocking(False)
                self.poller.register(listener, selectors.EVENT_READ, self.accept)
            else:
                self.poller.unregister(listener)
        self._listening = on

    def accept(self, listener: Any) -> None:
        if self._leave_to_others(time.monotonic()):
            return
        super().accept(listener)

    def _leave_to_others(self, now: float) -> bool:
        fewest = BOARD.fewest_elsewhere(self.slot, now)
        if fewest is None or self.nr_conns <= fewest + self.SLACK:
            self._deferred_since = 0.0
            return False
        if not self._deferred_since or now - self._deferred_since > 2 * self.DEFER:
            self._deferred_since = now  # a new connection waiting (an earlier one went elsewhere)
        if now - self._deferred_since >= self.DEFER:
            self._deferred_since = 0.0
            return False
        self._paused_until = now + self.RECHECK
        self._listen(False)
        return True

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        # gunicorn's main loop calls this once a turn (at least once a second).
        now = time.monotonic()
        if self._accepting:
            BOARD.publish(self.slot, self.nr_conns, now)
        else:
            BOARD.leave(self.slot)  # full, or stopping: takes no new connection
        if self._paused_until:
            if now >= self._paused_until:
                self._paused_until = 0.0
                self._listen(self._accepting)
                timeout = 0.0  # look at the waiting connection now
            else:
                timeout = min(timeout, self._paused_until - now)
        super().wait_for_and_dispatch_events(timeout)

    def handle(self, conn: Any) -> Any:
        keep = super().handle(conn)
        # True: answered, the connection kept alive (False: closed; gthread's _DEFER: no request
        # yet). Bytes already read past the answer are the next request's.
        while keep is True and self.alive and not getattr(conn, "is_http2", False):
            if not conn.parser.unreader.buf.getvalue() and not _readable(conn.sock, self.LINGER):
                break
            keep = super().handle(conn)
        return keep

    def run(self) -> None:
        try:
            super().run()
        finally:
            BOARD.leave(self.slot)

    def handle_quit(self, sig: int, frame: FrameType | None) -> None:
        """gthread's quick shutdown, except for what it does in the worker.

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
        Worker.handle_quit(self, sig, frame)


def _readable(sock: Any, seconds: float) -> bool:
    """Whether ``sock`` has bytes to read (or was closed) within ``seconds``."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    try:
        return bool(poller.poll(seconds * 1000))
    except OSError:
        return False


class Logger(glogging.Logger):
    """gunicorn's logger, with its access log only when ``accesslog`` names one.

    The Mediator logs every request itself, one JSON line with its route, status, run and
    duration (docs/metrics.md#logs). gunicorn counts its access log as enabled whenever a
    ``logconfig_dict`` is set, as ``gunicorn.conf.py`` sets one to render gunicorn's own lines as
    JSON: it would then build and write a second line for every request (a few percent of a worker's
    CPU under load)."""

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        if self.cfg.accesslog:
            super().access(resp, req, environ, request_time)
