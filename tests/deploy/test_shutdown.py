"""A serving process that stops gives its queued webhooks a bounded moment to go out
(``flush_webhooks``, called from gunicorn's ``worker_exit`` through :func:`app.shutdown`)."""

from __future__ import annotations

import time

from app.services.notify import flush_webhooks, post_webhook
from tests.support.webhooks import SENDERS


def test_flush_waits_for_queued_webhooks_but_no_longer_than_its_timeout(hook):
    size = 11  # a size of its own: each size has its own queue in the process
    for n in range(SENDERS + 2):
        post_webhook(hook.url, {"event": "run", "n": n}, queue_size=size, timeout=600)
    hook.wait_for(SENDERS)  # every sender hangs on a post; two more wait in the queue

    started = time.monotonic()
    assert flush_webhooks(timeout=0.3) == SENDERS + 2
    assert 0.3 <= time.monotonic() - started < 5

    hook.release.set()
    assert flush_webhooks(timeout=10) == 0
    assert hook.seqs() == list(range(SENDERS + 2))
