"""Run and step states and their allowed transitions (docs/design.md#states). Tests walk these
tables."""

from __future__ import annotations

from collections.abc import Iterable

QUEUED, RUNNING, VERIFYING, SUCCEEDED, FAILED = (
    "QUEUED",
    "RUNNING",
    "VERIFYING",
    "SUCCEEDED",
    "FAILED",
)
RUN_STATES = (QUEUED, RUNNING, VERIFYING, SUCCEEDED, FAILED)
RUN_FINISHED = (SUCCEEDED, FAILED)
RUN_ALIVE = (QUEUED, RUNNING, VERIFYING)

PENDING, CLAIMED, ASKED, DONE, SKIPPED = "PENDING", "CLAIMED", "ASKED", "DONE", "SKIPPED"
STEP_STATES = (PENDING, CLAIMED, ASKED, DONE, FAILED, SKIPPED)
STEP_OPEN = (PENDING, CLAIMED, ASKED)
STEP_SETTLED = (DONE, SKIPPED)  # a need in one of these states is met

STEP_KINDS = ("run", "agent", "ask", "acquire")
# The kinds a node runs, and so the only steps whose artifacts a node may upload
# (docs/security.md#runs-records-and-uploads): the Mediator writes what the others produce (an ask's
# answer, an acquire's outcome) itself.
NODE_KINDS = ("run", "agent")

# A rejected submit is born FAILED; DRY_RUN exists only on the wire.
RUN_TRANSITIONS: dict[str | None, frozenset[str]] = {
    None: frozenset({QUEUED, RUNNING, FAILED}),
    QUEUED: frozenset({RUNNING, FAILED}),
    RUNNING: frozenset({VERIFYING, FAILED}),
    VERIFYING: frozenset({SUCCEEDED, FAILED}),
    SUCCEEDED: frozenset(),
    FAILED: frozenset(),
}

STEP_TRANSITIONS: dict[str, frozenset[str]] = {
    PENDING: frozenset({CLAIMED, ASKED, DONE, SKIPPED, FAILED}),
    CLAIMED: frozenset({DONE, FAILED, PENDING}),  # PENDING: a rollback, attempt + 1
    ASKED: frozenset({DONE, FAILED, PENDING}),
    DONE: frozenset({PENDING}),
    FAILED: frozenset({PENDING}),
    SKIPPED: frozenset({PENDING}),
}


def run_may_become(old: str | None, new: str) -> bool:
    return new in RUN_TRANSITIONS.get(old, frozenset())


def step_may_become(old: str, new: str) -> bool:
    return new in STEP_TRANSITIONS.get(old, frozenset())


class IllegalTransition(RuntimeError):
    """A guarded write asks for a change the tables above forbid: a bug in the Mediator, never a
    caller's mistake, so it fails loudly where the state is written."""


def check_run_change(from_states: Iterable[str | None], to_state: str) -> None:
    """Raise :class:`IllegalTransition` unless every state of the write's guard may become
    ``to_state`` (docs/design.md#states)."""
    bad = [old for old in from_states if not run_may_become(old, to_state)]
    if bad:
        raise IllegalTransition(f"a run may not go from {', '.join(map(str, bad))} to {to_state}")


def check_step_change(from_states: Iterable[str], to_state: str) -> None:
    """Raise :class:`IllegalTransition` unless every state of the write's guard may become
    ``to_state`` (docs/design.md#states)."""
    bad = [old for old in from_states if not step_may_become(old, to_state)]
    if bad:
        raise IllegalTransition(f"a step may not go from {', '.join(bad)} to {to_state}")
