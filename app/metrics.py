"""The process's Prometheus metrics (docs/metrics.md#get-metrics): counters, histograms and one
gauge that the services bump as things happen. What lives in the database (runs by state, queue
depth, leases, asks, reservations, wake debt) is not here: it is read once per scrape by
``app.services.metrics``, so that several processes never count it twice.

Several gunicorn workers: with ``PROMETHEUS_MULTIPROC_DIR`` set before this module is imported
(``gunicorn.conf.py`` sees to it), prometheus-client keeps every value in a file of that
directory per process, and a scrape, whichever worker answers it, sums the files of all of them
(:func:`process_collector`). Without it (``mediator server serve``, the tests' app) the values
live in the process's own registry. The code that bumps a metric is the same either way, and
costs no database query.

Labels are bounded: a route is the URL rule (``/v1/runs/<run_id>``), never the path; a cause is
one of :data:`CAUSES`; a team is a configured one, ``default``, ``health`` or ``other``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

# Seconds, from a quick GET to a claim held for its whole long poll (30 s by default).
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
SCAN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# Queue waits: seconds to a day (a run reserves after 15 minutes by default).
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)

# No *_created series: multiprocess mode has none, and one process should not differ from several.
disable_created_metrics()

HTTP_REQUESTS = Counter(
    "mediator_http_requests_total",
    "HTTP requests answered, by method, route (the URL rule) and status",
    ["method", "route", "status"],
)
HTTP_SECONDS = Histogram(
    "mediator_http_request_duration_seconds",
    "Time to answer an HTTP request (a claim includes its long poll), by method and route",
    ["method", "route"],
    buckets=REQUEST_BUCKETS,
)

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})


def count_request(method: str, route: str | None, status: int, seconds: float) -> None:
    """One answered request. A path no rule matched is ``route="unmatched"`` and a method
    outside HTTP's usual ones ``"other"``: a client cannot make new series."""
    route = route or "unmatched"
    method = method if method in METHODS else "other"
    HTTP_REQUESTS.labels(method, route, str(status)).inc()
    HTTP_SECONDS.labels(method, route).observe(seconds)


SUBMIT_OUTCOMES = (
    "placed",  # 201, nodes leased at once
    "queued",  # 202 (or 201 when the submit's own wake scan promoted it)
    "duplicate",  # 200, the run_id was known
    "rejected",  # 422, no candidate or over the width cap (stored FAILED)
    "invalid",  # 400, the contract
    "forbidden",  # 403, a priority above the token's, or a team it may not name
    "pruned_id",  # 409, the run_id of a pruned run
    "queue_full",  # 429, the run would queue and its team is at max_queued (nothing stored)
    "error",  # anything else (503 included)
)
# ``team``: the run's team (docs/teams.md), bounded by the configured names, "default", "health"
# and "other"; a refusal before the team is chosen counts under the token's own.
SUBMITS = Counter(
    "mediator_submits_total", "Submits (POST /v1/runs) by outcome and team", ["outcome", "team"]
)


def count_submits_of(teams: Iterable[str]) -> None:
    """Every outcome of every team's submits from the start: a scrape shows a 0, not nothing."""
    for team in teams:
        for outcome in SUBMIT_OUTCOMES:
            SUBMITS.labels(outcome, team)


CAUSES = (
    "submit",
    "result",
    "release",
    "cancel",
    "node",
    "queue_timeout",
    "reaper",
    "start-up",
    "other",
)
_CAUSE_PREFIXES = (
    ("submit of ", "submit"),
    ("result of ", "result"),
    ("released by ", "release"),
    ("cancel of ", "cancel"),
    ("node ", "node"),  # node restarted, node X is live
    ("capabilities of ", "node"),
    ("drain lifted on ", "node"),
    ("queue timeout", "queue_timeout"),
    ("reaper", "reaper"),
    ("start-up", "start-up"),
)


def cause_label(cause: str) -> str:
    """The bounded label of a wake's cause: the kind of its first part (a cause names runs and
    nodes: ``released by r1/n1; result of r1#02`` -> ``release``)."""
    for prefix, label in _CAUSE_PREFIXES:
        if cause.startswith(prefix):
            return label
    return "other"


WAKE_SCANS = Counter(
    "mediator_wake_scans_total",
    "Wake scans of the queue that ran, by cause",
    ["cause"],
)
WAKE_SKIPPED = Counter(
    "mediator_wake_scans_skipped_total",
    "Wake scans skipped by the scan gate (another scan was waiting and starts after), by cause",
    ["cause"],
)
WAKE_FAILED = Counter(
    "mediator_wake_scans_failed_total",
    "Wake scans that failed (a wake debt is left for the reaper), by cause",
    ["cause"],
)
WAKE_SECONDS = Histogram(
    "mediator_wake_scan_duration_seconds",
    "Time a wake scan took, by cause",
    ["cause"],
    buckets=SCAN_BUCKETS,
)
WAKE_PROMOTED = Counter(
    "mediator_wake_promoted_total",
    "QUEUED runs promoted to RUNNING by wake scans, by cause",
    ["cause"],
)
QUEUE_WAIT = Histogram(
    "mediator_queue_wait_seconds",
    "Time a run waited from QUEUED to RUNNING (database clock)",
    buckets=WAIT_BUCKETS,
)
CLAIMS_WAITING = Gauge(
    "mediator_claims_waiting",
    "Claims (POST /v1/nodes/{id}/claim) in their long poll now",
    multiprocess_mode="livesum",
)
LEASE_EXPIRIES = Counter(
    "mediator_lease_expiries_total",
    "Runs failed by the reaper because a lease expired (renewal stopped)",
)
REAPER_PASSES = Counter(
    "mediator_reaper_passes_total",
    "Reaper passes, by result: done, skipped (another reaper held the lock), lost (the lock went"
    " away during the pass, which ended early), failed",
    ["result"],
)
REAPER_ACTIONS = (
    "leases_extended",
    "asks_expired",
    "lease_expired",
    "steps_failed",
    "leases_deleted",
    "verdicts",
    "queue_timeouts",
    "sealed",
    "pruned",
)
REAPER_DONE = Counter(
    "mediator_reaper_actions_total",
    "What reaper passes did and freed, by action (asks expired, lease-expired runs failed, "
    "leases of finished runs deleted, ...)",
    ["action"],
)
AUTH_OUTCOMES = ("slow_verifications", "refused", "refused_from_memory", "busy", "rate_limited")
AUTH = Counter(
    "mediator_auth_total",
    "Token checks by outcome: slow (argon2) verifications run, secrets refused after a look-up or"
    " from the refusal memory, requests refused for want of a slow-verification slot (503) or"
    " for too many failures from their address (429)",
    ["outcome"],
)


for _outcome in AUTH_OUTCOMES:  # every series from the start: a scrape shows a 0, not nothing
    AUTH.labels(_outcome)


def count_auth(outcome: str) -> None:
    AUTH.labels(outcome if outcome in AUTH_OUTCOMES else "refused").inc()


WEBHOOKS_DROPPED = Counter(
    "mediator_webhooks_dropped_total",
    "Webhooks dropped because the process's webhook queue was full (notify.queue_size)",
)
PRUNED_RUNS = Counter(
    "mediator_pruned_runs_total",
    "Runs deleted by retention (retention.days, mediator server prune)",
)

# Known labels start at 0, so a rate over them exists before the first event.
count_submits_of(["default"])
for _action in REAPER_ACTIONS:
    REAPER_DONE.labels(_action)


def multiprocess_dir() -> str | None:
    """The directory of the per-process files, when several processes share the metrics."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class _Forward(Collector):
    """The process's default registry as a collector of another registry (single process)."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


def process_collector() -> Collector:
    """What a scrape reports of the processes: the sum over every worker's files in
    multiprocess mode, else this process's registry (with prometheus-client's process and
    platform metrics)."""
    directory = multiprocess_dir()
    if directory:
        from prometheus_client import multiprocess

        return multiprocess.MultiProcessCollector(None, path=directory)
    return _Forward()
