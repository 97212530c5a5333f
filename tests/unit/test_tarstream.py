"""The tar stream of a Record: the bytes ``tarfile`` writes, produced chunk by chunk."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, cast

import pytest

from app.records.tarstream import BLOCK, CHUNK, RECORD, Member, stat_tarinfo, tar_chunks


def _info(
    name: str, size: int = 0, mode: int = 0o444, kind: bytes = tarfile.REGTYPE
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.mode = mode
    info.mtime = 1_700_000_000.25
    info.uid, info.gid, info.uname, info.gname = 1000, 1000, "mediator", "mediator"
    return info


def _file(name: str, data: bytes, mode: int = 0o444) -> Member:
    return Member(_info(name, len(data), mode), lambda: io.BytesIO(data))


def _dir(name: str, mode: int = 0o555) -> Member:
    return Member(_info(name, 0, mode, tarfile.DIRTYPE))


def _tarfile_bytes(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    """What ``tarfile`` itself writes for these members, as a stream."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _members() -> list[tuple[tarfile.TarInfo, bytes | None]]:
    big = os.urandom(3 * CHUNK + 123)
    rows: list[tuple[tarfile.TarInfo, bytes | None]] = [
        (_info("run-r1", 0, 0o555, tarfile.DIRTYPE), None)
    ]
    for size in (0, 1, BLOCK - 1, BLOCK, BLOCK + 1, RECORD, CHUNK, CHUNK + 1):
        rows.append((_info(f"run-r1/blobs/01.1-s{size}", size), os.urandom(size)))
    rows.append((_info("run-r1/blobs/01.1-big.bin", len(big)), big))
    rows.append((_info("run-r1/logs/01-ünïcødé-名前.log", 5, 0o644), b"hey\n\n"))
    rows.append((_info("run-r1/blobs/" + "n" * 190, 3), b"abc"))  # longer than ustar's 100
    odd = _info("run-r1/odd", 2)
    odd.uid = odd.gid = 8**7  # beyond the ustar field: a pax record
    rows.append((odd, b"ok"))
    link = _info("run-r1/blobs/" + "l" * 150, 0, 0o444, tarfile.LNKTYPE)
    link.linkname = "run-r1/blobs/01.1-big.bin"
    rows.append((link, None))
    return rows


def _reader(data: bytes) -> Callable[[], BinaryIO]:
    return lambda: io.BytesIO(data)


def _as_members(rows: list[tuple[tarfile.TarInfo, bytes | None]]) -> list[Member]:
    out = []
    for info, data in rows:
        if data is None:
            out.append(Member(info))
        else:
            out.append(Member(info, _reader(data)))
    return out


class _ChunkReader(io.RawIOBase):
    """A file reading through the chunks of a generator, for ``tarfile``'s stream mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._rest = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: memoryview) -> int:  # type: ignore[override]
        while not self._rest:
            try:
                self._rest = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._rest))
        b[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n


_PATTERN = bytes(range(251)) * (CHUNK // 251 + 2)


class _Source(io.RawIOBase):
    """``size`` bytes made on demand; remembers how far it was read and the largest read."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pos = 0
        self.largest_read = 0
        self.sha = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n < 0 else min(n, self.size - self.pos)
        self.largest_read = max(self.largest_read, n)
        start = self.pos % 251
        data = (_PATTERN if n <= CHUNK else _PATTERN * (n // CHUNK + 1))[start : start + n]
        self.pos += n
        self.sha.update(data)
        return data


# -- the bytes -----------------------------------------------------------------------------------


def test_the_stream_is_byte_for_byte_what_tarfile_writes() -> None:
    rows = _members()
    data = b"".join(tar_chunks(_as_members(rows)))
    assert data == _tarfile_bytes(rows)
    assert len(data) % RECORD == 0


@pytest.mark.parametrize("chunk_size", [1, 7, BLOCK, 1000, RECORD, CHUNK, 10 * CHUNK])
def test_the_bytes_do_not_depend_on_the_chunk_size(chunk_size: int) -> None:
    rows = _members()
    assert b"".join(tar_chunks(_as_members(rows), chunk_size)) == _tarfile_bytes(rows)


def test_an_empty_archive_is_one_record_of_zeros() -> None:
    assert list(tar_chunks([])) == [b"\0" * RECORD]
    assert b"".join(tar_chunks([])) == _tarfile_bytes([])


def test_the_stream_opens_with_tarfile_with_its_names_types_sizes_modes_and_contents() -> None:
    members = [
        _dir("run-r1"),
        _dir("run-r1/logs", 0o755),
        _file("run-r1/logs/01-build.log", b"line\n" * 300, 0o644),
        _file("run-r1/blobs/01.1-empty", b""),
        _file("run-r1/blobs/01.1-ünï", b"\x00\xff" * 700, 0o400),
    ]
    data = b"".join(tar_chunks(members))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        got = tar.getmembers()
        assert [m.name for m in got] == [m.info.name for m in members]
        assert [m.isdir() for m in got] == [True, True, False, False, False]
        assert [m.mode for m in got] == [0o555, 0o755, 0o644, 0o444, 0o400]
        assert [m.size for m in got] == [0, 0, 1500, 0, 1400]
        assert all(m.mtime == 1_700_000_000.25 for m in got)  # full precision, in a pax record
        assert all(
            (m.uname, m.gname, m.uid, m.gid) == ("mediator", "mediator", 1000, 1000) for m in got
        )
        for m, want in zip(got[2:], [b"line\n" * 300, b"", b"\x00\xff" * 700]):
            f = tar.extractfile(m)
            assert f is not None and f.read() == want


def test_a_hard_link_member_carries_its_target_and_no_contents() -> None:
    link = _info("run-r1/b", 0, 0o444, tarfile.LNKTYPE)
    link.linkname = "run-r1/a"
    data = b"".join(tar_chunks([_file("run-r1/a", b"shared"), Member(link)]))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        m = tar.getmember("run-r1/b")
        assert m.islnk() and m.linkname == "run-r1/a" and m.size == 0


# -- chunks and memory ---------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [BLOCK, 1000, CHUNK])
def test_every_chunk_but_the_last_is_exactly_the_chunk_size(chunk_size: int) -> None:
    chunks = list(tar_chunks(_as_members(_members()), chunk_size))
    assert len(chunks) > 2
    assert all(len(c) == chunk_size for c in chunks[:-1])
    assert 0 < len(chunks[-1]) <= chunk_size


def test_a_big_member_streams_without_being_held_whole() -> None:
    size = 64 * CHUNK + 77  # 4 MiB and a bit
    source = _Source(size)
    gen = tar_chunks(
        [_dir("run-r1"), Member(_info("run-r1/big", size), lambda: cast(BinaryIO, source))]
    )
    first = next(gen)
    assert len(first) == CHUNK
    assert source.pos <= CHUNK  # only what the first chunk needed was read
    chunks = [first]
    for chunk in gen:
        assert len(chunk) <= CHUNK
        chunks.append(chunk)
    assert source.largest_read <= CHUNK
    assert source.pos == size
    want = source.sha.hexdigest()
    with tarfile.open(fileobj=_ChunkReader(iter(chunks)), mode="r|") as tar:
        names = []
        for m in tar:
            names.append(m.name)
            if m.isfile():
                f = tar.extractfile(m)
                assert f is not None
                sha = hashlib.sha256()
                while block := f.read(CHUNK):
                    sha.update(block)
                assert m.size == size and sha.hexdigest() == want
    assert names == ["run-r1", "run-r1/big"]


def test_members_are_taken_and_opened_only_when_their_turn_comes() -> None:
    seen: list[str] = []

    def opener(name: str, data: bytes) -> Callable[[], BinaryIO]:
        def open_() -> BinaryIO:
            seen.append("open " + name)
            return io.BytesIO(data)

        return open_

    def members() -> Iterator[Member]:
        for name in ("a", "b"):
            seen.append("take " + name)
            data = name.encode() * CHUNK
            yield Member(_info(name, len(data)), opener(name, data))

    gen = tar_chunks(members())
    assert seen == []
    next(gen)
    assert seen == ["take a", "open a"]
    list(gen)
    assert seen == ["take a", "open a", "take b", "open b"]


def test_a_consumer_that_stops_early_closes_the_open_member() -> None:
    source = _Source(10 * CHUNK)
    gen = tar_chunks([Member(_info("big", source.size), lambda: cast(BinaryIO, source))])
    next(gen)
    assert not source.closed
    gen.close()
    assert source.closed and source.pos < source.size


# -- contents that changed under the header --------------------------------------------------------


def test_contents_shorter_than_the_header_says_are_padded_with_nul() -> None:
    info = _info("shrunk", 2 * CHUNK + 5)
    data = b"".join(tar_chunks([Member(info, lambda: io.BytesIO(b"only this"))]))
    assert data == _tarfile_bytes([(info, b"only this" + b"\0" * (info.size - 9))])
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        f = tar.extractfile("shrunk")
        assert f is not None and f.read() == b"only this" + b"\0" * (info.size - 9)


def test_contents_longer_than_the_header_says_are_cut_at_its_size() -> None:
    info = _info("grown", 4)
    data = b"".join(tar_chunks([Member(info, lambda: io.BytesIO(b"abcdefgh"))]))
    assert data == _tarfile_bytes([(info, b"abcd")])


def test_a_member_with_a_size_but_no_contents_is_refused() -> None:
    with pytest.raises(ValueError):
        list(tar_chunks([Member(_info("nothing", 10))]))


def test_a_chunk_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        next(tar_chunks([], 0))


# -- headers from lstat ----------------------------------------------------------------------------


def _gettarinfo_bytes(tar: tarfile.TarFile, path: Path, arcname: str) -> bytes | None:
    info = tar.gettarinfo(str(path), arcname=arcname)
    return (
        None
        if info is None
        else info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
    )


def test_headers_from_lstat_are_those_of_tarfile_gettarinfo(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o755)
    (tmp_path / "d" / "f").write_bytes(b"x" * 1234)
    os.chmod(tmp_path / "d" / "f", 0o444)
    os.link(tmp_path / "d" / "f", tmp_path / "d" / "hard")
    (tmp_path / "d" / "ünï").write_bytes(b"")
    os.symlink("/etc/passwd", tmp_path / "d" / "sym")
    os.mkfifo(tmp_path / "d" / "fifo")
    links: dict[tuple[int, int], str] = {}
    with tarfile.open(fileobj=io.BytesIO(), mode="w", format=tarfile.PAX_FORMAT) as ref:
        for name in ("d", "d/f", "d/hard", "d/ünï"):
            p = tmp_path / name
            ours = stat_tarinfo("top/" + name, os.lstat(p), links)
            assert ours is not None
            header = ours.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
            assert header == _gettarinfo_bytes(ref, p, "top/" + name)
    hard = stat_tarinfo("top/d/hard2", os.lstat(tmp_path / "d" / "hard"), links)
    assert hard is not None and hard.islnk() and hard.linkname == "top/d/f" and hard.size == 0
    again = stat_tarinfo("top/d/f", os.lstat(tmp_path / "d" / "f"), links)
    assert again is not None and again.isreg() and again.size == 1234  # its own name: not a link
    for name in ("sym", "fifo"):  # neither a directory nor a regular file: skipped
        assert stat_tarinfo("top/d/" + name, os.lstat(tmp_path / "d" / name), links) is None


def test_a_header_from_lstat_of_an_unknown_owner_has_no_owner_names() -> None:
    uid = gid = 2**31 - 7
    st = os.stat_result((0o100444, 1, 1, 1, uid, gid, 3, 0, 0, 0))
    info = stat_tarinfo("x", st, {})
    assert info is not None
    assert (info.uid, info.gid, info.uname, info.gname, info.mode, info.size) == (
        uid,
        gid,
        "",
        "",
        0o444,
        3,
    )
