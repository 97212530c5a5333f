"""Run and step states and their allowed transitions (SPEC §8). Tests walk these tables."""

from __future__ import annotations

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
# The kinds a node runs, and so the only steps whose artifacts a node may upload (SPEC §20.3): the
# Mediator writes what the others produce (an ask's answer, an acquire's outcome) itself.
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
