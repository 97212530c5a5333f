"""The webhook queue (best-effort POSTs that never block a request:
docs/configuration.md#webhooks): at most
``notify.queue_size`` webhooks wait for a sender, so an endpoint that hangs cannot make memory grow
while runs keep ending; what does not fit is dropped, logged and counted for the metrics. The
endpoint is a real local HTTP server that takes each POST and holds it without replying."""

from __future__ import annotations

import pytest
import structlog

from app.config import load_config
from app.errors import ConfigError
from app.logs import configure_logging
from app.services.notify import WebhookQueue, dropped_webhooks, post_webhook
from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done
from tests.support.apps import app_on, client_of
from tests.support.contracts import contract
from tests.support.webhooks import SENDERS


def test_a_full_queue_drops_the_overflow_counts_it_and_says_so_in_a_log_line(hook):
    configure_logging("console", "warning")  # an app of an earlier test may have set "error"
    webhooks = WebhookQueue(3, senders=2, timeout=600)  # senders wait for the hook: no time decides
    for n in range(2):
        assert webhooks.submit(hook.url, {"event": "run", "n": n})
    hook.wait_for(2)  # both senders now hang on their post
    for n in range(2, 5):
        assert webhooks.submit(hook.url, {"event": "run", "n": n})

    with structlog.testing.capture_logs() as logs:
        overflow = [webhooks.submit(hook.url, {"event": "run", "n": n}) for n in range(5, 10)]

    assert overflow == [False] * 5
    assert (webhooks.dropped, webhooks.waiting()) == (5, 3)
    lines = [e for e in logs if e["event"] == "webhook dropped: the queue is full"]
    assert len(lines) == 1  # one line for a burst, not one per webhook
    assert lines[0]["log_level"] == "warning"
    # Only the scheme and host of the URL: its path may carry a secret
    # (docs/security.md#outgoing-webhooks).
    origin = hook.url.removesuffix("/hooks")
    assert (lines[0]["queue_size"], lines[0]["dropped"], lines[0]["url"]) == (3, 1, origin)

    hook.release.set()
    hook.wait_for(5)
    assert hook.seqs() == [0, 1, 2, 3, 4]  # what was queued is sent; what was dropped is not


def test_a_hanging_endpoint_never_lets_more_than_the_queue_size_wait(hook):
    webhooks = WebhookQueue(50, senders=SENDERS, timeout=600)
    for n in range(SENDERS):
        webhooks.submit(hook.url, {"event": "run", "n": n})
    hook.wait_for(SENDERS)

    # Every sender is held by the hook until the test releases it: a submit that waited for a
    # sender would never return (the test's time-out), so these return only by dropping.
    taken = sum(webhooks.submit(hook.url, {"event": "run", "n": n}) for n in range(20_000))

    assert taken == 50 and webhooks.waiting() == 50
    assert webhooks.dropped == 20_000 - 50
    hook.release.set()
    hook.wait_for(SENDERS + 50)


def test_post_webhook_holds_the_configured_size_and_dropped_webhooks_counts_the_process(hook):
    size = 7  # a size no other test of this process uses: each size has its own queue
    before = dropped_webhooks()
    for n in range(SENDERS):
        post_webhook(hook.url, {"event": "ask", "n": n}, queue_size=size, timeout=600)
    hook.wait_for(SENDERS)

    for n in range(SENDERS, SENDERS + size + 3):
        post_webhook(hook.url, {"event": "ask", "n": n}, queue_size=size, timeout=600)

    assert dropped_webhooks() - before == 3
    hook.release.set()
    hook.wait_for(SENDERS + size)
    assert hook.seqs() == list(range(SENDERS + size))


def test_a_webhook_without_a_url_is_neither_queued_nor_dropped():
    before = dropped_webhooks()

    post_webhook(None, {"event": "run"}, queue_size=1)
    post_webhook("", {"event": "run"}, queue_size=1)

    assert dropped_webhooks() == before


def test_runs_that_end_while_the_runs_webhook_hangs_are_dropped_past_notify_queue_size(
    db_url, tmp_path, hook
):
    size = 5  # a size no other test of this process uses
    # Senders wait for the hanging hook longer than this test can take on any machine, so what
    # is dropped is decided by the count of runs, not by how fast they end.
    keys = {"notify.runs_url": hook.url, "notify.queue_size": size, "notify.timeout_seconds": 600}
    with app_on(db_url, tmp_path / "records", **keys) as app:
        client = client_of(app)
        advertise(client, "n1", cap("board"))
        before = dropped_webhooks()

        def end_run(k: int) -> None:
            client.post("/v1/runs", json=contract(f"r{k:02d}"))
            step = claimed(client, "n1")
            assert done(client, f"r{k:02d}", step["seq"], "n1")["run_state"] == "SUCCEEDED"

        for k in range(SENDERS):
            end_run(k)
        hook.wait_for(SENDERS)
        for k in range(SENDERS, SENDERS + size + 2):
            end_run(k)

        assert dropped_webhooks() - before == 2
        hook.release.set()
        hook.wait_for(SENDERS + size)
        assert sorted(b["run_id"] for b in hook.bodies) == [
            f"r{k:02d}" for k in range(SENDERS + size)
        ]


def test_notify_queue_size_defaults_to_1000_and_must_be_at_least_1():
    assert load_config(env={})["notify.queue_size"] == 1000
    assert load_config(env={"MEDIATOR_NOTIFY_QUEUE_SIZE": "20"})["notify.queue_size"] == 20
    with pytest.raises(ConfigError, match=r"^notify.queue_size: must be at least 1 \(got '0'\)$"):
        load_config(env={"MEDIATOR_NOTIFY_QUEUE_SIZE": "0"})
    with pytest.raises(ConfigError, match=r"^notify.queue_size: must be an integer"):
        load_config(env={"MEDIATOR_NOTIFY_QUEUE_SIZE": "many"})
