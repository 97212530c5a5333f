"""What authorisation needs from the database: the node a step is bound to, and the count of an
address's failed authentications (docs/security.md#tokens-and-authentication)."""

from __future__ import annotations

from app.context import Context
from app.store.auth import count_failure
from app.store.steps import step_node


def node_of_step(ctx: Context, run_id: str, seq: int) -> tuple[bool, str | None]:
    """Whether run ``run_id`` has step ``seq``, and the node that step is bound to (None while
    the run waits in the queue)."""
    with ctx.db.read() as s:
        return step_node(s, run_id, seq)


def note_failed_authentication(ctx: Context, address: str) -> bool:
    """Count one failed authentication of ``address`` in the shared count: whether the address
    is now over ``auth.max_failures_per_minute`` (the request is answered 429, not 401). The
    process remembers a blocked address for the rest of its window, so further requests from it
    cost no statement at all."""
    if not ctx.failures.applies_to(address):
        return False
    with ctx.db.begin() as s:
        failures, seconds_left = count_failure(s, address)
    return ctx.failures.note(address, failures, seconds_left)
