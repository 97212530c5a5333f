"""Records: one directory per run under ``records.root`` (SPEC §11), behind a small interface so an
object-store backend can follow (SPEC §17)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Protocol

_SAFE = re.compile(r"^[A-Za-z0-9._:@-]{1,120}$")


def record_dir_name(run_id: str) -> str:
    """A directory name that cannot escape the root: the run id itself when it is plainly safe,
    else a hash of it (no ``/``, ``..``, NUL)."""
    if _SAFE.match(run_id) and run_id not in {".", ".."} and not run_id.startswith("."):
        return run_id
    return "run-" + hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def write_atomic(path: Path, data: bytes) -> None:
    """Temp file in the same directory + rename: readers see the old bytes or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


class RecordStore(Protocol):
    def open(self, run_id: str, manifest: dict[str, Any]) -> None: ...


class FilesystemRecords:
    """The local filesystem backend; several hosts may share ``root`` on one filesystem."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, run_id: str) -> Path:
        return self.root / record_dir_name(run_id)

    def open(self, run_id: str, manifest: dict[str, Any]) -> None:
        """Open the run's Record: its directory and ``manifest.json``. Idempotent, and tolerant of a
        directory left by a rolled-back attempt (it is simply written again)."""
        d = self.path(run_id)
        for sub in ("steps", "logs", "blobs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        body = json.dumps(manifest, indent=2, sort_keys=True, default=str).encode()
        write_atomic(d / "manifest.json", body + b"\n")
