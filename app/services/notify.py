"""After-commit side effects: claim notifications (LISTEN/NOTIFY), webhooks, wake, seal.

Nothing here runs inside a business transaction: a NOTIFY serialises commits in PostgreSQL, a
webhook may be slow, and a wake inside the freeing transaction would wait on its own rows.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from app.logs import log

if TYPE_CHECKING:
    from app.services.context import Context

CLAIM_CHANNEL = "mediator_claims"
_MAX_PAYLOAD = 7000  # PostgreSQL's limit is 8000 bytes; "*" wakes every waiting claim

_webhooks: ThreadPoolExecutor | None = None
_webhooks_lock = threading.Lock()


def notify_claimable(ctx: Context, nodes: set[str]) -> None:
    """One NOTIFY naming the nodes whose claims may now find a step (best effort: a lost one is
    caught by the claim's slow re-check)."""
    if not nodes:
        return
    payload = json.dumps(sorted(nodes))
    if len(payload) > _MAX_PAYLOAD:
        payload = '"*"'
    try:
        with ctx.db.begin() as s:
            s.execute(select(func.pg_notify(CLAIM_CHANNEL, payload)))
    except Exception:
        log.warning("claim notification failed", nodes=len(nodes))


def _post(url: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=3) as resp:
            resp.read(1024)
    except Exception as exc:
        log.warning("webhook failed", url=url, event=body.get("event"), error=type(exc).__name__)


def post_webhook(url: str | None, body: dict[str, Any]) -> None:
    """Best effort, short time-out, in the background: never blocks the request's answer."""
    global _webhooks
    if not url:
        return
    with _webhooks_lock:
        if _webhooks is None:
            _webhooks = ThreadPoolExecutor(max_workers=4, thread_name_prefix="mediator-webhook")
    _webhooks.submit(_post, url, body)


@dataclass
class AfterCommit:
    """What a transaction leaves to do once it has committed."""

    claim_nodes: set[str] = field(default_factory=set)
    asks: list[dict[str, Any]] = field(default_factory=list)
    wake_causes: list[str] = field(default_factory=list)
    verifying: list[str] = field(default_factory=list)  # runs to settle (VERIFYING committed)
    ended: list[str] = field(default_factory=list)  # runs to seal and announce

    def wake(self, cause: str) -> None:
        self.wake_causes.append(cause)

    def snapshot(self) -> tuple[Any, ...]:
        return (
            set(self.claim_nodes),
            list(self.asks),
            list(self.wake_causes),
            list(self.verifying),
            list(self.ended),
        )

    def restore(self, snap: tuple[Any, ...]) -> None:
        """Forget what a rolled-back attempt recorded (a retried transaction starts clean)."""
        self.claim_nodes, self.asks, self.wake_causes, self.verifying, self.ended = (
            set(snap[0]),
            list(snap[1]),
            list(snap[2]),
            list(snap[3]),
            list(snap[4]),
        )

    def merge(self, other: AfterCommit) -> None:
        self.claim_nodes |= other.claim_nodes
        self.asks += other.asks
        self.wake_causes += other.wake_causes
        self.verifying += other.verifying
        self.ended += other.ended
