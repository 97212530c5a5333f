"""Waiting claims of one process, woken by PostgreSQL LISTEN/NOTIFY
(docs/design.md#claims-and-the-long-poll): the channel, its payload, the listening side and the
process's notifier (:class:`ClaimNotifier`).

One listener thread per process, started on the first claim, on a connection of its own. A
waiting claim registers a :class:`Ticket` under its node before it looks in the database (so a
notification between the look and the wait is not lost) and waits on it without holding any
connection. Notifications are not durable: after (re)connecting the listener wakes every waiter
at once. A lost notification is caught by the process's one safety-net query
(docs/design.md#claims-and-the-long-poll): every ``claim.recheck_seconds`` the listener thread asks,
in one statement for all the nodes whose claims wait in this process, which of them have a claimable
step, and wakes only those claims. A waiting claim thus does no database work of its own between its
first look and its end unless something concerns its node.

One caller cannot hold the server (docs/security.md#input-and-load): per process, one waiting claim
per node id. A claim that registers supersedes the claims of its node that have waited
``SUPERSEDE_AFTER_SECONDS`` or longer: they answer 204 at once, unless they have already taken a
step (they return it). A younger one waits beside the newer claim. A caller can thus hold at most
the claims it sent in the last second for a node, however many it sends in all.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import Connection

from app.config import Config
from app.db import bounded_connect, conninfo
from app.logs import log
from app.store.clock import notify_each

CLAIM_CHANNEL = "mediator_claims"
STOP_CHECK_SECONDS = 0.2
# An older claim this old gives way to a newer one (docs/security.md#input-and-load).
SUPERSEDE_AFTER_SECONDS = 1.0
_MAX_PAYLOAD = 7000  # PostgreSQL's limit is 8000 bytes; "*" wakes every waiting claim


def claim_payload(nodes: set[str]) -> str:
    """The NOTIFY payload naming these nodes: far below PostgreSQL's 8000-byte limit, or ``"*"``
    (every waiting claim looks again) when the list would not fit
    (docs/design.md#claims-and-the-long-poll)."""
    payload = json.dumps(sorted(nodes))
    return payload if len(payload.encode()) <= _MAX_PAYLOAD else '"*"'


def claim_payloads(requests: list[set[str]]) -> list[str]:
    """The payloads of several requests' notifications sent together: ``"*"`` alone when one of
    them was ``"*"`` by itself (:func:`claim_payload`), else their nodes in as few payloads as
    fit the bound, so that merging never turns named nodes into ``"*"``."""
    nodes: set[str] = set()
    for named in requests:
        payload = claim_payload(named)
        if payload == '"*"':
            return [payload]
        nodes |= named
    payloads: list[str] = []
    part: list[str] = []
    size = 2  # the brackets
    for node in sorted(nodes):
        more = len(json.dumps(node).encode()) + (2 if part else 0)  # ", " between two
        if part and size + more > _MAX_PAYLOAD:
            payloads.append(json.dumps(part))
            part, size, more = [], 2, more - 2
        part.append(node)
        size += more
    if part:
        payloads.append(json.dumps(part))
    return payloads


def claim_nodes(payload: str) -> list[str] | None:
    """The nodes a payload names; None: every waiting claim (``"*"`` or anything unreadable)."""
    try:
        nodes = json.loads(payload)
    except ValueError:
        return None
    if nodes == "*" or not isinstance(nodes, list):
        return None
    return [str(n) for n in nodes]


class Ticket(threading.Event):
    """One waiting claim of this process: set to wake it. ``started``: when the claim came, by
    this process's monotonic clock (the rule is process-local, never database time);
    ``superseded``: a newer claim of its node came once it was old enough
    (docs/security.md#input-and-load); ``looks``: how many times the claim has looked in the
    database."""

    def __init__(self) -> None:
        super().__init__()
        self.started = time.monotonic()
        self.superseded = False
        self.looks = 0


# Given the nodes whose claims wait in this process: those of them with a claimable step.
SafetyNet = Callable[[list[str]], set[str]]


class ServerSwitched(Exception):
    """The listener's session no longer reaches the primary: it reconnects."""


class ClaimListener:
    def __init__(
        self,
        config: Config,
        safety_net: SafetyNet | None = None,
        deaths: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self.safety_net = safety_net
        # How many dead connections this process has met (Database.deaths): when it moves, the
        # listener's own session is closed and opened again, on the primary.
        self._deaths = deaths or (lambda: 0)
        self._recheck = float(config["claim.recheck_seconds"])
        self._passes = threading.Condition()
        self.passes = 0  # safety-net passes run by this process's listener
        self._lock = threading.Lock()
        self._waiters: dict[str, set[Ticket]] = defaultdict(set)
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self._stop = threading.Event()
        self.connected = threading.Event()
        # At most half the pool looks for claimable steps at once: hundreds of claims that look
        # together (a fleet restarted, every claim re-polling after the same window) would
        # otherwise all be runnable at once, take every pooled connection and the interpreter's
        # lock in turn, and hold up every other request of the process for seconds. Waiting
        # here costs neither (a waiting claim holds no connection:
        # docs/design.md#claims-and-the-long-poll).
        self._looks = threading.BoundedSemaphore(max(1, config["database.pool_size"] // 2))
        self._look_timeout = float(config["database.pool_timeout"])

    def register(self, node_id: str) -> Ticket:
        """A claim of ``node_id`` arrives: its ticket, registered for the whole claim. The node's
        claims that waited ``SUPERSEDE_AFTER_SECONDS`` or more are superseded and woken."""
        self._ensure_started()
        ticket = Ticket()
        with self._lock:
            waiting = self._waiters[node_id]
            old = [t for t in waiting if ticket.started - t.started >= SUPERSEDE_AFTER_SECONDS]
            for t in old:
                t.superseded = True
            waiting.add(ticket)
        for t in old:
            t.set()
        return ticket

    def unregister(self, node_id: str, ticket: Ticket) -> None:
        with self._lock:
            waiting = self._waiters.get(node_id)
            if waiting is not None:
                waiting.discard(ticket)
                if not waiting:
                    del self._waiters[node_id]

    @contextmanager
    def looking(self) -> Iterator[None]:
        """One claim's look in the database, among at most half the pool's size at once. A look
        that waits longer than the pool's time-out goes ahead anyway (the pool's own time-out,
        a 503, then decides), so a claim is never held up for longer than a request would be."""
        got = self._looks.acquire(timeout=self._look_timeout)
        try:
            yield
        finally:
            if got:
                self._looks.release()

    def waiting(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._waiters.values())

    def looks(self) -> int:
        """Database looks of the claims waiting now, in all."""
        with self._lock:
            return sum(t.looks for ts in self._waiters.values() for t in ts)

    def await_passes(self, count: int, timeout: float) -> bool:
        """Until this process's safety net has run ``count`` passes in all (False: timed out)."""
        with self._passes:
            return self._passes.wait_for(lambda: self.passes >= count, timeout)

    def ages(self, node_id: str) -> list[float]:
        """Seconds each waiting claim of ``node_id`` has waited, oldest first."""
        now = time.monotonic()
        with self._lock:
            started = sorted(t.started for t in self._waiters.get(node_id, ()))
        return [now - s for s in started]

    def nudge_claims(self, nodes: list[str] | None) -> None:
        """Nudge the claims of these nodes (None: every waiting claim)."""
        with self._lock:
            if nodes is None:
                tickets = [t for ts in self._waiters.values() for t in ts]
            else:
                tickets = [t for n in nodes for t in self._waiters.get(n, ())]
        for t in tickets:
            t.set()

    def _ensure_started(self) -> None:
        if self._pid == os.getpid() and self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._pid == os.getpid() and self._thread is not None and self._thread.is_alive():
                return
            self._pid = os.getpid()
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="mediator-claim-listener", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                deaths = self._deaths()
                with bounded_connect(
                    conninfo(self.config["database.url"]),
                    deadline=self.config["gate.idle_seconds"],
                    autocommit=True,
                    application_name="mediator-listener",
                ) as conn:
                    conn.execute(f"LISTEN {CLAIM_CHANNEL}")
                    self.connected.set()
                    backoff = 0.2
                    self.nudge_claims(None)  # anything notified while we were away: look again now
                    next_pass = time.monotonic() + self._recheck
                    while not self._stop.is_set():
                        # A short turn so close() (a worker shutting down) ends the thread
                        # promptly; an idle turn costs no query.
                        for note in conn.notifies(timeout=STOP_CHECK_SECONDS):
                            self._handle(note.payload)
                        if self._deaths() != deaths:
                            raise ServerSwitched("a connection of this process was found dead")
                        if time.monotonic() >= next_pass:
                            # A server demoted to a standby keeps this session, and LISTEN
                            # there hears nothing the primary notifies.
                            if conn.execute("SELECT pg_is_in_recovery()").fetchone() != (False,):
                                raise ServerSwitched("the listener's server is a standby")
                            self._safety_net_pass()
                            next_pass = time.monotonic() + self._recheck
            except Exception as exc:
                self.connected.clear()
                if self._stop.is_set():
                    break
                log.warning("claim listener reconnecting", error=type(exc).__name__)
                self._stop.wait(backoff)
                # At most a second between tries: a switch's new primary is heard soon.
                backoff = min(backoff * 2, 1.0)
        self.connected.clear()

    def _handle(self, payload: str) -> None:
        self.nudge_claims(claim_nodes(payload))

    def _safety_net_pass(self) -> None:
        """One query for all the claims waiting in this process, never one per claim
        (docs/design.md#claims-and-the-long-poll); only the claims of nodes it finds claimable look
        again. A failed pass is logged and the next one comes a period later (the claims' own
        deadlines still end them)."""
        with self._lock:
            nodes = sorted(self._waiters)
        if nodes and self.safety_net is not None:
            try:
                found = self.safety_net(nodes)
            except Exception as exc:
                log.warning("claim safety net failed", error=type(exc).__name__)
            else:
                if found:
                    self.nudge_claims(sorted(found))
        with self._passes:
            self.passes += 1
            self._passes.notify_all()

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and self._pid == os.getpid():
            thread.join(timeout=3)


class ClaimNotifier:
    """The claim notifications of one process (docs/design.md#claims-and-the-long-poll), sent by one
    thread on a connection of its own: a request hands its nodes over after its commit and goes on;
    it neither waits for the NOTIFY nor takes a pooled connection for it. What several requests
    handed over while the thread was busy goes out together, in one statement
    (:func:`claim_payloads`). Best effort, as every notification: one that fails is logged, and the
    claims' safety net finds its steps (docs/design.md#claims-and-the-long-poll). Started on the
    first notification of the process (never across a fork)."""

    def __init__(self, connect: Callable[[], Connection]) -> None:
        self._connect = connect
        self._lock = threading.Lock()  # starting the thread
        # What requests handed over (None: stop), a queue of C's: a request's hand-over takes no
        # Python-level lock and wakes the thread without a condition's bookkeeping.
        self._queue: queue.SimpleQueue[set[str] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        # A child starts clean: its lock free, nothing of its parent's pending, no thread yet.
        forked = weakref.WeakMethod(self._forked)
        os.register_at_fork(after_in_child=lambda: _call_if_alive(forked))

    def _forked(self) -> None:
        self._lock = threading.Lock()
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._pid = None

    def send(self, nodes: set[str]) -> None:
        """After the commit that concerns these nodes: their claims may now find a step."""
        if not nodes:
            return
        thread = self._thread
        if self._pid != os.getpid() or thread is None or not thread.is_alive():
            self._start()
        self._queue.put(set(nodes))

    def _start(self) -> None:
        with self._lock:
            thread = self._thread
            if self._pid == os.getpid() and thread is not None and thread.is_alive():
                return  # another request started it meanwhile
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name="mediator-notifier", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        conn: Connection | None = None
        stopping = False
        while not stopping:
            handed = [self._queue.get()]
            while True:  # and whatever else was handed over meanwhile, in the same statement
                try:
                    handed.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stopping = None in handed
            requests = [nodes for nodes in handed if nodes is not None]
            if not requests:
                continue
            payloads = claim_payloads(requests)
            for again in (True, False):
                try:
                    if conn is None:
                        conn = self._connect()
                    notify_each(conn, CLAIM_CHANNEL, payloads)
                    break
                except Exception as exc:
                    _close(conn)
                    conn = None
                    # Once more on a new connection: the server may have ended the old one
                    # (a restart) while it was idle.
                    if not again:
                        nodes = len(set().union(*requests))
                        log.warning(
                            "claim notification failed", nodes=nodes, error=type(exc).__name__
                        )
        _close(conn)

    def close(self) -> None:
        """Send what is pending, then stop (a worker shutting down)."""
        thread = self._thread
        if thread is not None and self._pid == os.getpid():
            self._queue.put(None)
            thread.join(timeout=3)


def _call_if_alive(method: weakref.WeakMethod[Callable[[], None]]) -> None:
    bound = method()
    if bound is not None:
        bound()


def _close(conn: Connection | None) -> None:
    if conn is not None:
        try:
            conn.close()
        except Exception:
            pass
