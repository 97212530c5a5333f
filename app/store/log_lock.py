"""The lock that orders appends to one step log across every process and host
(docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log)."""

from __future__ import annotations

import hashlib

from sqlalchemy import func, select
from sqlalchemy.orm import Session

# The two-int4 advisory-lock space, which never overlaps the bigint keys of the scan gate and the
# reaper; the first key names the use ("MLog"), the second the log.
LOG_LOCK_CLASS = 0x4D4C6F67


def log_lock_key(run_id: str, seq: int, name: str) -> int:
    """A signed 32-bit key of (run, seq, name). Two logs that share a key only wait for each
    other; nothing else follows from it."""
    digest = hashlib.sha256(f"{run_id}\x00{seq}\x00{name}".encode("utf-8", "surrogatepass"))
    return int.from_bytes(digest.digest()[:4], "big", signed=True)


def lock_log(s: Session, run_id: str, seq: int, name: str) -> None:
    """``pg_advisory_xact_lock`` on the log's key: every append to (run, seq, name), the final log
    and its progress alike, waits here for the one before it, whichever process or host holds it;
    the lock ends with the caller's transaction, so it is never left behind by a crash."""
    s.execute(select(func.pg_advisory_xact_lock(LOG_LOCK_CLASS, log_lock_key(run_id, seq, name))))
