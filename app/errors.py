"""Domain errors and the one JSON error body of the Mediator (docs/api.md#conventions).

Every handler-made error is ``{"error": {"code": <status>, "reason": "<text>"}}``. Views and services
raise a :class:`MediatorError` subclass; ``register_error_handlers`` turns it, werkzeug's HTTP errors
and anything unexpected into that body. A 500 logs its traceback and never returns it.
"""

from __future__ import annotations

from typing import Any


class MediatorError(Exception):
    """A failure with an HTTP status and a human reason."""

    status: int = 500
    default_reason: str = "internal error"

    def __init__(self, reason: str | None = None, *, headers: dict[str, str] | None = None) -> None:
        self.reason = reason or self.default_reason
        self.headers = headers or {}
        super().__init__(self.reason)

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.reason)


class BadRequest(MediatorError):
    status = 400
    default_reason = "bad request"


class Unauthorized(MediatorError):
    status = 401
    default_reason = "missing or invalid token"


class Forbidden(MediatorError):
    status = 403
    default_reason = "forbidden"


class NotFound(MediatorError):
    status = 404
    default_reason = "not found"


class Conflict(MediatorError):
    status = 409
    default_reason = "conflict"


class NotClaimed(Conflict):
    """A result for a step that is not CLAIMED by the reporting node
    (docs/api.md#post-v1runsrun_idstepsseqresult--report-a-steps-result)."""


class StepNotClaimed(Conflict):
    """A log or blob upload for a step that is not CLAIMED in its current attempt, or that no node
    runs (docs/security.md#runs-records-and-uploads): only the step that makes an artifact writes
    it."""

    default_reason = "step is not claimed"


class NotSealed(Conflict):
    default_reason = "run is not sealed yet"


class Gone(MediatorError):
    status = 410
    default_reason = "run has already finished"


class PayloadTooLarge(MediatorError):
    status = 413
    default_reason = "body exceeds the size limit"


class Unprocessable(MediatorError):
    status = 422
    default_reason = "unprocessable"


class NoCandidate(Unprocessable):
    """The matcher's permanent rejection, or the width cap at submit
    (docs/contract.md#requirements-and-how-runs-are-placed,
    docs/queue.md#on-submit-placed-queued-or-rejected)."""


class TooManyFailures(MediatorError):
    status = 429
    default_reason = "too many failed authentications from this address; try again in a minute"


class QueueFull(MediatorError):
    """A submit that would queue a run of a team already at its ``max_queued`` (docs/teams.md,
    "Queue length"): nothing stored, answered with ``Retry-After``."""

    status = 429
    default_reason = "the team's queue is full"


class Unavailable(MediatorError):
    status = 503
    default_reason = "service unavailable"


class RuntimeEnvironmentError(RuntimeError):
    """The installed libraries are not what the Mediator was built on (a start-up check): one
    line saying what is missing and what to install."""


class ConfigError(Exception):
    """An invalid configuration value; the message is one line naming the key
    (docs/configuration.md#invalid-values)."""


def error_body(status: int, reason: str) -> dict[str, Any]:
    return {"error": {"code": status, "reason": reason}}
