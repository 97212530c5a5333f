"""A Record as an uncompressed POSIX.1-2001 (pax) tar, produced chunk by chunk: neither the archive
nor any one member is ever held whole, so a Record of any size streams in bounded memory.

The bytes are those ``tarfile.open(mode="w|", format=PAX_FORMAT)`` writes for the same members
(``TarInfo.tobuf`` headers, contents padded to 512-byte blocks, two zero blocks, the end padded to a
10240-byte record); only the headers come from ``tarfile``, since ``TarFile.addfile`` copies a
member whole before a caller could take any of it."""

from __future__ import annotations

import grp
import os
import pwd
import stat
import tarfile
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

BLOCK = 512  # a tar block
RECORD = 20 * BLOCK  # the archive's end is padded to this (tar's default blocking factor, -b20)
CHUNK = 64 * 1024  # the largest read, and the size of every chunk but the last
_NUL = b"\0"


@dataclass(frozen=True)
class Member:
    """One archive member: its header, and for a regular file a way to open its contents, of which
    ``info.size`` bytes are written (NUL-padded if the contents turn out shorter)."""

    info: tarfile.TarInfo
    contents: Callable[[], BinaryIO] | None = None


def tar_chunks(members: Iterable[Member], chunk_size: int = CHUNK) -> Generator[bytes, None, None]:
    """The tar archive of ``members``, taken one at a time, as chunks of exactly ``chunk_size``
    bytes but the last. A consumer that stops early simply closes the generator."""
    if chunk_size < 1:
        raise ValueError(f"bad chunk size {chunk_size!r}")
    buf = bytearray()
    offset = 0  # bytes of the archive produced so far

    for member in members:
        info = member.info
        header = info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
        buf += header
        offset += len(header)
        yield from _full_chunks(buf, chunk_size)
        if info.size:
            if member.contents is None:
                raise ValueError(f"no contents for {info.name!r} of {info.size} bytes")
            remaining = info.size
            with member.contents() as f:
                while remaining:
                    want = min(chunk_size - len(buf), remaining)
                    chunk = f.read(want)
                    if not chunk:  # shrank meanwhile: pad to the size the header declares
                        chunk = _NUL * want
                    buf += chunk
                    remaining -= len(chunk)
                    yield from _full_chunks(buf, chunk_size)
            padding = -info.size % BLOCK
            buf += _NUL * padding
            offset += info.size + padding
            yield from _full_chunks(buf, chunk_size)

    end = 2 * BLOCK
    end += -(offset + end) % RECORD
    buf += _NUL * end
    yield from _full_chunks(buf, chunk_size)
    if buf:
        yield bytes(buf)


def _full_chunks(buf: bytearray, chunk_size: int) -> Iterator[bytes]:
    """Take every whole ``chunk_size`` piece off the front of ``buf``."""
    while len(buf) >= chunk_size:
        yield bytes(buf[:chunk_size])
        del buf[:chunk_size]


def stat_tarinfo(
    arcname: str, st: os.stat_result, links: dict[tuple[int, int], str]
) -> tarfile.TarInfo | None:
    """The header ``TarFile.gettarinfo`` makes of an ``lstat`` result, for a directory or a regular
    file (None for anything else). ``links`` maps the (inode, device) of regular files already
    archived to their names, so another name of the same file becomes a hard link, as there."""
    mode = st.st_mode
    info = tarfile.TarInfo(arcname)
    if stat.S_ISREG(mode):
        inode = (st.st_ino, st.st_dev)
        if st.st_nlink > 1 and inode in links and arcname != links[inode]:
            info.type = tarfile.LNKTYPE
            info.linkname = links[inode]
        else:
            info.type = tarfile.REGTYPE
            info.size = st.st_size
            if inode[0]:
                links[inode] = arcname
    elif stat.S_ISDIR(mode):
        info.type = tarfile.DIRTYPE
    else:
        return None
    info.mode = stat.S_IMODE(mode)  # what the header keeps of st_mode
    info.uid = st.st_uid
    info.gid = st.st_gid
    info.mtime = st.st_mtime
    try:
        info.uname = pwd.getpwuid(st.st_uid)[0]
    except KeyError:
        pass
    try:
        info.gname = grp.getgrgid(st.st_gid)[0]
    except KeyError:
        pass
    return info
