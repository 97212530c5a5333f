"""gunicorn settings for the Mediator behind nginx (docs/deploy.md#6-gunicorn).

Threaded workers (gthread): a claim waiting in long poll holds a thread but no database
connection, so threads are many and the pool per process is small. Engines, pools and listener
threads are created in each worker after fork, never in the master (no preload_app).
"""

import gc
import os
import sys
import tempfile


def _count(*names: str, default: int) -> int:
    """The first of ``names`` set in the environment, an integer of at least 1; anything else
    stops gunicorn with one line naming the variable (before any worker boots)."""
    for name in names:
        text = os.environ.get(name, "").strip()
        if text:
            if not (text.isascii() and text.isdigit() and int(text) >= 1):
                why = f"must be an integer of at least 1 (got {text!r})"
                print(f"mediator: invalid gunicorn setting: {name}: {why}", file=sys.stderr)
                sys.exit(2)  # like an invalid configuration (on_starting below)
            return int(text)
    return default


bind = os.environ.get("MEDIATOR_BIND", "127.0.0.1:8080")
# WEB_CONCURRENCY is the variable platforms and gunicorn itself use for the worker count.
workers = _count("MEDIATOR_WORKERS", "WEB_CONCURRENCY", default=4)
# gthread, with connections shared out evenly, same-thread keep-alive and a quick shutdown that
# cannot hang (docs/deploy.md)
worker_class = "app.gunicorn_worker.ThreadWorker"
# A claim in long poll holds a thread (no database connection) for up to 30 s, and connections
# are spread only as they arrive (one worker may hold all of a fleet's when the others are
# starting or full): a worker whose threads are all held queues every other request of its
# connections behind them. Threads are started as requests need them and a waiting
# one is cheap, so each worker may hold a whole fleet's claims (docs/design.md#targets). The
# measurements behind these numbers are in bench/README.md ("gunicorn's threads").
threads = _count("MEDIATOR_THREADS", default=1000)
# A gthread worker keeps an idle connection alive only while it holds fewer than
# worker_connections - threads of them: with gunicorn's default (1,000) and 1,000 threads none is
# kept, so every request (nginx's upstream keep-alive, an agent's) paid a new TCP connection and a
# graceful close (a profile of the placed submit found 5 % of the workers' time there), and a
# worker stopped accepting at 1,000 connections, waiting claims included. Room for as many idle
# connections as there are threads.
worker_connections = _count("MEDIATOR_WORKER_CONNECTIONS", default=2 * threads)
# Above the long-poll window (claim.long_poll_seconds, 30 s by default).
timeout = _count("MEDIATOR_WORKER_TIMEOUT", default=90)
graceful_timeout = _count("MEDIATOR_GRACEFUL_TIMEOUT", default=30)
keepalive = 75

# Metrics of several workers (docs/metrics.md#several-processes): prometheus-client keeps each
# worker's values in files of this directory and a scrape sums them. It must be set before the
# app (and so prometheus-client) is imported, which happens in this process below; the workers
# inherit it. Without one given, a directory of this gunicorn's own, removed when it exits.
_OWN_METRICS_DIR = not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
if _OWN_METRICS_DIR:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.path.join(
        tempfile.gettempdir(), f"mediator-metrics-{os.getpid()}"
    )
METRICS_DIR = os.environ["PROMETHEUS_MULTIPROC_DIR"]
os.makedirs(METRICS_DIR, exist_ok=True)

preload_app = False
accesslog = None  # the app logs every request as JSON itself
# gunicorn would write an access line per request anyway, because logconfig_dict is set: this
# logger writes one only when accesslog names a destination.
logger_class = "app.gunicorn_worker.Logger"
errorlog = "-"
# gunicorn's own lines (and any access log, and the standard library's records) rendered like the
# app's: one JSON object a line (docs/metrics.md#logs), or readable lines with log.format: console.
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {
        "stderr": {"class": "app.logs.StderrHandler"},
        "stdout": {"class": "app.logs.StdoutHandler"},
    },
    # No level here for gunicorn's loggers: gunicorn's loglevel keeps deciding.
    "loggers": {
        "gunicorn.error": {"handlers": ["stderr"], "propagate": False},
        "gunicorn.access": {"handlers": ["stdout"], "propagate": False},
    },
    "root": {"level": "INFO", "handlers": ["stderr"]},
}


def on_starting(server):
    # An invalid configuration stops the process with one line naming the key
    # (docs/configuration.md#invalid-values), before any worker boots (a worker would die with a
    # traceback, again and again).
    import sys

    from app.config import load_config, warn_of_tokens_in_environment
    from app.context import check_record_store
    from app.errors import ConfigError
    from app.logs import configure_logging

    try:
        cfg = load_config()
        cfg.database_url  # noqa: B018  (raises naming database.url when unset)
        # A records.root that ignores case (docs/configuration.md#where-records-are-kept).
        check_record_store(cfg)
    except ConfigError as exc:
        print(f"mediator: invalid configuration: {exc}", file=sys.stderr)
        sys.exit(2)
    configure_logging(cfg["log.format"], cfg["log.level"])  # gunicorn's lines follow log.format
    warn_of_tokens_in_environment()
    # Counters of an earlier run of gunicorn start again from 0 (a Prometheus counter reset).
    for name in os.listdir(METRICS_DIR):
        if name.endswith(".db"):
            os.unlink(os.path.join(METRICS_DIR, name))
    if _OWN_METRICS_DIR:
        _remove_orphaned_metrics_dirs()


def on_reload(server):
    # HUP (systemctl reload): the new workers read the configuration file again, tokens
    # included, but run in the environment this master started with, tokens there included: a
    # token removed from the environment file keeps working until a restart (docs/tokens.md,
    # "Changing tokens"). Said at every reload, when the operator expects the change.
    from app.config import warn_of_tokens_in_environment

    warn_of_tokens_in_environment()


def _remove_orphaned_metrics_dirs():
    # The directories of earlier gunicorns on this machine that died without their on_exit (a
    # SIGKILL, a crash): none of their processes is left to write there.
    import shutil

    base = tempfile.gettempdir()
    for name in os.listdir(base):
        prefix, _, pid = name.partition("mediator-metrics-")
        if prefix or not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)  # signal 0: is the process there?
        except ProcessLookupError:
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        except OSError:
            pass  # there, but not ours to signal: leave it


def child_exit(server, worker):
    # A dead worker's gauges (claims waiting) leave the sum; its counters stay counted.
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid, METRICS_DIR)


def on_exit(server):
    if _OWN_METRICS_DIR:
        import shutil

        shutil.rmtree(METRICS_DIR, ignore_errors=True)


def post_worker_init(worker):
    # Every serving process scans once at start-up, after its schema check
    # (docs/design.md#wake-points, 6).
    from app import startup

    startup(worker.wsgi)
    # What a started worker holds (modules, the app, its tables' metadata) is never garbage:
    # frozen out of the collector's generations, a full collection no longer traverses it while
    # every thread of the worker waits (it took 100-170 ms of a worker with a fleet's claims
    # waiting), only what came since.
    gc.freeze()


def worker_exit(server, worker):
    # Close what the worker opened: its pool, scan-gate connection and LISTEN thread, and give
    # queued webhooks a moment to go out. Called in the worker, and in the master for a worker
    # that is already gone (no app there: nothing to close).
    app = getattr(worker, "wsgi", None)
    if app is not None and worker.pid == os.getpid():
        from app import shutdown

        shutdown(app)
