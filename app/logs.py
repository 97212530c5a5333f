"""Structured logs (docs/metrics.md#logs): one JSON object a line in production, readable lines in
development.

Two sources write lines, and both end in the same renderer: the Mediator's own structlog events,
and records of the standard ``logging`` module (gunicorn's error and access logs through
``gunicorn.conf.py``'s ``logconfig_dict``, alembic, SQLAlchemy, Python warnings through
``logging.captureWarnings``). A record of ``logging`` becomes ``{"event": <message>, "logger":
<its name>, "level", "timestamp"}`` and its traceback, if any, an ``exception`` field.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, TextIO

import orjson
import structlog
from structlog.typing import EventDict, Processor, WrappedLogger


def _line(event: Any, **kwargs: Any) -> str:
    """One JSON line: orjson (a request's line cost a hundredth of a placed submit through the
    standard library), the standard library for what orjson refuses."""
    try:
        return orjson.dumps(event, default=kwargs.get("default")).decode()
    except orjson.JSONEncodeError:
        return json.dumps(event, **kwargs)


_json: Processor = structlog.processors.JSONRenderer(serializer=_line)
# What every line ends in; ``configure_logging`` switches it for the whole process, for
# structlog's events and the standard library's records alike.
_renderer: Processor = _json


def _render(logger: WrappedLogger, name: str, event_dict: EventDict) -> Any:
    return _renderer(logger, name, event_dict)


class StderrHandler(logging.StreamHandler[TextIO]):
    """A handler of standard ``logging`` records writing to ``sys.stderr`` as it is at each
    record (a test's capture replaces it), with the Mediator's formatter. ``configure_logging``
    replaces any handler of this class on the root logger, so a gunicorn worker (which inherits
    the master's) and an app built twice in one process never write a record twice."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(stdlib_formatter())

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        """The stream is always the current ``sys.stderr``."""


class StdoutHandler(StderrHandler):
    """The same on ``sys.stdout`` (gunicorn's access log, when it is turned on)."""

    @property
    def stream(self) -> TextIO:
        return sys.stdout

    @stream.setter
    def stream(self, value: Any) -> None:
        """The stream is always the current ``sys.stdout``."""


def stdlib_formatter() -> logging.Formatter:
    """A ``logging.Formatter`` rendering records like the Mediator's own lines (the factory
    ``gunicorn.conf.py`` names in its ``logconfig_dict``)."""
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            _render,
        ],
    )


def configure_logging(fmt: str = "json", level: str = "info") -> None:
    """Both sources, for the whole process: ``fmt`` is ``json`` (production) or ``console``;
    ``level`` the lowest level of the Mediator's events written; other libraries' records are
    written from ``warning`` up, or from ``level`` when it is higher or ``debug`` (gunicorn's own
    loggers keep gunicorn's ``loglevel``)."""
    global _renderer
    _renderer = _json if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    number = getattr(logging, level.upper())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        # One write a line (the line and its newline together): the workers of a gunicorn share
        # one stderr, and print()'s two writes let another process's line in between them.
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, StderrHandler):
            root.removeHandler(handler)
    root.addHandler(StderrHandler())
    # Other libraries' records from warning up: their info lines (alembic's "Context impl" on every
    # schema check, say) are noise, unless one debugs.
    root.setLevel(number if number <= logging.DEBUG else max(number, logging.WARNING))
    logging.captureWarnings(True)  # warnings.warn(...) -> the "py.warnings" logger -> one line


log = structlog.get_logger("mediator")
