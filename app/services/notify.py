"""After-commit side effects: what a transaction leaves to do (:class:`AfterCommit`), claim
notifications (NOTIFY) and webhooks.

Nothing here runs inside a business transaction: a NOTIFY serialises commits in PostgreSQL, a
webhook may be slow, and a wake inside the freeing transaction would wait on its own rows.
(:func:`commit_notifying` ends the caller's transaction first, and its NOTIFY runs after the
commit in a transaction of its own.)
"""

from __future__ import annotations

import copy
import json
import os
import queue
import re
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import Connection as SAConnection

from app.context import Context
from app.httpclient import Connection
from app.listener import CLAIM_CHANNEL, claim_payloads
from app.logs import log
from app.metrics import WEBHOOKS_DROPPED
from app.store.clock import commit_and_notify


def commit_notifying(conn: SAConnection, nodes: set[str]) -> None:
    """Commit, and notify the claims of ``nodes`` in a transaction of its own right after the
    commit, in the commit's round trip: no hand-over to the notifier and no round trip of its
    own. A notification that fails is logged (the commit stands; the claims' safety net finds
    the steps, docs/design.md#claims-and-the-long-poll)."""
    error = commit_and_notify(conn, CLAIM_CHANNEL, claim_payloads([nodes]))
    if error is not None:
        log.warning("claim notification failed", nodes=len(nodes), error=type(error).__name__)


def notify_claimable(ctx: Context, nodes: set[str]) -> None:
    """One NOTIFY naming the nodes whose claims may now find a step, handed to the process's
    notifier, which sends it (with what other requests handed over meanwhile) on its own
    connection (best effort: a lost one is caught by the process's safety-net pass,
    docs/design.md#claims-and-the-long-poll)."""
    if not nodes:
        return
    try:
        ctx.notifier.send(nodes)
    except Exception:
        log.warning("claim notification failed", nodes=len(nodes))


def webhook_origin(url: str) -> str:
    """The scheme and host (and port) of a webhook URL: all a log line may name of it
    (docs/security.md#outgoing-webhooks). Its path and query often carry the receiver's secret, and
    so may its user info."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return "(not a URL)"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


class _Deadline:
    """The time left of one delivery: every blocking step of it (connect, TLS handshake, send, each
    read) waits at most that long, so an endpoint that answers a byte at a time cannot stretch a
    delivery past it, as it could a timeout that each byte starts afresh."""

    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + seconds

    def left(self) -> float:
        remaining = self._end - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("webhook deadline passed")
        return remaining


_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([0-9]{3})[ \r]")
_MAX_STATUS_LINE = 1024


def _deliver(url: str, data: bytes, seconds: float) -> int:
    """POST ``data`` to ``url`` and return the status of the answer, all within ``seconds``.

    Nothing but the status line is read, and nothing is followed: a redirect is just a status
    here, and no proxy variable of the environment is consulted (docs/security.md#outgoing-webhooks)
    — a webhook goes to the host its URL names, or nowhere."""
    deadline = _Deadline(seconds)
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError("not an http:// or https:// URL")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    # The origin only: the path and query go as they are (the receiver's secret may be in them).
    conn = Connection(
        webhook_origin(url),
        timeout=seconds,
        headers={"User-Agent": "mediator", "Content-Type": "application/json"},
        keep_alive=False,
        ssl_context=ssl.create_default_context(),
    )
    sock = conn.send("POST", target, body=data, timeout=deadline.left)
    try:
        answer = b""
        while b"\n" not in answer and len(answer) < _MAX_STATUS_LINE:
            sock.settimeout(deadline.left())
            chunk = sock.recv(_MAX_STATUS_LINE)
            if not chunk:
                raise ConnectionError("the endpoint closed the connection without an answer")
            answer += chunk
    finally:
        sock.close()
    status = _STATUS_LINE.match(answer)
    if status is None:
        raise ConnectionError("the endpoint's answer is not HTTP")
    return int(status.group(1))


def _post(url: str, body: dict[str, Any], timeout: float) -> None:
    """One delivery, best effort, within ``timeout`` seconds in all; a failure is a log line."""
    # ``event`` is the log line's own message in structlog: the webhook's is ``webhook``.
    about = {"url": webhook_origin(url), "webhook": body.get("event")}
    try:
        status = _deliver(url, json.dumps(body).encode(), timeout)
    except Exception as exc:
        log.warning("webhook failed", **about, error=type(exc).__name__)
        return
    if not 200 <= status < 300:
        log.warning("webhook failed", **about, status=status)  # a redirect included: not followed


DEFAULT_QUEUE_SIZE = 1000  # the default of ``notify.queue_size``
SENDERS = 4
# The most one delivery may take, from connecting to the status line of the answer
# (docs/security.md#outgoing-webhooks).
POST_TIMEOUT_SECONDS = 3.0  # the default of ``notify.timeout_seconds``
DROP_LOG_EVERY_SECONDS = 10.0


class WebhookQueue:
    """Webhooks waiting to be sent, at most ``size`` of them, posted by ``senders`` daemon
    threads. A dead or hanging endpoint drains one post per sender every ``timeout`` seconds
    while runs may end at submit rate, so a queue without a bound would grow without limit: a
    webhook that finds the queue full is dropped and counted (webhooks are best effort), with a
    log line for the first drop and then at most one every ``DROP_LOG_EVERY_SECONDS``, which
    tells how many were dropped since the last one."""

    def __init__(
        self, size: int, *, senders: int = SENDERS, timeout: float = POST_TIMEOUT_SECONDS
    ) -> None:
        self.size = size
        self._timeout = timeout
        self._queue: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue(maxsize=size)
        self._lock = threading.Lock()
        self._dropped = 0
        self._unlogged = 0
        self._logged_at: float | None = None
        self._senders = [
            threading.Thread(target=self._send, name=f"mediator-webhook-{i}", daemon=True)
            for i in range(senders)
        ]
        for thread in self._senders:
            thread.start()

    @property
    def dropped(self) -> int:
        """How many webhooks this queue has dropped because it was full."""
        with self._lock:
            return self._dropped

    def waiting(self) -> int:
        """How many webhooks wait for a sender (at most ``size``)."""
        return self._queue.qsize()

    def unsent(self) -> int:
        """Webhooks queued or being posted."""
        return self._queue.unfinished_tasks

    def join(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until every queued webhook has been posted."""
        with self._queue.all_tasks_done:
            return self._queue.all_tasks_done.wait_for(
                lambda: not self._queue.unfinished_tasks, timeout
            )

    def submit(self, url: str, body: dict[str, Any]) -> bool:
        """Queue one POST; False when the queue was full and the webhook was dropped."""
        try:
            self._queue.put_nowait((url, body))
            return True
        except queue.Full:
            self._drop(url, body)
            return False

    def _drop(self, url: str, body: dict[str, Any]) -> None:
        now = time.monotonic()
        WEBHOOKS_DROPPED.inc()
        with self._lock:
            self._dropped += 1
            self._unlogged += 1
            if self._logged_at is not None and now - self._logged_at < DROP_LOG_EVERY_SECONDS:
                return
            self._logged_at, unlogged, dropped = now, self._unlogged, self._dropped
            self._unlogged = 0
        log.warning(
            "webhook dropped: the queue is full",
            url=webhook_origin(url),
            webhook=body.get("event"),
            queue_size=self.size,
            dropped_since_last_line=unlogged,
            dropped=dropped,
        )

    def _send(self) -> None:
        while True:
            url, body = self._queue.get()
            try:
                _post(url, body, self._timeout)
            except Exception:  # a sender that died would leave the queue to fill up for good
                log.exception("webhook sender failed", url=webhook_origin(url))
            finally:
                self._queue.task_done()


# One queue per process and size (one size in production: the configured one). Sender threads do
# not survive a fork, so a process that finds queues made by its parent makes its own.
_queues: dict[tuple[int, float], WebhookQueue] = {}
_queues_pid = os.getpid()
_queues_lock = threading.Lock()


def _queue_of(size: int, timeout: float) -> WebhookQueue:
    global _queues, _queues_pid
    with _queues_lock:
        if _queues_pid != os.getpid():
            _queues, _queues_pid = {}, os.getpid()
        found = _queues.get((size, timeout))
        if found is None:
            found = _queues[(size, timeout)] = WebhookQueue(size, timeout=timeout)
        return found


def post_webhook(
    url: str | None,
    body: dict[str, Any],
    *,
    queue_size: int = DEFAULT_QUEUE_SIZE,
    timeout: float = POST_TIMEOUT_SECONDS,
) -> None:
    """Best effort, short time-out (``notify.timeout_seconds``), in the background: never blocks
    the request's answer, and never holds more than ``queue_size`` webhooks
    (``notify.queue_size``) waiting."""
    if not url:
        return
    _queue_of(queue_size, timeout).submit(url, body)


def flush_webhooks(timeout: float = POST_TIMEOUT_SECONDS) -> int:
    """Wait at most ``timeout`` seconds for this process's queued webhooks to be sent (a worker
    shutting down); returns how many were still waiting then."""
    with _queues_lock:
        queues = list(_queues.values()) if _queues_pid == os.getpid() else []
    deadline = time.monotonic() + timeout
    for q in queues:
        q.join(max(0.0, deadline - time.monotonic()))
    return sum(q.unsent() for q in queues)


def dropped_webhooks() -> int:
    """How many webhooks this process has dropped because its queue was full (for metrics)."""
    with _queues_lock:
        if _queues_pid != os.getpid():
            return 0
        queues = list(_queues.values())
    return sum(q.dropped for q in queues)


@dataclass
class AfterCommit:
    """What a transaction leaves to do once it has committed."""

    claim_nodes: set[str] = field(default_factory=set)
    asks: list[dict[str, Any]] = field(default_factory=list)
    wake_causes: list[str] = field(default_factory=list)
    # A wake owed even when nothing named a freed node (wake point 1 of
    # docs/design.md#wake-points: every accepted
    # result); its cause is used only when no other cause was recorded.
    wake_anyway: str | None = None
    verifying: list[str] = field(default_factory=list)  # runs to settle (VERIFYING committed)
    settled: list[str] = field(default_factory=list)  # runs to seal and announce
    # Changes of nodes' holds and quarantines, for notify.nodes_url (docs/operators.md).
    node_changes: list[dict[str, Any]] = field(default_factory=list)

    def wake(self, cause: str) -> None:
        self.wake_causes.append(cause)

    def released(self, run_id: str, nodes: list[str]) -> None:
        """The audit cause a promoted run inherits: ``released by <run>/<node>``
        (docs/api.md#get-v1runsrun_idevents--a-runs-audit-trail)."""
        if nodes:
            self.wake("released by " + ", ".join(f"{run_id}/{n}" for n in nodes))

    def causes(self) -> list[str]:
        """The distinct wake causes in order; the fallback when none was recorded."""
        causes = list(dict.fromkeys(self.wake_causes))
        if not causes and self.wake_anyway:
            causes = [self.wake_anyway]
        return causes

    def snapshot(self) -> AfterCommit:
        if self == _NOTHING_LEFT:  # most transactions start with nothing left to do: no copy
            return AfterCommit()
        return copy.deepcopy(self)

    def restore(self, snap: AfterCommit) -> None:
        """Forget what a rolled-back attempt recorded (a retried transaction starts clean)."""
        self.__dict__.update(copy.deepcopy(snap).__dict__)


_NOTHING_LEFT = AfterCommit()
