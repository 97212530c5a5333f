"""gunicorn settings for the Mediator behind nginx (SPEC §15).

Threaded workers (gthread): a claim waiting in long poll holds a thread but no database
connection, so threads are many and the pool per process is small. Engines, pools and listener
threads are created in each worker after fork, never in the master (no preload_app).
"""

import os

bind = os.environ.get("MEDIATOR_BIND", "127.0.0.1:8080")
workers = int(os.environ.get("MEDIATOR_WORKERS", "4"))
worker_class = "gthread"
# 4 x 160 threads: 500 claims waiting in long poll (SPEC §16) with room for other requests.
threads = int(os.environ.get("MEDIATOR_THREADS", "160"))
# Above the long-poll window (claim.long_poll_seconds, 30 s by default).
timeout = int(os.environ.get("MEDIATOR_WORKER_TIMEOUT", "90"))
graceful_timeout = 30
keepalive = 75
preload_app = False
accesslog = None  # the app logs every request as JSON itself
errorlog = "-"


def on_starting(server):
    # SPEC §15: an invalid configuration stops the process with one line naming the key, before
    # any worker boots (a worker would die with a traceback, again and again).
    import sys

    from app.config import load_config
    from app.errors import ConfigError

    try:
        load_config().sqlalchemy_url  # noqa: B018  (raises naming database.url when unset)
    except ConfigError as exc:
        print(f"mediator: invalid configuration: {exc}", file=sys.stderr)
        sys.exit(2)


def post_worker_init(worker):
    # SPEC §7 wake point 6: every serving process scans once at start-up, after its schema check.
    from app import startup

    startup(worker.wsgi)
