"""What both Record stores (the filesystem's and S3's) write the same way: logs cut at their cap
with a note, progress files closed by a cap line, numbers checked, JSON documents and the lines of
``SHA256SUMS`` (docs/design.md#records,
docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log)."""

from __future__ import annotations

import re
from typing import Any

from app.jsonbytes import pretty

SUMS = "SHA256SUMS"
NOTE_RE = re.compile(rb"\n\[mediator: log truncated at \d+ bytes\]\n\Z")
NOTE_TAIL = 80  # bytes; longer than any note
# The line that ends a progress file the cap cut: a JSON line in the transcript, as the original
# fleet's viewers know it (``bytes`` is the cap, not where the file stopped).
_CAPPED_LINE = re.compile(rb'\{"type":"enode\.capped","bytes":\d+\}')
CAPPED_TAIL = 256  # bytes; longer than any cap line and its newline


def _note(cap: int) -> bytes:
    return b"\n[mediator: log truncated at %d bytes]\n" % cap


def needs_note_check(size: int, cap: int, budget: int | None) -> bool:
    """Whether a log of ``size`` bytes may end with the truncation note already: past its cap, or
    cut before by a budget (which leaves it anywhere below the cap)."""
    return size > cap or budget is not None


def log_chunk(size: int, data: bytes, cap: int, budget: int | None) -> tuple[bytes, bool]:
    """What an append of ``data`` writes to a log of ``size`` bytes that does not end with the
    note, and whether it cuts the log: all of it while it fits under ``cap`` and within ``budget``
    more bytes (None: no budget); else what fits, then the note naming where the log was cut."""
    limit = cap if budget is None else min(cap, size + max(0, budget))
    room = max(0, limit - size)
    if len(data) <= room:
        return data, False
    return data[:room] + _note(limit), True


def progress_limit(size: int, limit: int, budget: int | None) -> int:
    """Where a progress file of ``size`` bytes is capped: ``limit``, or ``budget`` more bytes
    when that comes first."""
    return limit if budget is None else min(limit, size + max(0, budget))


def _capped_line(limit: int) -> bytes:
    return b'{"type":"enode.capped","bytes":%d}\n' % limit


def ends_capped(tail: bytes, at_start: bool) -> bool:
    """Whether the last line of a progress file is the cap line. ``tail`` is the file's last bytes;
    ``at_start``: they begin at the start of the file. Judged by the line, not by the size: a chunk
    with no newline within the budget leaves the file below the cap, and already capped."""
    if not tail.endswith(b"\n"):
        return False
    _, nl, last = tail[:-1].rpartition(b"\n")
    if not nl and not at_start:
        return False  # the last line is longer than the tail, so it is not the cap line
    return _CAPPED_LINE.fullmatch(last) is not None


def progress_chunk(size: int, ends_with_newline: bool, data: bytes, limit: int) -> bytes:
    """What to append to a progress file of ``size`` bytes for ``data``: all of it while it fits
    in ``limit``; past that only the whole lines that fit, then the cap line on a line of its own.
    One buffer, written at once, so a reader never sees a half cap line."""
    room = limit - size
    if len(data) <= room:
        return data
    window = data[: max(0, room)]
    keep = window[: window.rfind(b"\n") + 1]  # no half lines; nothing when no newline fits
    closed = keep.endswith(b"\n") if keep else (size == 0 or ends_with_newline)
    return keep + (b"" if closed else b"\n") + _capped_line(limit)


def num(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"bad {what} {value!r}")
    return value


def json_bytes(doc: Any) -> bytes:
    return pretty(doc)


def sums_line(digest: str, name: str) -> str:
    """One line of ``SHA256SUMS`` as ``sha256sum -c`` reads it: a name holding a backslash, a
    newline or a carriage return (a Record from before such names were refused) is escaped and
    the line starts with a backslash, as GNU coreutils writes it."""
    if any(c in name for c in "\\\n\r"):
        escaped = name.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        return f"\\{digest}  {escaped}\n"
    return f"{digest}  {name}\n"
