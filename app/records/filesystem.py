"""The filesystem Record store: one directory per run under ``records.root``
(docs/design.md#records), at the run's Record location (its id, or ``_h/<sha256>``;
docs/configuration.md#where-records-are-kept), which several hosts may share on one filesystem.
Progress chunks of live logs (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log) live
beside the Records, under ``records.root/.progress/<location>/``, so that neither the seal nor the
tar ever sees them (a location never starts with a dot). The root must tell names apart by case, as
run ids are."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from app.errors import ConfigError
from app.records.common import (
    CAPPED_TAIL,
    NOTE_RE,
    NOTE_TAIL,
    SUMS,
    ends_capped,
    json_bytes,
    log_chunk,
    needs_note_check,
    num,
    progress_chunk,
    progress_limit,
    sums_line,
)
from app.records.interface import LogState, RecordSealed, check_location, check_name, location_name
from app.records.tarstream import Member, stat_tarinfo, tar_chunks

PROGRESS = ".progress"
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = (
    ".deleting-"  # a Record being deleted (never a Record: those never start with a dot)
)
_CHUNK = 64 * 1024


def write_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Temp file in the same directory + rename: readers see the old bytes or the new, never half.
    ``durable``: fsync before the rename (a write whose content the database cannot give again)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _syncfs() -> Callable[[int], int] | None:
    """libc's ``syncfs`` (Linux): one call writes out everything the file system of a descriptor
    holds dirty. None where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syncfs: Callable[[int], int] = libc.syncfs
        return syncfs
    except (OSError, AttributeError):
        return None


_SYNCFS = _syncfs()


def flush_together(directory: Path, written: list[Path]) -> None:
    """Make ``written`` (files of ``directory``, written without an fsync of their own) and the
    directory's entries durable at once: one ``syncfs`` of their file system where the platform
    has it, else an fsync of each file and then of the directory (docs/design.md#records)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        if _SYNCFS is not None and _SYNCFS(fd) == 0:
            return
        for path in written:
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        os.fsync(fd)
    finally:
        os.close(fd)


def _slice(fd: int, size: int, offset: int, limit: int) -> bytes:
    """At most ``limit`` bytes from ``offset`` of the first ``size`` bytes of ``fd``, cut after
    the last newline within the limit when more remain (if there is one)."""
    if limit <= 0 or offset >= size:
        return b""
    chunk = os.pread(fd, min(limit + 1, size - offset), offset)
    if len(chunk) > limit:
        chunk = chunk[:limit]
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            chunk = chunk[: nl + 1]
    return chunk


def _tail(fd: int, size: int, n: int) -> tuple[bytes, bool]:
    start = max(0, size - n)
    return os.pread(fd, size - start, start), start == 0


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_sealing(path: str, data: bytes) -> None:
    """Write ``path`` (temp file + rename, no fsync) under the Record's exclusive lock: no other
    writer can be at work in the directory, so the temp file's name is fixed (a leftover of a
    crash is overwritten, or removed by the seal's walk)."""
    head, tail = os.path.split(path)
    tmp = os.path.join(head, _TMP_PREFIX + tail)
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _seal_walk(top: str) -> tuple[list[str], list[str]]:
    """The Record's regular files (but SHA256SUMS) and its directories, as paths relative to
    ``top``, sorted, parents before their contents; temp files left by a crash are removed,
    symlinks and special files skipped. One ``scandir`` a directory, no ``stat`` of an entry."""
    files: list[str] = []
    dirs: list[str] = []

    def walk(rel: str) -> None:
        with os.scandir(os.path.join(top, rel) if rel else top) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            name = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_dir(follow_symlinks=False):
                dirs.append(name)
                walk(name)
            elif entry.is_file(follow_symlinks=False):
                if entry.name.startswith(_TMP_PREFIX):
                    os.unlink(entry.path)
                elif name != SUMS:
                    files.append(name)

    walk("")
    return files, dirs


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

    def path(self, location: str) -> Path:
        return self.root / check_location(location)

    def refuse_case_insensitive_root(self, probe: str | None = None) -> None:
        """Start-up (docs/configuration.md#where-records-are-kept): make the root if need be, create
        a file with a lower-case name in it and look for it by the upper-case name. Found: the
        filesystem folds case, and run ids that differ only by case (``Boot-1``, ``boot-1``) would
        share a Record there, so the root is refused with a :class:`ConfigError` naming it.
        ``probe``: the file's name (tests choose it; a random one otherwise). The probe is removed
        either way."""
        name = probe or f".case-probe-{secrets.token_hex(8)}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise ConfigError(
                f"records.root: cannot write in {self.root}: {exc.strerror}"
            ) from None
        try:
            made = os.fstat(fd)
            try:
                found = os.stat(self.root / name.upper())
            except OSError:
                return
            if (found.st_dev, found.st_ino) == (made.st_dev, made.st_ino):
                raise ConfigError(
                    f"records.root: {self.root} is on a filesystem that ignores case ({name} is "
                    f"found as {name.upper()}); run ids that differ only by case would share a "
                    "Record there: give a directory on a case-sensitive filesystem"
                )
        finally:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.root / name)

    def open(self, location: str, manifest: dict[str, Any]) -> None:
        """Open the run's Record: its directory and ``manifest.json``, one small write. Idempotent,
        and tolerant of a directory left by a rolled-back attempt (it is simply written again).
        Not fsynced: the run's row holds everything the manifest says and the seal writes it
        again, durably, from there; ``steps``, ``logs`` and ``blobs`` appear with their first
        file."""
        directory, body = self.path(location), json_bytes(manifest)
        try:
            directory.mkdir()
        except OSError:  # a rolled-back attempt's, opened again, or its parents not made yet
            write_atomic(directory / "manifest.json", body, durable=False)
            return
        # A new directory: nobody reads the Record of a run that has not committed, so the file
        # is written in place (no temporary file and rename: about 40 % of what opening a
        # Record cost); a crash before the commit leaves a directory the retry writes again.
        fd = os.open(directory / "manifest.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    # -- paths ---------------------------------------------------------------------------------

    def _log_path(self, location: str, seq: int, name: str) -> Path:
        return self.path(location) / "logs" / f"{num(seq, 'seq'):02d}-{check_name(name)}.log"

    def _blob_path(self, location: str, seq: int, attempt: int, name: str) -> Path:
        s, a = num(seq, "seq"), num(attempt, "attempt")
        return self.path(location) / "blobs" / f"{s:02d}.{a}-{check_name(name)}"

    def _step_path(self, location: str, seq: int, step_id: str) -> Path:
        return self.path(location) / "steps" / f"{num(seq, 'seq'):02d}-{check_name(step_id)}.json"

    def progress_path(self, location: str) -> Path:
        """Where the run's progress files live: beside the Records, never inside one."""
        return self.root / PROGRESS / check_location(location)

    def _progress_files(self, location: str, seq: int, name: str) -> dict[int, Path]:
        """The progress files of (seq, name) by attempt: ``NN-<name>.<attempt>.log``."""
        d = self.progress_path(location)
        prefix = f"{num(seq, 'seq'):02d}-{check_name(name)}."
        try:
            entries = os.listdir(d)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        out = {}
        for entry in entries:
            middle = entry[len(prefix) : -len(".log")]
            if entry.startswith(prefix) and entry.endswith(".log") and middle.isdigit():
                out[int(middle)] = d / entry
        return out

    # -- locking / state -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _dir_lock(self, location: str, exclusive: bool) -> Iterator[Path]:
        d = self.path(location)
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield d
        finally:
            os.close(fd)  # releases the lock

    @contextlib.contextmanager
    def _writing(self, location: str) -> Iterator[Path]:
        """Shared lock + refusal once the Record is sealed (or a seal has begun: SHA256SUMS)."""
        with self._dir_lock(location, exclusive=False) as d:
            if self.is_sealed(location) or (d / SUMS).exists():
                raise RecordSealed(f"record {location!r} is sealed")
            yield d

    def exists(self, location: str) -> bool:
        return self.path(location).is_dir()

    def is_sealed(self, location: str) -> bool:
        d = self.path(location)
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            return False
        return (
            stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o555 and (d / SUMS).is_file()
        )

    # -- logs ----------------------------------------------------------------------------------

    def append_log(
        self, location: str, seq: int, name: str, data: bytes, cap: int, budget: int | None = None
    ) -> LogState:
        """Append to ``logs/NN-<name>.log`` up to ``cap`` bytes and at most ``budget`` more, then
        one truncation note; later appends write nothing. Returns the log's state after it."""
        path = self._log_path(location, seq, name)
        data = bytes(data)
        with self._writing(location):
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                size = os.fstat(fd).st_size
                if size and needs_note_check(size, cap, budget):
                    rfd = os.open(path, os.O_RDONLY)
                    try:
                        tail, _ = _tail(rfd, size, NOTE_TAIL)
                    finally:
                        os.close(rfd)
                    if NOTE_RE.search(tail):
                        return LogState(size, 0, True)  # already truncated
                out, capped = log_chunk(size, data, cap, budget)
                view = memoryview(out)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                return LogState(size + len(out), 0, capped)
            finally:
                os.close(fd)

    def read_log(
        self, location: str, seq: int, name: str, offset: int, limit: int = 1 << 20
    ) -> bytes:
        """Bytes from ``offset``, at most ``limit``; when more remain, cut after the last newline
        within the limit (if any). Missing log or offset past the end: ``b""``."""
        return self.log_slice(location, seq, name, offset, limit)[0]

    def log_slice(
        self, location: str, seq: int, name: str, offset: int, limit: int = 1 << 20
    ) -> tuple[bytes, LogState]:
        """``read_log`` and the log's length and truncation as they were when it was read; the
        bytes never reach past that length, whatever is appended meanwhile."""
        path = self._log_path(location, seq, name)
        num(offset, "offset")
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return b"", LogState(0, 0, False)
        try:
            size = os.fstat(fd).st_size
            tail, _ = _tail(fd, size, NOTE_TAIL)
            return _slice(fd, size, offset, limit), LogState(size, 0, bool(NOTE_RE.search(tail)))
        finally:
            os.close(fd)

    # -- progress (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log)
    # -------------------------------------------------------------------

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
        """A chunk of ``attempt``'s progress of (seq, name). The first chunk of a higher attempt
        writes a new file atomically and removes the older ones; later chunks of that attempt are
        appended in one write each (readers see a prefix, bounded by the size they looked at); a
        chunk of a lower attempt writes nothing. The file is capped at ``limit`` bytes, or at
        ``budget`` more than it holds when that comes first.

        The shared lock on the Record directory keeps the seal (which drops every progress file)
        out; an exclusive ``flock`` on the run's progress directory orders writers on every host
        that shares the filesystem."""
        num(attempt, "attempt")
        self._progress_files(location, seq, name)  # checks seq and name before anything is made
        data = bytes(data)
        with self._writing(location):
            d = self.progress_path(location)
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                return self._put_progress_locked(location, seq, name, attempt, data, limit, budget)
            finally:
                os.close(fd)

    def _put_progress_locked(
        self,
        location: str,
        seq: int,
        name: str,
        attempt: int,
        data: bytes,
        limit: int,
        budget: int | None,
    ) -> LogState:
        files = self._progress_files(location, seq, name)
        current = max(files, default=None)
        if current is not None and attempt < current:
            state = self._progress_state(files[current], current)
            return state if state is not None else LogState(0, current, False)
        if current is None or attempt > current:
            body = progress_chunk(0, True, data, progress_limit(0, limit, budget))
            path = self.progress_path(location) / f"{seq:02d}-{name}.{attempt}.log"
            write_atomic(path, body)  # 0600, as mkstemp makes it: a raw transcript
            for older, p in files.items():
                if older < attempt:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(p)
            return LogState(len(body), attempt, ends_capped(body, True))
        fd = os.open(files[current], os.O_WRONLY | os.O_APPEND)
        try:
            size = os.fstat(fd).st_size
            rfd = os.open(files[current], os.O_RDONLY)
            try:
                tail, at_start = _tail(rfd, size, CAPPED_TAIL)
            finally:
                os.close(rfd)
            if ends_capped(tail, at_start):
                return LogState(size, attempt, True)  # capped: it never grows again
            cap = progress_limit(size, limit, budget)
            out = progress_chunk(size, tail.endswith(b"\n"), data, cap)
            view = memoryview(out)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            total = size + len(out)
            # ``tail`` ended where ``out`` begins: together they are the file's last bytes.
            return LogState(
                total, attempt, ends_capped((tail + out)[-CAPPED_TAIL:], total <= CAPPED_TAIL)
            )
        finally:
            os.close(fd)

    @staticmethod
    def _progress_state(path: Path, attempt: int) -> LogState | None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            return LogState(size, attempt, ends_capped(*_tail(fd, size, CAPPED_TAIL)))
        finally:
            os.close(fd)

    def read_progress(
        self, location: str, seq: int, name: str, offset: int, limit: int = 1 << 20
    ) -> tuple[bytes, LogState] | None:
        """The highest attempt's progress from ``offset`` (cut as ``read_log`` cuts), with its
        length, attempt and cap as they were when it was read; None when there is none."""
        num(offset, "offset")
        for _ in range(3):  # a newer attempt may remove the file between the listing and the open
            files = self._progress_files(location, seq, name)
            if not files:
                return None
            attempt = max(files)
            try:
                fd = os.open(files[attempt], os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                size = os.fstat(fd).st_size
                capped = ends_capped(*_tail(fd, size, CAPPED_TAIL))
                return _slice(fd, size, offset, limit), LogState(size, attempt, capped)
            finally:
                os.close(fd)
        return None

    def _drop_progress(self, location: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.progress_path(location))

    # -- blobs / steps ---------------------------------------------------------------------------

    def put_blob(self, location: str, seq: int, attempt: int, name: str, data: bytes) -> str:
        """Atomic write of ``blobs/NN.A-<name>``; returns the sha256 hex of ``data``."""
        path = self._blob_path(location, seq, attempt, name)
        data = bytes(data)
        with self._writing(location):
            write_atomic(path, data)
        return hashlib.sha256(data).hexdigest()

    def read_blob(
        self, location: str, seq: int, attempt: int, name: str, limit: int | None = None
    ) -> bytes | None:
        path = self._blob_path(location, seq, attempt, name)
        try:
            with open(path, "rb") as f:
                return f.read() if limit is None else f.read(limit)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def write_step(self, location: str, seq: int, step_id: str, doc: dict[str, Any]) -> None:
        path = self._step_path(location, seq, step_id)
        with self._writing(location):
            write_atomic(path, json_bytes(doc))

    # -- seal ----------------------------------------------------------------------------------

    def seal(
        self,
        location: str,
        *,
        verdict: dict[str, Any],
        steps: list[tuple[int, str, dict[str, Any]]],
        events: list[dict[str, Any]],
        manifest_update: dict[str, Any],
    ) -> None:
        """Drop the run's progress files; write verdict, steps, events and the final manifest,
        then SHA256SUMS, then chmod files 0444 and directories 0555 (the Record directory last,
        which marks the seal complete). A sealed Record is left alone; a half-done seal is undone
        and done again."""
        step_paths = [(self._step_path(location, s, i), doc) for s, i, doc in steps]
        with self._dir_lock(location, exclusive=True) as d:
            # Progress is for live viewing only
            # (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log): it goes first, and
            # writers of it hold the shared lock, so none can come back once the seal has begun.
            self._drop_progress(location)
            if self.is_sealed(location):
                return
            self._unseal(d)  # what a seal that stopped halfway left
            for sub in ("steps", "logs", "blobs"):
                (d / sub).mkdir(exist_ok=True)
            try:
                manifest = json.loads((d / "manifest.json").read_bytes())
                if not isinstance(manifest, dict):
                    manifest = {}
            except (FileNotFoundError, ValueError):
                manifest = {}
            manifest.update(manifest_update)
            # Each file without an fsync of its own: all of them are flushed together once the
            # Record is complete, before the seal returns (and the run is marked sealed). Their
            # sums come from the bytes written; the files written before (logs, blobs) are read.
            top = str(d)
            written: dict[str, bytes] = {
                "verdict.json": json_bytes(verdict),
                **{str(path.relative_to(d)): json_bytes(doc) for path, doc in step_paths},
                "events.json": json_bytes(events),
                "manifest.json": json_bytes(manifest),
            }
            for rel, data in written.items():
                _write_sealing(os.path.join(top, rel), data)
            files, dirs = _seal_walk(top)
            sums = sorted(
                (
                    rel,
                    hashlib.sha256(written[rel]).hexdigest()
                    if rel in written
                    else _sha256_file(Path(top, rel)),
                )
                for rel in files
            )
            _write_sealing(
                os.path.join(top, SUMS), "".join(sums_line(h, rel) for rel, h in sums).encode()
            )
            paths = [os.path.join(top, rel) for rel in files] + [os.path.join(top, SUMS)]
            for path in paths:
                os.chmod(path, 0o444)
            for rel in reversed(dirs):  # deepest directories first
                os.chmod(os.path.join(top, rel), 0o555)
            os.chmod(d, 0o555)
            flush_together(d, [Path(path) for path in paths])

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

    # -- retention -----------------------------------------------------------------------------

    def delete(self, location: str) -> bool:
        """Move the Record directory aside under a dotted name first (one rename: from then on the
        run has no Record, and a crash never leaves a half Record under its name), then remove it
        and the run's progress. A dotted leftover of a crash goes with the next delete of the same
        run. Sealed directories are 0555: each is made writable before its entries go."""
        d = self.path(location)
        # "_h/<hash>" as "_h-<hash>": no run id holds a "_", so no two Records share a trash name.
        trash = self.root / f"{_TRASH_PREFIX}{location.replace('/', '-')}"
        _rmtree(trash)
        try:
            os.chmod(d, 0o755)
            os.replace(d, trash)
            found = True
        except FileNotFoundError:
            found = False
        _rmtree(trash)
        self._drop_progress(location)
        return found

    # -- export --------------------------------------------------------------------------------

    def tar_stream(self, location: str) -> Iterator[bytes]:
        """The Record as an uncompressed tar (``run-<dir>/…``, modes as on disk), produced chunk by
        chunk. Raises FileNotFoundError at once when there is no Record."""
        d = self.path(location)
        if not d.is_dir():
            raise FileNotFoundError(str(d))
        return tar_chunks(_tar_members(d, "run-" + location_name(location)))


def _rmtree(path: Path) -> None:
    """Remove ``path`` and everything below it, read-only (sealed) directories included; symlinks
    are removed, never followed. A missing ``path``, or entries removed meanwhile by another
    deleter, are no error."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    for here, _dirs, _files in os.walk(path):  # top-down; never into a symlinked directory
        with contextlib.suppress(FileNotFoundError):
            os.chmod(here, 0o755)

    def gone_already(func: Any, p: str, exc_info: Any) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    shutil.rmtree(path, onerror=gone_already)


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
