"""Wake marks (docs/queue.md, "Which commit frees, and its mark"): every commit that frees a node
takes a mark right after it, before anything else that can fail, and a scan that starts after the
mark covers it. When the mark itself cannot be taken (the database went away between the freeing
commit and ``nextval``), the process owes a mark and a scan, and pays them at its next successful
use of the database (:func:`pay_owed`).

Below the queue's scans and the settle (``app.services.queue`` and ``app.services.settle`` both
take marks), and above the store's ``take_mark``."""

from __future__ import annotations

from app.context import Context
from app.logs import log
from app.store.gate import take_mark


def mark_wake(ctx: Context) -> bool:
    """A wake point's mark, right after its freeing commit. Returns whether it was taken; when it
    was not, the process owes it (``ctx.owed``). A mark taken pays what was owed before it: the
    scan that follows this mark (or the reaper, when that scan is skipped or fails) starts after
    the earlier freeing commit too."""
    try:
        with ctx.db.autocommit() as conn:
            take_mark(conn)
    except Exception:
        ctx.owed.set()
        log.exception("could not take a wake mark; owed until the database answers again")
        return False
    ctx.owed.clear()
    return True
