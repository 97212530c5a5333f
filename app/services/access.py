"""What authorisation needs from the database: the node a step is bound to. Reads only."""

from __future__ import annotations

from app.context import Context
from app.store.steps import step_node


def node_of_step(ctx: Context, run_id: str, seq: int) -> tuple[bool, str | None]:
    """Whether run ``run_id`` has step ``seq``, and the node that step is bound to (None while
    the run waits in the queue)."""
    with ctx.db.read() as s:
        return step_node(s, run_id, seq)
