"""The object-store Record backend (``records.backend = s3``): every Record in one bucket of an
S3-compatible store (AWS S3, MinIO, Ceph), shared by every Mediator host
(docs/scaling.md#the-record-store-in-s3).

Layout under ``records.s3.prefix``, for a run whose Record location is ``D`` (its run id, or
``_h/<sha256>``; docs/configuration.md#where-records-are-kept):

- ``D/manifest.json``, ``D/verdict.json``, ``D/events.json``, ``D/steps/NN-<id>.json``,
  ``D/blobs/NN.A-<name>``, ``D/logs/NN-<name>.log``, ``D/SHA256SUMS``: the Record, as the
  filesystem backend lays it out;
- ``D/.chunks/NN-<name>.log/<n>``: the log while the run is live. An object cannot be appended to,
  so each append is a new object numbered one past the last; the log is their concatenation, and
  the seal writes it as ``D/logs/NN-<name>.log``;
- ``.progress/D/NN-<name>/<attempt>/<n>``: progress chunks of live logs, beside the Records and
  never sealed;
- ``D/.sealing``: written first by a seal, after which every write is refused; ``D/.sealed``: the
  seal marker, written last, listing the files and sizes of the sealed Record (the tar reads it).

Appends to one log are ordered by the caller (the services hold the log's advisory lock in the
database, whichever host serves them) and within this process by a lock of its own. The chunk
number comes from listing the chunks, which S3 answers consistently with every completed write, and
each chunk is created with ``If-None-Match: *``: a writer that was not ordered gets 412 instead of
overwriting another's chunk, lists again and takes the next number. So no two appends share a
number and no number is skipped, on any host.

Credentials come from the standard AWS chain (environment, shared files, instance roles), never
from the Mediator's configuration. An unreachable store is :class:`RecordStoreUnavailable`."""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import io
import json
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, TypeVar, cast

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

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
from app.records.interface import (
    LogState,
    RecordSealed,
    RecordStoreUnavailable,
    check_location,
    check_name,
    location_name,
)
from app.records.tarstream import Member, tar_chunks

SEALING = ".sealing"
SEALED = ".sealed"
CHUNKS = ".chunks"
PROGRESS = ".progress"
_DIGITS = 10  # chunk and attempt numbers in keys, zero-padded so that keys sort as numbers
_READ = 64 * 1024
_DELETE_BATCH = 1000  # the most keys one DeleteObjects takes
_COLLISIONS = 50  # create-only PUTs lost in a row before an append gives up
_STRIPES = 64
_REMEMBERED = 4096  # logs and progress whose listing a process keeps

F = TypeVar("F", bound=Callable[..., Any])


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _missing(exc: ClientError) -> bool:
    return _status(exc) == 404 and _code(exc) in {"NoSuchKey", "404", "NotFound"}


def _guarded(fn: F) -> F:
    """Any failure to talk to the store becomes RecordStoreUnavailable (a 503 for a request);
    what the caller did wrong (ValueError, RecordSealed) passes as it is."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RecordStoreUnavailable:
            raise
        except (BotoCoreError, ClientError) as exc:
            raise RecordStoreUnavailable(_reason(exc)) from exc
        except Exception as exc:
            # s3transfer wraps the store's error in its own (S3UploadFailedError, ...).
            if type(exc).__module__.startswith(("s3transfer", "boto3")):
                raise RecordStoreUnavailable(_reason(exc)) from exc
            raise

    return cast(F, wrapper)


def _reason(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        return f"record store unavailable: {_code(exc) or _status(exc)}"
    return f"record store unavailable: {type(exc).__name__}"


class _Concatenation(io.RawIOBase):
    """The objects ``keys`` one after another as one readable stream, hashed as it is read; one
    object's body is open at a time."""

    def __init__(self, store: S3Records, keys: list[str]) -> None:
        self.store, self.keys = store, list(keys)
        self.sha = hashlib.sha256()
        self.size = 0
        self._body: Any = None

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        while True:
            if self._body is None:
                if not self.keys:
                    return 0
                self._body = self.store._get(self.keys.pop(0))["Body"]
            data = self._body.read(len(view))
            if data:
                view[: len(data)] = data
                self.sha.update(data)
                self.size += len(data)
                return len(data)
            self._body.close()
            self._body = None

    def close(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None
        super().close()


class S3Records:
    """The S3 backend; ``client`` is a boto3 S3 client (made from the AWS chain when not given)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        client: Any = None,
        multipart_threshold: int = 8 * 1024 * 1024,
    ) -> None:
        if not bucket:
            raise ValueError("records.s3.bucket: must be set when records.backend is s3")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        if client is None:
            config = BotoConfig(
                connect_timeout=5,
                read_timeout=30,
                retries={"max_attempts": 3, "mode": "standard"},
                s3={"addressing_style": "path"} if endpoint_url else None,
            )
            client = boto3.session.Session().client(
                "s3", endpoint_url=endpoint_url or None, config=config
            )
        self.client = client
        self.transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=max(multipart_threshold, 5 * 1024 * 1024),
            max_concurrency=4,
        )
        self._locks = [threading.Lock() for _ in range(_STRIPES)]
        # What this process last listed of the logs and progress it writes to, by prefix: chunks
        # never change once written and are only removed once writes are refused (the seal) or
        # the run is gone (delete), so a writer lists only what came after them.
        self._listed: collections.OrderedDict[str, list[tuple[str, int]]] = (
            collections.OrderedDict()
        )
        self._tails: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._listed_lock = threading.Lock()

    # -- keys ----------------------------------------------------------------------------------

    def _dir(self, location: str) -> str:
        return f"{self.prefix}{check_location(location)}/"

    def _log_file(self, seq: int, name: str) -> str:
        return f"{num(seq, 'seq'):02d}-{check_name(name)}.log"

    def _chunk_prefix(self, location: str, seq: int, name: str) -> str:
        return f"{self._dir(location)}{CHUNKS}/{self._log_file(seq, name)}/"

    def _progress_dir(self, location: str) -> str:
        return f"{self.prefix}{PROGRESS}/{check_location(location)}/"

    def _progress_prefix(self, location: str, seq: int, name: str) -> str:
        return f"{self._progress_dir(location)}{num(seq, 'seq'):02d}-{check_name(name)}/"

    def _blob_key(self, location: str, seq: int, attempt: int, name: str) -> str:
        s, a = num(seq, "seq"), num(attempt, "attempt")
        return f"{self._dir(location)}blobs/{s:02d}.{a}-{check_name(name)}"

    def _step_rel(self, seq: int, step_id: str) -> str:
        return f"steps/{num(seq, 'seq'):02d}-{check_name(step_id)}.json"

    @contextlib.contextmanager
    def _lock(self, key: str) -> Iterator[None]:
        lock = self._locks[int.from_bytes(hashlib.sha256(key.encode()).digest()[:4]) % _STRIPES]
        with lock:
            yield

    # -- object calls ----------------------------------------------------------------------------

    def _get(self, key: str, **kwargs: Any) -> Any:
        return self.client.get_object(Bucket=self.bucket, Key=key, **kwargs)

    def _read(self, key: str) -> bytes | None:
        try:
            body = self._get(key)["Body"]
        except ClientError as exc:
            if _missing(exc):
                return None
            raise
        with contextlib.closing(body):
            return cast(bytes, body.read())

    def _head(self, key: str) -> dict[str, Any] | None:
        try:
            return cast(dict[str, Any], self.client.head_object(Bucket=self.bucket, Key=key))
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise

    def _put(self, key: str, data: bytes, **kwargs: Any) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data, **kwargs)

    def _create(self, key: str, data: bytes) -> bool:
        """Create ``key`` only if no object has it; False when one does (412)."""
        try:
            self._put(key, data, IfNoneMatch="*")
        except ClientError as exc:
            if _status(exc) in {409, 412}:  # 409: a conditional write raced another on it
                return False
            raise
        return True

    def _list(self, prefix: str, after: str | None = None) -> list[tuple[str, int]]:
        """Every (key, size) under ``prefix`` (after the key ``after``), in key order."""
        out: list[tuple[str, int]] = []
        extra = {"StartAfter": after} if after else {}
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix, **extra
        )
        for page in pages:
            out.extend((o["Key"], int(o["Size"])) for o in page.get("Contents", ()))
        return out

    def _list_for_write(self, prefix: str) -> list[tuple[str, int]]:
        """``_list(prefix)`` for a writer holding the prefix's lock: what this process listed
        or wrote before, and whatever the store has after it."""
        with self._listed_lock:
            known = list(self._listed.get(prefix, ()))
        known += self._list(prefix, known[-1][0] if known else None)
        self._remember(prefix, known)
        return known

    def _remember(self, prefix: str, listed: list[tuple[str, int]]) -> None:
        with self._listed_lock:
            self._listed[prefix] = listed
            self._listed.move_to_end(prefix)
            while len(self._listed) > _REMEMBERED:
                self._listed.popitem(last=False)

    def _written(self, prefix: str, key: str, size: int) -> None:
        """A chunk this process has just created under ``prefix``."""
        with self._listed_lock:
            known = self._listed.get(prefix)
            if known is not None and (not known or known[-1][0] < key):
                known.append((key, size))

    def _tail(self, chunks: list[tuple[int, str, int]], size: int) -> bytes:
        """The last ``min(size, CAPPED_TAIL)`` bytes of the concatenation of ``chunks``. They
        depend only on the last chunk's key (what a key holds never changes), so they are kept
        by it."""
        if not chunks:
            return b""
        last = chunks[-1][1]
        with self._listed_lock:
            tail = self._tails.get(last)
        if tail is None:
            tail = self._span(chunks, max(0, size - CAPPED_TAIL), size)
            self._keep_tail(last, tail)
        return tail

    def _keep_tail(self, key: str, tail: bytes) -> None:
        with self._listed_lock:
            self._tails[key] = tail[-CAPPED_TAIL:]
            self._tails.move_to_end(key)
            while len(self._tails) > _REMEMBERED:
                self._tails.popitem(last=False)

    def _forget(self, prefix: str) -> None:
        with self._listed_lock:
            for key in [k for k in self._listed if k.startswith(prefix)]:
                del self._listed[key]

    def _delete_keys(self, keys: list[str]) -> None:
        for i in range(0, len(keys), _DELETE_BATCH):
            batch = [{"Key": k} for k in keys[i : i + _DELETE_BATCH]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    def _numbered(self, prefix: str, writing: bool = False) -> list[tuple[int, str, int]]:
        """The numbered objects directly under ``prefix``: (number, key, size), by number."""
        out = []
        for key, size in self._list_for_write(prefix) if writing else self._list(prefix):
            tail = key[len(prefix) :]
            if tail.isdigit():
                out.append((int(tail), key, size))
        return sorted(out)

    def _span(self, pieces: list[tuple[int, str, int]], start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the concatenation of ``pieces`` (ranged reads of the objects
        that overlap it)."""
        out = bytearray()
        at = 0
        for _n, key, size in pieces:
            lo, hi = max(start, at), min(end, at + size)
            if lo < hi:
                body = self._get(key, Range=f"bytes={lo - at}-{hi - at - 1}")["Body"]
                with contextlib.closing(body):
                    out += body.read()
            at += size
            if at >= end:
                break
        return bytes(out)

    def _slice(
        self, pieces: list[tuple[int, str, int]], size: int, offset: int, limit: int
    ) -> bytes:
        """As the filesystem backend slices: at most ``limit`` bytes from ``offset``, cut after
        the last newline within the limit when more remain."""
        if limit <= 0 or offset >= size:
            return b""
        chunk = self._span(pieces, offset, min(offset + limit + 1, size))
        if len(chunk) > limit:
            chunk = chunk[:limit]
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                chunk = chunk[: nl + 1]
        return chunk

    def _refuse_if_sealing(self, location: str) -> None:
        if self._head(self._dir(location) + SEALING) is not None:
            raise RecordSealed(f"record {location!r} is sealed")

    # -- open / state ----------------------------------------------------------------------------

    @_guarded
    def open(self, location: str, manifest: dict[str, Any]) -> None:
        self._put(self._dir(location) + "manifest.json", json_bytes(manifest))

    @_guarded
    def exists(self, location: str) -> bool:
        page = self.client.list_objects_v2(
            Bucket=self.bucket, Prefix=self._dir(location), MaxKeys=1
        )
        return bool(page.get("Contents"))

    @_guarded
    def is_sealed(self, location: str) -> bool:
        return self._head(self._dir(location) + SEALED) is not None

    # -- logs ----------------------------------------------------------------------------------

    @_guarded
    def append_log(
        self, location: str, seq: int, name: str, data: bytes, cap: int, budget: int | None = None
    ) -> LogState:
        """A new chunk object holding what fits under ``cap`` and ``budget`` (then one truncation
        note)."""
        prefix = self._chunk_prefix(location, seq, name)
        data = bytes(data)
        with self._lock(prefix):
            self._refuse_if_sealing(location)
            for _ in range(_COLLISIONS):
                chunks = self._numbered(prefix, writing=True)
                size = sum(c[2] for c in chunks)
                check = needs_note_check(size, cap, budget)
                tail = self._tail(chunks, size) if check else b""
                if check and NOTE_RE.search(tail[-NOTE_TAIL:]):
                    return LogState(size, 0, True)  # already truncated
                if not data:
                    return LogState(size, 0, False)
                out, capped = log_chunk(size, data, cap, budget)
                number = chunks[-1][0] + 1 if chunks else 1
                key = f"{prefix}{number:0{_DIGITS}d}"
                if self._create(key, out):
                    self._written(prefix, key, len(out))
                    if check:
                        self._keep_tail(key, tail + out)  # ``tail`` ended where ``out`` begins
                    return LogState(size + len(out), 0, capped)
        raise RecordStoreUnavailable("record store unavailable: log appends kept colliding")

    def _log_pieces(self, location: str, seq: int, name: str) -> list[tuple[int, str, int]]:
        """The sealed log as one piece once the seal wrote it, else the live chunks."""
        key = f"{self._dir(location)}logs/{self._log_file(seq, name)}"
        head = self._head(key)
        if head is not None:
            return [(0, key, int(head["ContentLength"]))]
        return self._numbered(self._chunk_prefix(location, seq, name))

    def read_log(
        self, location: str, seq: int, name: str, offset: int, limit: int = 1 << 20
    ) -> bytes:
        return self.log_slice(location, seq, name, offset, limit)[0]

    @_guarded
    def log_slice(
        self, location: str, seq: int, name: str, offset: int, limit: int = 1 << 20
    ) -> tuple[bytes, LogState]:
        num(offset, "offset")
        pieces = self._log_pieces(location, seq, name)
        size = sum(p[2] for p in pieces)
        if not pieces:
            return b"", LogState(0, 0, False)
        tail = self._span(pieces, max(0, size - NOTE_TAIL), size)
        data = self._slice(pieces, size, offset, limit)
        return data, LogState(size, 0, bool(NOTE_RE.search(tail)))

    # -- progress (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log)
    # -------------------------------------------------------------------

    def _attempts(
        self, prefix: str, writing: bool = False
    ) -> dict[int, list[tuple[int, str, int]]]:
        """The progress chunks under ``prefix`` by attempt: ``<attempt>/<n>``."""
        out: dict[int, list[tuple[int, str, int]]] = {}
        for key, size in self._list_for_write(prefix) if writing else self._list(prefix):
            attempt, _, number = key[len(prefix) :].partition("/")
            if attempt.isdigit() and number.isdigit():
                out.setdefault(int(attempt), []).append((int(number), key, size))
        return {a: sorted(c) for a, c in out.items()}

    def _progress_state(self, chunks: list[tuple[int, str, int]], attempt: int) -> LogState:
        size = sum(c[2] for c in chunks)
        start = max(0, size - CAPPED_TAIL)
        return LogState(size, attempt, ends_capped(self._span(chunks, start, size), start == 0))

    @_guarded
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
        num(attempt, "attempt")
        prefix = self._progress_prefix(location, seq, name)
        data = bytes(data)
        with self._lock(prefix):
            self._refuse_if_sealing(location)
            for _ in range(_COLLISIONS):
                by_attempt = self._attempts(prefix, writing=True)
                current = max(by_attempt, default=None)
                if current is not None and attempt < current:
                    return self._progress_state(by_attempt[current], current)
                if current is None or attempt > current:
                    body = progress_chunk(0, True, data, progress_limit(0, limit, budget))
                    first = f"{prefix}{attempt:0{_DIGITS}d}/{1:0{_DIGITS}d}"
                    if not self._create(first, body):
                        continue
                    older = [k for a, cs in by_attempt.items() if a < attempt for _n, k, _s in cs]
                    self._delete_keys(older)
                    self._remember(prefix, [(first, len(body))])
                    self._keep_tail(first, body)
                    return LogState(len(body), attempt, ends_capped(body, True))
                chunks = by_attempt[current]
                size = sum(c[2] for c in chunks)
                start = max(0, size - CAPPED_TAIL)
                tail = self._tail(chunks, size)
                if ends_capped(tail, start == 0):
                    return LogState(size, attempt, True)  # capped: it never grows again
                cap = progress_limit(size, limit, budget)
                out = progress_chunk(size, tail.endswith(b"\n"), data, cap)
                if not out:
                    return LogState(size, attempt, False)
                key = f"{prefix}{attempt:0{_DIGITS}d}/{chunks[-1][0] + 1:0{_DIGITS}d}"
                if not self._create(key, out):
                    continue
                self._written(prefix, key, len(out))
                self._keep_tail(key, tail + out)
                total = size + len(out)
                capped = ends_capped((tail + out)[-CAPPED_TAIL:], total <= CAPPED_TAIL)
                return LogState(total, attempt, capped)
        raise RecordStoreUnavailable("record store unavailable: progress writes kept colliding")

    @_guarded
    def read_progress(
        self, location: str, seq: int, name: str, offset: int, limit: int = 1 << 20
    ) -> tuple[bytes, LogState] | None:
        num(offset, "offset")
        by_attempt = self._attempts(self._progress_prefix(location, seq, name))
        if not by_attempt:
            return None
        attempt = max(by_attempt)
        chunks = by_attempt[attempt]
        state = self._progress_state(chunks, attempt)
        return self._slice(chunks, state.total, offset, limit), state

    # -- blobs -----------------------------------------------------------------------------------

    @_guarded
    def put_blob(self, location: str, seq: int, attempt: int, name: str, data: bytes) -> str:
        """One object, multipart past the threshold; S3 shows readers the old object or the new,
        never a part of one."""
        key = self._blob_key(location, seq, attempt, name)
        data = bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        self._refuse_if_sealing(location)
        self.client.upload_fileobj(
            io.BytesIO(data),
            self.bucket,
            key,
            ExtraArgs={"Metadata": {"sha256": digest}},
            Config=self.transfer,
        )
        return digest

    @_guarded
    def read_blob(
        self, location: str, seq: int, attempt: int, name: str, limit: int | None = None
    ) -> bytes | None:
        key = self._blob_key(location, seq, attempt, name)
        if limit is None:
            return self._read(key)
        if limit <= 0:
            return b"" if self._head(key) is not None else None
        try:
            body = self._get(key, Range=f"bytes=0-{limit - 1}")["Body"]
        except ClientError as exc:
            if _missing(exc):
                return None
            if _status(exc) == 416:  # no byte in the range: the object is empty
                return b""
            raise
        with contextlib.closing(body):
            return cast(bytes, body.read(limit))

    # -- seal ----------------------------------------------------------------------------------

    @_guarded
    def seal(
        self,
        location: str,
        *,
        verdict: dict[str, Any],
        steps: list[tuple[int, str, dict[str, Any]]],
        events: list[dict[str, Any]],
        manifest_update: dict[str, Any],
    ) -> None:
        """Refuse writes from now on (``.sealing``), drop the progress; write the verdict, step
        documents, events and final manifest, each log as one object, then SHA256SUMS, then the
        marker ``.sealed`` last: a seal stopped before it is done again whole by the next one. A
        sealed Record is left alone."""
        step_docs = [(self._step_rel(s, i), doc) for s, i, doc in steps]  # names checked first
        d = self._dir(location)
        with self._lock(d + SEALED):
            self._put(d + SEALING, b"")
            self._forget(d)
            self._forget(self._progress_dir(location))
            self._delete_keys([k for k, _ in self._list(self._progress_dir(location))])
            if self.is_sealed(location):
                return
            known: dict[str, str] = {}  # what this seal wrote: sha256 by path in the Record

            def write(rel: str, body: bytes) -> None:
                self._put(d + rel, body)
                known[rel] = hashlib.sha256(body).hexdigest()

            write("verdict.json", json_bytes(verdict))
            for rel, doc in step_docs:
                write(rel, json_bytes(doc))
            write("events.json", json_bytes(events))
            try:
                manifest = json.loads(self._read(d + "manifest.json") or b"{}")
                if not isinstance(manifest, dict):
                    manifest = {}
            except ValueError:
                manifest = {}
            manifest.update(manifest_update)
            write("manifest.json", json_bytes(manifest))
            chunk_keys = self._concatenate_logs(d, known)
            files = [(k[len(d) :], size) for k, size in self._list(d)]
            files = [(rel, size) for rel, size in files if _in_record(rel) and rel != SUMS]
            sums = sorted((rel, known.get(rel) or self._sha256(d + rel)) for rel, _ in files)
            sums_body = "".join(sums_line(h, rel) for rel, h in sums).encode()
            self._put(d + SUMS, sums_body)
            listing = sorted(files + [(SUMS, len(sums_body))])
            marker = {"sealed_at": int(time.time()), "files": [list(f) for f in listing]}
            self._put(d + SEALED, json.dumps(marker, sort_keys=True).encode())
            with contextlib.suppress(BotoCoreError, ClientError):
                self._delete_keys(chunk_keys)  # the sealed logs hold them now

    def _concatenate_logs(self, d: str, known: dict[str, str]) -> list[str]:
        """Each live log's chunks as one object ``logs/NN-<name>.log`` (streamed, multipart when
        large); the chunk keys, to be removed once the seal is complete."""
        by_log: dict[str, list[tuple[int, str]]] = {}
        base = f"{d}{CHUNKS}/"
        for key, _size in self._list(base):
            log_file, _, number = key[len(base) :].rpartition("/")
            if log_file and number.isdigit():
                by_log.setdefault(log_file, []).append((int(number), key))
        keys: list[str] = []
        for log_file, numbered in sorted(by_log.items()):
            ordered = [k for _n, k in sorted(numbered)]
            stream = _Concatenation(self, ordered)
            with contextlib.closing(stream):
                self.client.upload_fileobj(
                    io.BufferedReader(stream, _READ),
                    self.bucket,
                    f"{d}logs/{log_file}",
                    Config=self.transfer,
                )
            known[f"logs/{log_file}"] = stream.sha.hexdigest()
            keys.extend(ordered)
        return keys

    def _sha256(self, key: str) -> str:
        h = hashlib.sha256()
        body = self._get(key)["Body"]
        with contextlib.closing(body):
            for chunk in iter(lambda: body.read(_READ), b""):
                h.update(chunk)
        return h.hexdigest()

    # -- removal ---------------------------------------------------------------------------------

    @_guarded
    def delete(self, location: str) -> bool:
        """Every object of the Record, its live chunks, its markers and its progress; whether
        there was any."""
        d = self._dir(location)
        with self._lock(d + SEALED):
            self._forget(self._progress_dir(location))
            self._forget(d)
            progress = [k for k, _ in self._list(self._progress_dir(location))]
            self._delete_keys(progress)
            keys = [k for k, _ in self._list(d)]
            # The marker goes first: a Record half deleted is never taken for a sealed one.
            first = [k for k in keys if k == d + SEALED]
            self._delete_keys(first)
            self._delete_keys([k for k in keys if k != d + SEALED])
        return bool(progress or keys)

    # -- export --------------------------------------------------------------------------------

    @_guarded
    def tar_stream(self, location: str) -> Iterator[bytes]:
        """The tar of the Record's objects: the sealed files as the marker lists them (sizes up
        front, as a tar header needs), each object's body streamed into the archive in turn.
        FileNotFoundError at once when there is no Record."""
        d = self._dir(location)
        raw = self._read(d + SEALED)
        if raw is not None:
            marker = json.loads(raw)
            files = [(str(rel), int(size)) for rel, size in marker["files"]]
            mtime, sealed = int(marker["sealed_at"]), True
        else:
            listed = [(k[len(d) :], size) for k, size in self._list(d)]
            files = [(rel, size) for rel, size in listed if _in_record(rel)]
            if not listed:
                raise FileNotFoundError(d)
            mtime, sealed = int(time.time()), False
        top = "run-" + location_name(location)
        return tar_chunks(self._members(d, top, files, mtime, sealed))

    def _members(
        self, d: str, top: str, files: list[tuple[str, int]], mtime: int, sealed: bool
    ) -> Iterator[Member]:
        """The Record's directories and files in the filesystem backend's order (each directory,
        then what it holds, by name), with the modes of a sealed Record (0555 and 0444)."""
        tree: dict[str, Any] = {"steps": {}, "logs": {}, "blobs": {}}
        for rel, size in files:
            node = tree
            *parents, leaf = rel.split("/")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = size

        def info(name: str, kind: bytes, size: int = 0) -> tarfile.TarInfo:
            ti = tarfile.TarInfo(name)
            ti.type = kind
            ti.size = size
            if kind == tarfile.DIRTYPE:
                ti.mode = 0o555 if sealed else 0o755
            else:
                ti.mode = 0o444 if sealed else 0o644
            ti.mtime = mtime
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            return ti

        def walk(node: dict[str, Any], path: str) -> Iterator[Member]:
            for name in sorted(node):
                child, arc = node[name], f"{path}/{name}"
                if isinstance(child, dict):
                    yield Member(info(arc, tarfile.DIRTYPE))
                    yield from walk(child, arc)
                else:
                    rel = arc[len(top) + 1 :]
                    yield Member(info(arc, tarfile.REGTYPE, child), self._opener(d + rel))

        yield Member(info(top, tarfile.DIRTYPE))
        yield from walk(tree, top)

    def _opener(self, key: str) -> Callable[[], BinaryIO]:
        def open_body() -> BinaryIO:
            try:
                body = self._get(key)["Body"]
            except (BotoCoreError, ClientError) as exc:
                raise RecordStoreUnavailable(_reason(exc)) from exc
            return cast(BinaryIO, body)  # an io.IOBase: closed when the tar is done with it

        return open_body


def _in_record(rel: str) -> bool:
    """A path of the Record itself: not a live chunk, a marker or anything else hidden."""
    return bool(rel) and not any(part.startswith(".") for part in rel.split("/"))
