"""The Mediator: places runs on fleet nodes, queues what cannot be placed yet, and promotes it the
moment a node frees up."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import structlog
from flask import Flask, Response, g, jsonify, request
from sqlalchemy.exc import TimeoutError as PoolTimeout
from werkzeug.exceptions import HTTPException
from werkzeug.middleware.proxy_fix import ProxyFix

from app.config import Config, load_config
from app.context import Context
from app.db import database_unavailable
from app.errors import MediatorError, RuntimeEnvironmentError, Unavailable, error_body
from app.jsonbytes import AnswerJSON
from app.logs import configure_logging, log
from app.metrics import count_request
from app.migrate import schema_problem
from app.services.queue import pay_owed, wake_after_commit
from app.store.pipeline import driver_problem


def _error(status: int, reason: str, headers: Mapping[str, str] | None = None) -> Response:
    resp = jsonify(error_body(status, reason))
    resp.status_code = status
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


# How soon to try again after a 503 of the database: a switch to a standby takes seconds.
AGAIN = {"Retry-After": "1"}


def register_error_handlers(app: Flask) -> None:
    """Every error is ``{"error": {"code", "reason"}}``: ours, werkzeug's (404/405 with Allow, 413),
    the pool's time-out (503) and anything unexpected (500, traceback logged, never returned)."""

    @app.errorhandler(MediatorError)
    def _mediator(exc: MediatorError) -> Response:
        return _error(exc.status, exc.reason, exc.headers)

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException) -> Response:
        code = exc.code or 500
        reason = {
            404: f"no such route: {request.path}",
            405: f"method {request.method} not allowed on {request.path}",
            413: "body exceeds the size limit",
        }.get(code, exc.description or exc.name)
        headers = {k: v for k, v in exc.get_headers() if k.lower() == "allow"}
        return _error(code, reason, headers)

    @app.errorhandler(PoolTimeout)
    def _pool(exc: Exception) -> Response:
        return _error(503, "no database connection available in time", AGAIN)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        if database_unavailable(exc):
            # Unreachable, restarting, switching to a standby, or a statement timed out: try
            # again (docs/deploy.md#11-a-database-with-a-standby). Every route is safe to
            # repeat; a lost COMMIT leaves the outcome unknown, so this process owes a wake
            # mark and a scan, paid at its next successful use of the database.
            log.warning("database unavailable", error=type(exc).__name__)
            context = app.extensions.get("mediator")
            if context is not None:
                context.owed.set()
                g.database_failed = True  # paid by a later request, not by this one's end
            return _error(503, "database unavailable, try again", AGAIN)
        log.exception("unexpected error", route=request.url_rule.rule if request.url_rule else None)
        return _error(500, "internal error")


class SchemaGuard:
    """Refuse to serve on a schema older than the code (docs/deploy.md#4-schema), checked once per
    process and again while it is not right."""

    def __init__(self, context: Context) -> None:
        self.context = context
        self._ok = False
        self._lock = threading.Lock()
        self._checked_at = 0.0
        self._problem = "the database schema has not been checked yet"
        # The start-up wake this process skipped on a schema that was not ready: owed to the
        # first check that finds it ready (ops migrated while the worker was serving 503).
        self.wake_owed = False  # set by start-up before its first check

    def check(self) -> None:
        if self._ok:
            return
        with self._lock:
            if self._ok or time.monotonic() - self._checked_at < 1.0:
                if not self._ok:
                    raise Unavailable(self._problem)  # what the last check, under 1 s ago, found
                return
            self._checked_at = time.monotonic()
            try:
                problem = schema_problem(self.context.db.engine)
            except Exception as exc:
                self._problem = f"database unreachable ({type(exc).__name__})"
                raise
            if problem:
                self._problem = problem
                log.error("refusing to serve", reason=problem)
                raise Unavailable(problem)
            self._ok = True
            owed, self.wake_owed = self.wake_owed, False
        if owed:
            wake_after_commit(self.context, "start-up")


class UntrustedProxyWarning:
    """One warning line per process when a request comes through a proxy (it carries
    ``X-Forwarded-For``) while ``http.trusted_proxies`` is 0: every client then counts as the
    proxy's one address for the limit on failed authentications
    (docs/security.md#tokens-and-authentication), and a proxy on this host is loopback, which that
    limit leaves alone (docs/security.md). Said once, not per request: one line is enough to name
    the key, and a flood must not become a flood of lines."""

    def __init__(self) -> None:
        self._warned = False
        self._lock = threading.Lock()

    def __call__(self) -> None:
        if self._warned or "HTTP_X_FORWARDED_FOR" not in request.environ:
            return
        with self._lock:
            if self._warned:
                return
            self._warned = True
        log.warning(
            "a request came through a proxy (X-Forwarded-For) but http.trusted_proxies is 0:"
            " every client counts as the proxy's address for the limit on failed"
            " authentications, and a proxy on this host is loopback, never limited; set"
            " http.trusted_proxies to the number of proxies in front (1 behind the nginx of"
            " deploy/)",
            proxy=request.remote_addr,
        )


def _config_of(config: Config | Mapping[str, Any] | None) -> Config:
    if isinstance(config, Config):
        return config
    if config is None:
        return load_config()
    return load_config(env={}, overrides=config)


def create_app(config: Config | Mapping[str, Any] | None = None) -> Flask:
    """The app factory. ``config``: a :class:`Config`, a mapping of keys (tests; defaults fill the
    rest, the environment is not read), or None (file and environment)."""
    cfg = _config_of(config)
    configure_logging(cfg["log.format"], cfg["log.level"])
    problem = driver_problem()
    if problem:
        raise RuntimeEnvironmentError(problem)
    app = Flask("mediator", static_folder=None)
    app.json = AnswerJSON(app)
    app.json.sort_keys = False
    app.json.mimetype = "application/json; charset=utf-8"  # docs/api.md#conventions
    app.config.update(
        API_TITLE="Mediator",
        API_VERSION="1",
        OPENAPI_VERSION="3.1.0",
        OPENAPI_URL_PREFIX="/v1",
        OPENAPI_JSON_PATH="openapi.json",
        MAX_CONTENT_LENGTH=max(cfg["max_body_bytes"], cfg["max_blob_bytes"]),
    )
    if cfg["http.trusted_proxies"]:
        # The client's address (for the 429 of docs/security.md#tokens-and-authentication) from the
        # proxies' X-Forwarded-For.
        n = cfg["http.trusted_proxies"]
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=n)  # type: ignore[method-assign]
    else:
        # First of the hooks: it warns even of a request refused before its view.
        app.before_request(UntrustedProxyWarning())
    context = Context(cfg)
    app.extensions["mediator"] = context
    guard = SchemaGuard(context)
    app.extensions["mediator.schema"] = guard

    from app.api import (
        asks,
        cancel,
        health,
        metrics,
        nodes,
        observe,
        records,
        results,
        submit,
    )
    from app.api.openapi import make_api
    from app.pages.views import init_pages

    api = make_api(app)

    for module in (submit, cancel, results, nodes, asks, observe, records, health, metrics):
        api.register_blueprint(module.blp)
    # the pages for people (docs/pages.md#pages-for-people), the overview at / among them
    init_pages(app)
    register_error_handlers(app)  # after Api(): ours replace smorest's error body

    register_request_hooks(app, guard)
    return app


def register_request_hooks(app: Flask, guard: SchemaGuard) -> None:
    """Around every request: its id (``X-Request-Id``, given or made) bound to every log line, the
    schema check before any ``/v1`` route but the document, the token check (docs/tokens.md#roles),
    and after it the metrics and one log line."""
    from app.api.auth import authorise_request

    @app.before_request
    def _begin() -> None:
        g.started = time.monotonic()
        g.request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex[:16]
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=g.request_id)
        if request.path.startswith("/v1/") and request.path != "/v1/openapi.json":
            guard.check()

    app.before_request(authorise_request)  # after _begin: every /v1 request's token, first

    @app.after_request
    def _end(resp: Response) -> Response:
        resp.headers["X-Request-Id"] = g.get("request_id", "")
        args = request.view_args or {}
        route = request.url_rule.rule if request.url_rule else None
        seconds = time.monotonic() - g.get("started", time.monotonic())
        count_request(request.method, route, resp.status_code, seconds)
        log.info(
            "request",
            method=request.method,
            route=route,
            status=resp.status_code,
            run_id=args.get("run_id") or g.get("run_id"),
            node_id=args.get("node_id"),
            ms=round(seconds * 1000, 1),
        )
        return resp

    @app.teardown_request
    def _pay_owed(exc: BaseException | None) -> None:
        # A wake mark this process could not take after a freeing commit is paid at its next
        # use of the database (docs/queue.md#which-commit-frees-and-its-mark); one flag check
        # when nothing is owed.
        ctx = app.extensions["mediator"]
        if ctx.owed.is_set() and not g.get("database_failed"):
            pay_owed(ctx)


def startup(app: Flask) -> None:
    """Once per serving process, after fork: verify the schema, then wake the queue (wake
    point 6 of docs/design.md#wake-points: a worker that crashed between a commit and its wake is
    replaced by one that scans). Failure is logged and start-up continues."""
    guard: SchemaGuard = app.extensions["mediator.schema"]
    # The wake is owed before the first check: the check that finds the schema ready pays it,
    # now or, on a schema ops have not migrated yet, on the first request after they did.
    guard.wake_owed = True
    try:
        guard.check()
    except Exception as exc:
        log.error("start-up: schema not ready; serving 503 until it is", reason=str(exc))
        return
    if guard.wake_owed:  # the schema was found ready before start-up ran
        guard.wake_owed = False
        wake_after_commit(app.extensions["mediator"], "start-up")
    # One line per process once its start-up wake is over: an operator (and a test) can tell a
    # worker that serves from one still starting.
    log.info("process ready: schema checked, start-up wake done", pid=os.getpid())


def shutdown(app: Flask) -> None:
    """A serving process stopping (gunicorn's ``worker_exit``): queued webhooks get a few
    seconds to go out, then the pool, the scan-gate connection and the LISTEN thread close."""
    from app.services.notify import flush_webhooks

    unsent = flush_webhooks()
    if unsent:
        log.warning("shutting down with webhooks unsent", unsent=unsent)
    app.extensions["mediator"].close()
    log.info("process shut down: database pool, scan gate and claim listener closed")
