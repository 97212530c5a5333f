"""``GET /metrics`` (docs/api.md#get-metrics, docs/metrics.md#get-metrics): the processes' counters
and histograms, and the figures that live in the database, read once per scrape in one statement.

A scrape never fails because of the database: when the figures cannot be read (unreachable, a
statement time-out, a schema behind), the answer still holds the process metrics, and
``mediator_database_figures_failed`` says 1.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from app.context import Context
from app.logs import log
from app.metrics import process_collector
from app.states import RUN_STATES
from app.store.metrics import Figures, read_figures
from app.store.queue import set_statement_timeout

# A scrape's statement gives up sooner than a request's: a scraper retries on its own period.
FIGURES_TIMEOUT_SECONDS = 5.0


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def figure_families(figures: Figures) -> list[Metric]:
    runs = GaugeMetricFamily(
        "mediator_runs", "Runs by state (rows of the runs table)", labels=["state"]
    )
    for state in RUN_STATES:
        runs.add_metric([state], figures.runs_by_state.get(state, 0))
    return [
        runs,
        _gauge("mediator_queue_depth", "QUEUED runs", figures.queued),
        _gauge(
            "mediator_queue_oldest_age_seconds",
            "How long the oldest QUEUED run has waited (0: none queued)",
            figures.oldest_queued_seconds or 0.0,
        ),
        _gauge("mediator_leases_held", "Leases held (nodes busy with a run)", figures.leases),
        _gauge("mediator_asks_open", "Ask steps waiting for an answer", figures.open_asks),
        _gauge(
            "mediator_asks_oldest_age_seconds",
            "How long the oldest open ask has waited (0: none open)",
            figures.oldest_ask_seconds or 0.0,
        ),
        _gauge(
            "mediator_wake_debt",
            "1 while a wake debt is recorded (a scan could not finish; the reaper pays it)",
            0 if figures.wake_debt_seconds is None else 1,
        ),
        _gauge(
            "mediator_wake_debt_age_seconds",
            "How long the wake debt has been recorded (0: none)",
            figures.wake_debt_seconds or 0.0,
        ),
        _gauge("mediator_reservations", "Nodes reserved for waiting runs", figures.reservations),
        _gauge(
            "mediator_reserving_runs", "QUEUED runs holding a reservation", figures.reserving_runs
        ),
        _gauge(
            "mediator_reserved_idle_nodes",
            "Reserved nodes that hold no lease (idle on purpose until their holder fits)",
            figures.reserved_idle,
        ),
        _gauge("mediator_nodes_live", "Nodes whose advert has not expired", figures.nodes_live),
        _gauge(
            "mediator_nodes_quarantined",
            "Nodes out of service until a health run or an operator lifts their quarantine",
            figures.nodes_quarantined,
        ),
        _gauge(
            "mediator_reaper_last_pass_age_seconds",
            "Seconds since the last reaper pass began (-1: no pass yet)",
            -1.0 if figures.reaper_last_pass_seconds is None else figures.reaper_last_pass_seconds,
        ),
    ]


class DatabaseCollector(Collector):
    """The database's figures, read when a scrape collects them."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def collect(self) -> Iterable[Metric]:
        started = time.monotonic()
        families: list[Metric] = []
        try:
            with self.ctx.db.read() as s:
                set_statement_timeout(s, FIGURES_TIMEOUT_SECONDS)
                families = figure_families(read_figures(s))
            failed = 0
        except Exception as exc:
            # Never a 500: the process metrics still go out (docs/metrics.md#get-metrics).
            log.warning("metrics: database figures failed", error=type(exc).__name__)
            failed = 1
        yield from families
        yield _gauge(
            "mediator_database_figures_failed",
            "1 when this scrape could not read the database's figures (they are left out)",
            failed,
        )
        yield _gauge(
            "mediator_database_figures_seconds",
            "Time this scrape spent reading the database's figures",
            time.monotonic() - started,
        )


def render_metrics(ctx: Context) -> bytes:
    """The Prometheus text of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(process_collector())
    registry.register(DatabaseCollector(ctx))
    return generate_latest(registry)
