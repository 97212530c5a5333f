"""Failed authentications by client address (docs/security.md#tokens-and-authentication): one row
per address, shared by every serving process and host."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session

WINDOW_SECONDS = 60

# One statement: a failure in a window older than a minute starts a new window. The row lock of
# the upsert serialises the processes counting the same address, so no failure is lost.
_COUNT_FAILURE = text(
    """
    INSERT INTO auth_failures AS f (address, window_start, failures)
    VALUES (:address, now(), 1)
    ON CONFLICT (address) DO UPDATE SET
        failures = CASE WHEN f.window_start <= now() - make_interval(secs => :window)
                        THEN 1 ELSE f.failures + 1 END,
        window_start = CASE WHEN f.window_start <= now() - make_interval(secs => :window)
                            THEN now() ELSE f.window_start END
    RETURNING f.failures,
              extract(epoch FROM f.window_start + make_interval(secs => :window) - now())
    """
)


def count_failure(s: Session, address: str) -> tuple[int, float]:
    """Count one failed authentication of ``address``: the failures of its current window, this
    one included, and the seconds left in that window (database clock)."""
    failures, left = s.execute(_COUNT_FAILURE, {"address": address, "window": WINDOW_SECONDS}).one()
    return int(failures), max(0.0, float(left))


def forget_old_failures(s: Session) -> int:
    """Delete the rows of windows that ended more than a minute ago (the reaper's pass)."""
    result = s.execute(
        text("DELETE FROM auth_failures WHERE window_start < now() - make_interval(secs => :w)"),
        {"w": 2 * WINDOW_SECONDS},
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]
