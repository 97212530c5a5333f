"""After-commit side effects: what a transaction leaves to do (:class:`AfterCommit`), claim
notifications (NOTIFY) and webhooks.

Nothing here runs inside a business transaction: a NOTIFY serialises commits in PostgreSQL, a
webhook may be slow, and a wake inside the freeing transaction would wait on its own rows.
"""

from __future__ import annotations

import copy
import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from app.context import Context
from app.listener import CLAIM_CHANNEL, claim_payload
from app.logs import log
from app.store.server import notify

_webhooks: ThreadPoolExecutor | None = None
_webhooks_lock = threading.Lock()


def notify_claimable(ctx: Context, nodes: set[str]) -> None:
    """One NOTIFY naming the nodes whose claims may now find a step (best effort: a lost one is
    caught by the claim's slow re-check)."""
    if not nodes:
        return
    try:
        with ctx.db.begin() as s:
            notify(s, CLAIM_CHANNEL, claim_payload(nodes))
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
    # A wake owed even when nothing named a freed node (SPEC §7 wake point 1: every accepted
    # result); its cause is used only when no other cause was recorded.
    wake_anyway: str | None = None
    verifying: list[str] = field(default_factory=list)  # runs to settle (VERIFYING committed)
    ended: list[str] = field(default_factory=list)  # runs to seal and announce

    def wake(self, cause: str) -> None:
        self.wake_causes.append(cause)

    def released(self, run_id: str, nodes: list[str]) -> None:
        """The audit cause a promoted run inherits: ``released by <run>/<node>`` (SPEC §15)."""
        if nodes:
            self.wake("released by " + ", ".join(f"{run_id}/{n}" for n in nodes))

    def causes(self) -> list[str]:
        """The distinct wake causes in order; the fallback when none was recorded."""
        causes = list(dict.fromkeys(self.wake_causes))
        if not causes and self.wake_anyway:
            causes = [self.wake_anyway]
        return causes

    def snapshot(self) -> AfterCommit:
        return copy.deepcopy(self)

    def restore(self, snap: AfterCommit) -> None:
        """Forget what a rolled-back attempt recorded (a retried transaction starts clean)."""
        self.__dict__.update(copy.deepcopy(snap).__dict__)
