"""The filesystem Record store: one directory per run under ``records.root`` (SPEC §11), which several
hosts may share on one filesystem."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from app.records.interface import RecordSealed, check_name, record_dir_name
from app.records.tarstream import Member, stat_tarinfo, tar_chunks

SUMS = "SHA256SUMS"
_TMP_PREFIX = ".tmp-"
_NOTE_RE = re.compile(rb"\n\[mediator: log truncated at \d+ bytes\]\n\Z")
_NOTE_TAIL = 80  # bytes; longer than any note
_CHUNK = 64 * 1024


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


def _note(cap: int) -> bytes:
    return b"\n[mediator: log truncated at %d bytes]\n" % cap


def _num(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"bad {what} {value!r}")
    return value


def _json_bytes(doc: Any) -> bytes:
    return json.dumps(doc, indent=2, sort_keys=True, default=str).encode() + b"\n"


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _walk(d: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every directory and regular file below ``d`` (not ``d`` itself), sorted, parents before
    their contents; symlinks and other special files are skipped and never followed."""
    for entry in sorted(os.scandir(d), key=lambda e: e.name):
        p = Path(entry.path)
        st = os.lstat(p)
        if stat.S_ISDIR(st.st_mode):
            yield p, st
            yield from _walk(p)
        elif stat.S_ISREG(st.st_mode):
            yield p, st


class FilesystemRecords:
    """The local filesystem backend; several hosts may share ``root`` on one filesystem.

    Writers of logs/blobs/steps hold a shared ``flock`` on the record directory, ``seal`` holds it
    exclusively, so nothing lands in a Record between its checksum and its chmod."""

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

    # -- paths ---------------------------------------------------------------------------------

    def _log_path(self, run_id: str, seq: int, name: str) -> Path:
        return self.path(run_id) / "logs" / f"{_num(seq, 'seq'):02d}-{check_name(name)}.log"

    def _blob_path(self, run_id: str, seq: int, attempt: int, name: str) -> Path:
        s, a = _num(seq, "seq"), _num(attempt, "attempt")
        return self.path(run_id) / "blobs" / f"{s:02d}.{a}-{check_name(name)}"

    def _step_path(self, run_id: str, seq: int, step_id: str) -> Path:
        return self.path(run_id) / "steps" / f"{_num(seq, 'seq'):02d}-{check_name(step_id)}.json"

    # -- locking / state -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _dir_lock(self, run_id: str, exclusive: bool) -> Iterator[Path]:
        d = self.path(run_id)
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield d
        finally:
            os.close(fd)  # releases the lock

    @contextlib.contextmanager
    def _writing(self, run_id: str) -> Iterator[Path]:
        """Shared lock + refusal once the Record is sealed (or a seal has begun: SHA256SUMS)."""
        with self._dir_lock(run_id, exclusive=False) as d:
            if self.is_sealed(run_id) or (d / SUMS).exists():
                raise RecordSealed(f"record of run {run_id!r} is sealed")
            yield d

    def exists(self, run_id: str) -> bool:
        return self.path(run_id).is_dir()

    def is_sealed(self, run_id: str) -> bool:
        d = self.path(run_id)
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            return False
        return (
            stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o555 and (d / SUMS).is_file()
        )

    # -- logs ----------------------------------------------------------------------------------

    def append_log(self, run_id: str, seq: int, name: str, data: bytes, cap: int) -> int:
        """Append to ``logs/NN-<name>.log`` up to ``cap`` bytes, then one truncation note; later
        appends write nothing. Returns the log's total length after this append."""
        path = self._log_path(run_id, seq, name)
        data = bytes(data)
        with self._writing(run_id):
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                size = os.fstat(fd).st_size
                if size > cap:
                    rfd = os.open(path, os.O_RDONLY)
                    try:
                        start = max(0, size - _NOTE_TAIL)
                        tail = os.pread(rfd, size - start, start)
                    finally:
                        os.close(rfd)
                    if _NOTE_RE.search(tail):
                        return size  # already truncated
                if not data:
                    return size
                room = max(0, cap - size)
                out = data if len(data) <= room else data[:room] + _note(cap)
                view = memoryview(out)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                return size + len(out)
            finally:
                os.close(fd)

    def read_log(
        self, run_id: str, seq: int, name: str, offset: int, limit: int = 1 << 20
    ) -> bytes:
        """Bytes from ``offset``, at most ``limit``; when more remain, cut after the last newline
        within the limit (if any). Missing log or offset past the end: ``b""``."""
        path = self._log_path(run_id, seq, name)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"bad offset {offset!r}")
        if limit <= 0:
            return b""
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return b""
        try:
            chunk = os.pread(fd, limit + 1, offset)
        finally:
            os.close(fd)
        if len(chunk) > limit:
            chunk = chunk[:limit]
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                chunk = chunk[: nl + 1]
        return chunk

    # -- blobs / steps ---------------------------------------------------------------------------

    def put_blob(self, run_id: str, seq: int, attempt: int, name: str, data: bytes) -> str:
        """Atomic write of ``blobs/NN.A-<name>``; returns the sha256 hex of ``data``."""
        path = self._blob_path(run_id, seq, attempt, name)
        data = bytes(data)
        with self._writing(run_id):
            write_atomic(path, data)
        return hashlib.sha256(data).hexdigest()

    def read_blob(self, run_id: str, seq: int, attempt: int, name: str) -> bytes | None:
        path = self._blob_path(run_id, seq, attempt, name)
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def write_step(self, run_id: str, seq: int, step_id: str, doc: dict[str, Any]) -> None:
        path = self._step_path(run_id, seq, step_id)
        with self._writing(run_id):
            write_atomic(path, _json_bytes(doc))

    # -- seal ----------------------------------------------------------------------------------

    def seal(
        self,
        run_id: str,
        *,
        verdict: dict[str, Any],
        steps: list[tuple[int, str, dict[str, Any]]],
        events: list[dict[str, Any]],
        manifest_update: dict[str, Any],
    ) -> None:
        """Write verdict, steps, events and the final manifest, then SHA256SUMS, then chmod files
        0444 and directories 0555 (the Record directory last, which marks the seal complete).
        A sealed Record is left alone; a half-done seal is undone and done again."""
        step_paths = [(self._step_path(run_id, s, i), doc) for s, i, doc in steps]
        with self._dir_lock(run_id, exclusive=True) as d:
            if self.is_sealed(run_id):
                return
            self._unseal(d)
            for sub in ("steps", "logs", "blobs"):
                (d / sub).mkdir(exist_ok=True)
            write_atomic(d / "verdict.json", _json_bytes(verdict))
            for path, doc in step_paths:
                write_atomic(path, _json_bytes(doc))
            write_atomic(d / "events.json", _json_bytes(events))
            try:
                manifest = json.loads((d / "manifest.json").read_bytes())
                if not isinstance(manifest, dict):
                    manifest = {}
            except (FileNotFoundError, ValueError):
                manifest = {}
            manifest.update(manifest_update)
            write_atomic(d / "manifest.json", _json_bytes(manifest))
            lines = []
            for p, st in _walk(d):
                rel = p.relative_to(d).as_posix()
                if stat.S_ISREG(st.st_mode) and rel != SUMS:
                    lines.append(f"{_sha256_file(p)}  {rel}\n")
            lines.sort(key=lambda line: line.split("  ", 1)[1])
            write_atomic(d / SUMS, "".join(lines).encode())
            entries = list(_walk(d))
            for p, st in entries:
                if stat.S_ISREG(st.st_mode):
                    os.chmod(p, 0o444)
            for p, st in reversed(entries):  # deepest directories first
                if stat.S_ISDIR(st.st_mode):
                    os.chmod(p, 0o555)
            os.chmod(d, 0o555)

    @staticmethod
    def _unseal(d: Path) -> None:
        """Undo a half-done seal: directories writable, files 0644, no SHA256SUMS, no temp files."""
        os.chmod(d, 0o755)
        stack = [d]
        while stack:
            cur = stack.pop()
            for entry in os.scandir(cur):
                p = Path(entry.path)
                st = os.lstat(p)
                if stat.S_ISDIR(st.st_mode):
                    os.chmod(p, 0o755)
                    stack.append(p)
                elif stat.S_ISREG(st.st_mode):
                    if entry.name.startswith(_TMP_PREFIX):
                        os.unlink(p)
                    elif stat.S_IMODE(st.st_mode) != 0o644:
                        os.chmod(p, 0o644)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(d / SUMS)

    # -- export --------------------------------------------------------------------------------

    def tar_stream(self, run_id: str) -> Iterator[bytes]:
        """The Record as an uncompressed tar (``run-<dir>/…``, modes as on disk), produced chunk by
        chunk. Raises FileNotFoundError at once when there is no Record."""
        d = self.path(run_id)
        if not d.is_dir():
            raise FileNotFoundError(str(d))
        return tar_chunks(_tar_members(d, "run-" + d.name))


def _tar_members(d: Path, top: str) -> Iterator[Member]:
    """The directory ``d`` and everything below it as tar members under ``top``; each is looked at
    (``lstat``) only when its turn comes, so a header tells what is on disk as it is written."""
    links: dict[tuple[int, int], str] = {}
    paths = [d] + [p for p, _st in _walk(d)]
    for p in paths:
        rel = p.relative_to(d).as_posix()
        arcname = top if rel == "." else f"{top}/{rel}"
        info = stat_tarinfo(arcname, os.lstat(p), links)
        if info is None:  # no longer a directory or regular file: skipped, as the walk does
            continue
        yield Member(info, _opener(p) if info.isreg() else None)


def _opener(path: Path) -> Callable[[], BinaryIO]:
    return lambda: open(path, "rb")
