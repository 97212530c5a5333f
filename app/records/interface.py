"""What the services ask of a Record store (docs/design.md#records), whatever backend holds the
Records, and the rules every backend applies alike: the names a caller may choose and where a run's
Record lives.

A store is addressed by a run's Record *location*, never by its run id: the location is chosen
once, when the run is created, and kept on its row (docs/configuration.md#where-records-are-kept),
so a rule that changes never moves a Record and no run id can name another run's Record."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol, runtime_checkable

from app.errors import Unavailable
from app.names import NAME_CHARACTERS

# A run id that is its Record's location as it is: one file name in the run-id alphabet
# (docs/contract.md#top-level, which has no "_"), short enough for any filesystem, and never a dot
# file. Every pattern here is used with fullmatch: "$" would let a trailing newline through.
_PLAIN = re.compile(r"[A-Za-z0-9.:@-]{1,120}")
# Every other run id is hashed under this directory, which no run id can be
# (docs/configuration.md#where-records-are-kept).
HASHED_DIR = "_h"
_HASHED = re.compile(r"_h/[0-9a-f]{64}")
# The rule before locations were kept on the row: plain names (this alphabet, a "_" included),
# else "run-" and the first 40 hex digits of the id's sha256 -- which a run id can be itself.
_LEGACY_PLAIN = re.compile(f"{NAME_CHARACTERS}{{1,120}}")
_LEGACY_HASHED = re.compile(r"run-[0-9a-f]{40}")


class RecordSealed(Exception):
    """A write (log, blob, step) into a Record that is already sealed."""


class RecordStoreUnavailable(Unavailable):
    """The store that holds the Records cannot be reached or refuses to work (an object store that
    is down, a bucket that is missing, credentials that are refused): a 503 for the request that
    needs it, and a seal that is left to the reaper's next pass. Nothing is half-written: a write
    either happened whole or not at all, and a seal is complete only once its marker is written."""

    default_reason = "record store unavailable"


class LogState(NamedTuple):
    """What a log viewer needs besides the bytes: the file's whole length (the next ``from``), the
    attempt its bytes belong to (0 for the appended log, which has none), and whether the cap cut
    it (it will not grow again)."""

    total: int
    attempt: int
    capped: bool


@runtime_checkable
class RecordStore(Protocol):
    """The Record store as the services use it (``ctx.records``), addressed by a run's Record
    location (``location_of`` its row). Locations pass ``check_location`` and names (log, blob,
    step id) ``check_name``, and seq/attempt are non-negative ints, else ValueError; a write into
    a sealed Record raises RecordSealed; a store that cannot be reached raises
    RecordStoreUnavailable."""

    def open(self, location: str, manifest: dict[str, Any]) -> None:
        """Open the run's Record with its manifest; idempotent (the manifest is written again)."""
        ...

    def exists(self, location: str) -> bool:
        """Whether the run has a Record (a rejected submit has none)."""
        ...

    def append_log(
        self, location: str, seq: int, name: str, data: bytes, cap: int, budget: int | None = None
    ) -> LogState:
        """Append to the step's log up to ``cap`` bytes and at most ``budget`` more than it holds
        (None: no budget), then one truncation note naming where it was cut; a log that ends with
        the note takes nothing more. Returns the log's state after this append: its total length,
        attempt 0, and whether the note ends it."""
        ...

    def read_log(
        self, location: str, seq: int, name: str, offset: int, limit: int = 1 << 20
    ) -> bytes:
        """At most ``limit`` bytes from ``offset``, cut after a newline when more remain;
        ``b""`` for a missing log or an offset past its end."""
        ...

    def log_slice(
        self, location: str, seq: int, name: str, offset: int, limit: int = 1 << 20
    ) -> tuple[bytes, LogState]:
        """``read_log`` with the log's state as it was read: its total length, attempt 0 and
        whether the truncation note ends it. A missing log is ``(b"", (0, 0, False))``."""
        ...

    def put_progress(
        self,
        location: str,
        seq: int,
        name: str,
        attempt: int,
        data: bytes,
        limit: int,
        budget: int | None = None,
    ) -> LogState:
        """Store a progress chunk of the step's log, kept apart from the appended log and never
        sealed. Chunks of one attempt are appended, up to ``limit`` bytes of whole lines (or
        ``budget`` bytes more than the file holds, when that comes first), then one cap line; a
        chunk of a higher attempt than the stored progress starts it afresh; a chunk of a lower
        attempt is dropped. Returns the state of the progress that is kept."""
        ...

    def read_progress(
        self, location: str, seq: int, name: str, offset: int, limit: int = 1 << 20
    ) -> tuple[bytes, LogState] | None:
        """The highest attempt's progress as ``log_slice`` reads a log, or None when the step has
        no progress under that name (none was put, or the seal dropped it)."""
        ...

    def put_blob(self, location: str, seq: int, attempt: int, name: str, data: bytes) -> str:
        """Store a blob whole (readers see the old bytes or the new); returns its sha256 hex."""
        ...

    def read_blob(
        self, location: str, seq: int, attempt: int, name: str, limit: int | None = None
    ) -> bytes | None:
        """The blob's bytes, or None when there is none; with ``limit``, at most that many from its
        start, and nothing past them is read."""
        ...

    def seal(
        self,
        location: str,
        *,
        verdict: dict[str, Any],
        steps: list[tuple[int, str, dict[str, Any]]],
        events: list[dict[str, Any]],
        manifest_update: dict[str, Any],
    ) -> None:
        """Drop the run's progress, write the verdict, step documents, events and final manifest,
        then SHA256SUMS, then make the Record read-only. Idempotent: a sealed Record is left as it
        is."""
        ...

    def is_sealed(self, location: str) -> bool:
        """Whether the seal is complete."""
        ...

    def tar_stream(self, location: str) -> Iterator[bytes]:
        """The Record as an uncompressed tar under ``run-<location_name>/``, chunk by chunk;
        FileNotFoundError at once when there is no Record."""
        ...

    def delete(self, location: str) -> bool:
        """Remove the run's Record, sealed or not, and its progress, for good (retention,
        docs/retention.md#what-is-pruned-and-what-is-kept). Idempotent: returns whether there was
        anything to remove, and a Record that is already gone, or half gone after a crash, is no
        error. ``exists`` is False as soon as this has begun, even while the bytes are still being
        removed."""
        ...


def _sha256(run_id: str) -> str:
    return hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()


def record_location(run_id: str) -> str:
    """Where a new run's Record lives, kept on its row
    (docs/configuration.md#where-records-are-kept): the run id itself when it is a plain file name,
    else ``_h/`` and the whole sha256 of the id. A run id shaped like the old rule's hashes
    (``run-`` and 40 hex digits) is hashed too, so a new run never lands in the Record of a run
    created before the rule (see :func:`legacy_record_location`)."""
    if (
        _PLAIN.fullmatch(run_id)
        and not run_id.startswith(".")
        and not _LEGACY_HASHED.fullmatch(run_id)
    ):
        return run_id
    return f"{HASHED_DIR}/{_sha256(run_id)}"


def legacy_record_location(run_id: str) -> str:
    """Where a run created before locations were kept on its row has its Record (its row keeps
    none): the run id when it is a plain file name, else ``run-`` and the first 40 hex digits of
    its sha256."""
    if _LEGACY_PLAIN.fullmatch(run_id) and not run_id.startswith("."):
        return run_id
    return "run-" + _sha256(run_id)[:40]


def location_of(run_id: str, stored: str | None) -> str:
    """The Record location of a run from its row: the one kept there, else the old rule's."""
    return stored if stored is not None else legacy_record_location(run_id)


def check_location(location: str) -> str:
    """A Record location (:func:`record_location`, :func:`legacy_record_location`): one plain
    file name, never a dot or ``_`` file, or ``_h/`` and 64 hex digits. It cannot leave the root;
    anything else raises ValueError."""
    if isinstance(location, str) and (
        _HASHED.fullmatch(location)
        or (_LEGACY_PLAIN.fullmatch(location) and not location.startswith((".", "_")))
    ):
        return location
    raise ValueError(f"bad record location {location!r}")


def location_name(location: str) -> str:
    """The last segment of a location: the top directory of the Record's tar is ``run-<it>``."""
    return check_location(location).rpartition("/")[2]


def check_name(name: str) -> str:
    """A file-name component chosen by a caller (log/blob name, step id): one path segment, never
    ``.``/``..``, no separators or NUL. Raises ValueError."""
    if not isinstance(name, str) or not name or name in {".", ".."}:
        raise ValueError(f"bad name {name!r}")
    if "/" in name or "\\" in name or "\x00" in name:
        raise ValueError(f"bad name {name!r}")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"bad name {name!r}") from None
    if len(encoded) > 200:
        raise ValueError("name too long")
    return name
