"""Records: one directory per run under ``records.root`` (SPEC §11), behind a small interface so an
object-store backend can follow (SPEC §17)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import stat
import tarfile
import tempfile
from collections.abc import Iterator
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


class RecordSealed(Exception):
    """A write (log, blob, step) into a Record that is already sealed."""


class RecordStore(Protocol):
    def open(self, run_id: str, manifest: dict[str, Any]) -> None: ...

    def exists(self, run_id: str) -> bool: ...

    def append_log(self, run_id: str, seq: int, name: str, data: bytes, cap: int) -> int: ...

    def read_log(
        self, run_id: str, seq: int, name: str, offset: int, limit: int = 1 << 20
    ) -> bytes: ...

    def put_blob(self, run_id: str, seq: int, attempt: int, name: str, data: bytes) -> str: ...

    def read_blob(self, run_id: str, seq: int, attempt: int, name: str) -> bytes | None: ...

    def write_step(self, run_id: str, seq: int, step_id: str, doc: dict[str, Any]) -> None: ...

    def seal(
        self,
        run_id: str,
        *,
        verdict: dict[str, Any],
        steps: list[tuple[int, str, dict[str, Any]]],
        events: list[dict[str, Any]],
        manifest_update: dict[str, Any],
    ) -> None: ...

    def is_sealed(self, run_id: str) -> bool: ...

    def tar_stream(self, run_id: str) -> Iterator[bytes]: ...


SUMS = "SHA256SUMS"
_TMP_PREFIX = ".tmp-"
_NOTE_RE = re.compile(rb"\n\[mediator: log truncated at \d+ bytes\]\n\Z")
_NOTE_TAIL = 80  # bytes; longer than any note
_CHUNK = 64 * 1024


def _note(cap: int) -> bytes:
    return b"\n[mediator: log truncated at %d bytes]\n" % cap


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


class _Sink(io.RawIOBase):
    """Where ``tarfile`` writes; the generator drains what accumulates."""

    def __init__(self) -> None:
        super().__init__()
        self._chunks: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:  # type: ignore[override]
        data = bytes(b)
        if data:
            self._chunks.append(data)
        return len(data)

    def drain(self) -> bytes:
        out = b"".join(self._chunks)
        self._chunks.clear()
        return out


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
        return self._tar_chunks(d, "run-" + d.name)

    @staticmethod
    def _tar_chunks(d: Path, top: str) -> Iterator[bytes]:
        sink = _Sink()
        with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            assert tar.fileobj is not None
            entries = [(d, os.lstat(d))] + list(_walk(d))
            for p, _st in entries:
                rel = p.relative_to(d).as_posix()
                arcname = top if rel == "." else f"{top}/{rel}"
                info = tar.gettarinfo(str(p), arcname=arcname)
                if info.isdir():
                    tar.addfile(info)
                else:
                    # The header, then the file body written through in chunks (what
                    # ``TarFile.addfile`` does, without holding a whole file in memory).
                    header = info.tobuf(tar.format, tar.encoding, tar.errors)
                    tar.fileobj.write(header)
                    tar.offset += len(header)
                    remaining = info.size
                    with open(p, "rb") as f:
                        while remaining:
                            chunk = f.read(min(_CHUNK, remaining))
                            if not chunk:  # shrank meanwhile: pad to the declared size
                                chunk = tarfile.NUL * min(_CHUNK, remaining)
                            tar.fileobj.write(chunk)
                            remaining -= len(chunk)
                            out = sink.drain()
                            if out:
                                yield out
                    blocks, rem = divmod(info.size, tarfile.BLOCKSIZE)
                    if rem:
                        tar.fileobj.write(tarfile.NUL * (tarfile.BLOCKSIZE - rem))
                        blocks += 1
                    tar.offset += blocks * tarfile.BLOCKSIZE
                out = sink.drain()
                if out:
                    yield out
        out = sink.drain()
        if out:
            yield out
