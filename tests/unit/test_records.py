"""The filesystem Record store (SPEC §11): logs with a cap, atomic blobs, steps, seal, tar."""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import stat
import tarfile
import threading
from pathlib import Path

import pytest

from app.records import FilesystemRecords, RecordSealed, record_dir_name, write_atomic

RUN = "run-0001"
NOTE = b"\n[mediator: log truncated at %d bytes]\n"


@pytest.fixture
def rec(tmp_path: Path):
    r = FilesystemRecords(tmp_path / "records")
    r.open(RUN, {"run_id": RUN, "state": "RUNNING"})
    yield r
    for dirpath, _dirs, _files in os.walk(tmp_path):  # let tmp_path cleanup work as non-root
        os.chmod(dirpath, 0o755)


def _seal(rec: FilesystemRecords, run_id: str = RUN) -> None:
    rec.seal(
        run_id,
        verdict={"state": "SUCCEEDED"},
        steps=[
            (1, "build", {"state": "SUCCEEDED", "node": "n1"}),
            (2, "test", {"state": "SUCCEEDED"}),
        ],
        events=[{"kind": "created"}, {"kind": "finished"}],
        manifest_update={"state": "SUCCEEDED", "ended_at": "2024-01-01T00:00:00Z"},
    )


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


# -- record_dir_name / open / exists ------------------------------------------------------------


@pytest.mark.parametrize(
    "run_id",
    ["a/b", "../../etc", "..", ".", ".hidden", "x" * 500, "a\x00b", "a\\b", "", "ü/..", "/abs"],
)
def test_record_dir_name_stays_inside_root(tmp_path: Path, run_id: str) -> None:
    r = FilesystemRecords(tmp_path)
    name = record_dir_name(run_id)
    assert "/" not in name and "\x00" not in name and name not in {".", ".."}
    assert len(name) <= 120
    assert r.path(run_id).parent == tmp_path
    assert r.path(run_id).resolve().parent == tmp_path.resolve()


def test_record_dir_name_plain_and_distinct() -> None:
    assert record_dir_name("run-abc_1.2:x@y") == "run-abc_1.2:x@y"
    assert record_dir_name("a/b") != record_dir_name("a\\b")
    assert record_dir_name("a/b") == record_dir_name("a/b")


def test_open_and_exists(tmp_path: Path) -> None:
    r = FilesystemRecords(tmp_path)
    assert not r.exists("r1")
    r.open("r1", {"run_id": "r1"})
    r.open("r1", {"run_id": "r1", "again": True})
    assert r.exists("r1")
    assert json.loads((r.path("r1") / "manifest.json").read_bytes()) == {
        "run_id": "r1",
        "again": True,
    }
    for sub in ("steps", "logs", "blobs"):
        assert (r.path("r1") / sub).is_dir()


# -- logs ----------------------------------------------------------------------------------------


def test_append_and_read_log(rec: FilesystemRecords) -> None:
    assert rec.append_log(RUN, 1, "step", b"hello\n", 1000) == 6
    assert rec.append_log(RUN, 1, "step", b"world\n", 1000) == 12
    assert (rec.path(RUN) / "logs" / "01-step.log").read_bytes() == b"hello\nworld\n"
    assert rec.read_log(RUN, 1, "step", 0) == b"hello\nworld\n"
    assert rec.read_log(RUN, 1, "step", 6) == b"world\n"
    assert rec.read_log(RUN, 1, "step", 12) == b""
    assert rec.read_log(RUN, 1, "step", 999) == b""
    assert rec.append_log(RUN, 1, "step", b"", 1000) == 12


def test_log_file_names(rec: FilesystemRecords) -> None:
    rec.append_log(RUN, 0, "a", b"x", 10)
    rec.append_log(RUN, 7, "a", b"x", 10)
    rec.append_log(RUN, 123, "a", b"x", 10)
    names = sorted(p.name for p in (rec.path(RUN) / "logs").iterdir())
    assert names == ["00-a.log", "07-a.log", "123-a.log"]


def test_read_missing_log(rec: FilesystemRecords, tmp_path: Path) -> None:
    assert rec.read_log(RUN, 3, "nope", 0) == b""
    assert FilesystemRecords(tmp_path / "elsewhere").read_log("nobody", 1, "x", 0) == b""


def test_log_cap_and_note_exact_bytes(rec: FilesystemRecords) -> None:
    cap = 10
    assert rec.append_log(RUN, 1, "s", b"01234", cap) == 5
    total = rec.append_log(RUN, 1, "s", b"56789abcdef", cap)
    expected = b"0123456789" + NOTE % cap
    assert total == len(expected)
    assert (rec.path(RUN) / "logs" / "01-s.log").read_bytes() == expected
    assert rec.append_log(RUN, 1, "s", b"more\n", cap) == len(expected)
    assert rec.append_log(RUN, 1, "s", b"x" * 100, cap) == len(expected)
    assert (rec.path(RUN) / "logs" / "01-s.log").read_bytes() == expected
    assert expected == b"0123456789\n[mediator: log truncated at 10 bytes]\n"


def test_log_exactly_at_cap_then_note(rec: FilesystemRecords) -> None:
    assert rec.append_log(RUN, 1, "s", b"0123456789", 10) == 10  # fits exactly, no note
    assert rec.append_log(RUN, 1, "s", b"", 10) == 10
    total = rec.append_log(RUN, 1, "s", b"x", 10)
    assert (rec.path(RUN) / "logs" / "01-s.log").read_bytes() == b"0123456789" + NOTE % 10
    assert total == 10 + len(NOTE % 10)


def test_log_first_append_over_cap(rec: FilesystemRecords) -> None:
    total = rec.append_log(RUN, 2, "s", b"a" * 50, 20)
    assert (rec.path(RUN) / "logs" / "02-s.log").read_bytes() == b"a" * 20 + NOTE % 20
    assert total == 20 + len(NOTE % 20)


def test_concurrent_appends_threads(rec: FilesystemRecords) -> None:
    line = b"0123456789abcdef\n"
    n_threads, per = 8, 50
    barrier = threading.Barrier(n_threads)

    def worker(i: int) -> None:
        barrier.wait()
        for _ in range(per):
            rec.append_log(RUN, 1, "c", b"%d:" % i + line, 1 << 30)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = (rec.path(RUN) / "logs" / "01-c.log").read_bytes()
    assert len(data) == n_threads * per * (len(line) + 2)
    lines = data.splitlines(keepends=True)
    assert len(lines) == n_threads * per
    for i in range(n_threads):
        assert lines.count(b"%d:" % i + line) == per


def test_concurrent_appends_threads_with_cap(rec: FilesystemRecords) -> None:
    cap = 1000
    barrier = threading.Barrier(6)

    def worker() -> None:
        barrier.wait()
        for _ in range(100):
            rec.append_log(RUN, 1, "cc", b"abcdefg\n", cap)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = (rec.path(RUN) / "logs" / "01-cc.log").read_bytes()
    assert len(data) == cap + len(NOTE % cap)
    assert data.endswith(NOTE % cap) and data.count(b"[mediator:") == 1


def _proc_worker(root: str, i: int) -> None:
    r = FilesystemRecords(root)
    for _ in range(40):
        r.append_log(RUN, 1, "p", b"proc%d-line\n" % i, 1 << 30)


def test_concurrent_appends_processes(rec: FilesystemRecords) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_proc_worker, args=(str(rec.root), i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    data = (rec.path(RUN) / "logs" / "01-p.log").read_bytes()
    assert len(data) == sum(40 * len(b"proc%d-line\n" % i) for i in range(4))
    assert all(line.startswith(b"proc") and line.endswith(b"-line") for line in data.splitlines())


def test_read_log_limit_cuts_at_newline(rec: FilesystemRecords) -> None:
    rec.append_log(RUN, 1, "s", b"aaa\nbbb\nccc", 1000)
    assert rec.read_log(RUN, 1, "s", 0, limit=6) == b"aaa\n"  # more remain: cut after newline
    assert rec.read_log(RUN, 1, "s", 0, limit=8) == b"aaa\nbbb\n"
    assert rec.read_log(RUN, 1, "s", 0, limit=9) == b"aaa\nbbb\n"
    assert rec.read_log(RUN, 1, "s", 0, limit=11) == b"aaa\nbbb\nccc"  # nothing beyond: no cut
    assert rec.read_log(RUN, 1, "s", 0, limit=100) == b"aaa\nbbb\nccc"
    assert rec.read_log(RUN, 1, "s", 4, limit=5) == b"bbb\n"
    assert rec.read_log(RUN, 1, "s", 8, limit=2) == b"cc"  # no newline within the limit: raw
    assert rec.read_log(RUN, 1, "s", 0, limit=0) == b""


def test_read_log_follow(rec: FilesystemRecords) -> None:
    rec.append_log(RUN, 1, "f", b"x" * 10 + b"\n" + b"y" * 10 + b"\n" + b"z" * 5, 1 << 20)
    got, off = b"", 0
    while True:
        chunk = rec.read_log(RUN, 1, "f", off, limit=15)
        if not chunk:
            break
        got += chunk
        off += len(chunk)
    assert got == (rec.path(RUN) / "logs" / "01-f.log").read_bytes()


def test_read_log_default_limit(rec: FilesystemRecords) -> None:
    body = (b"l" * 99 + b"\n") * 20000  # 2,000,000 bytes
    rec.append_log(RUN, 1, "big", body, 1 << 30)
    first = rec.read_log(RUN, 1, "big", 0)
    assert len(first) <= 1 << 20 and first.endswith(b"\n") and len(first) % 100 == 0
    assert len(first) == (1 << 20) // 100 * 100


def test_read_log_bad_offset(rec: FilesystemRecords) -> None:
    with pytest.raises(ValueError):
        rec.read_log(RUN, 1, "s", -1)


# -- blobs / steps -------------------------------------------------------------------------------


def test_put_and_read_blob(rec: FilesystemRecords) -> None:
    digest = rec.put_blob(RUN, 1, 2, "report.json", b'{"ok": true}')
    assert digest == hashlib.sha256(b'{"ok": true}').hexdigest()
    assert rec.read_blob(RUN, 1, 2, "report.json") == b'{"ok": true}'
    assert (rec.path(RUN) / "blobs" / "01.2-report.json").read_bytes() == b'{"ok": true}'
    assert rec.read_blob(RUN, 1, 1, "report.json") is None
    assert rec.read_blob(RUN, 1, 2, "other") is None
    assert rec.read_blob("no-such-run", 1, 2, "report.json") is None
    rec.put_blob(RUN, 1, 2, "report.json", b"second")
    assert rec.read_blob(RUN, 1, 2, "report.json") == b"second"
    assert rec.put_blob(RUN, 1, 2, "empty", b"") == hashlib.sha256(b"").hexdigest()
    assert rec.read_blob(RUN, 1, 2, "empty") == b""
    assert not [p for p in (rec.path(RUN) / "blobs").iterdir() if p.name.startswith(".tmp-")]


def test_put_blob_atomic_failure_leaves_old_content(
    rec: FilesystemRecords, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec.put_blob(RUN, 1, 1, "b", b"old")

    def boom(*_a, **_k):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        rec.put_blob(RUN, 1, 1, "b", b"new")
    monkeypatch.undo()
    assert rec.read_blob(RUN, 1, 1, "b") == b"old"
    assert not [p for p in (rec.path(RUN) / "blobs").iterdir() if p.name.startswith(".tmp-")]


def test_write_atomic_no_temp_left(tmp_path: Path) -> None:
    target = tmp_path / "d" / "f"
    write_atomic(target, b"1")
    write_atomic(target, b"22")
    assert target.read_bytes() == b"22"
    assert [p.name for p in target.parent.iterdir()] == ["f"]


def test_write_step(rec: FilesystemRecords) -> None:
    rec.write_step(RUN, 3, "deploy", {"b": 1, "a": [1, 2]})
    p = rec.path(RUN) / "steps" / "03-deploy.json"
    text = p.read_text()
    assert json.loads(text) == {"a": [1, 2], "b": 1}
    assert text.index('"a"') < text.index('"b"')
    assert '\n  "a": [\n' in text  # indent 2
    rec.write_step(RUN, 3, "deploy", {"c": 3})
    assert json.loads(p.read_text()) == {"c": 3}


BAD_NAMES = ["", ".", "..", "a/b", "../x", "/abs", "a\\b", "..\\x", "a\x00b"]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_path_escape_rejected(rec: FilesystemRecords, bad: str) -> None:
    with pytest.raises(ValueError):
        rec.append_log(RUN, 1, bad, b"x", 100)
    with pytest.raises(ValueError):
        rec.read_log(RUN, 1, bad, 0)
    with pytest.raises(ValueError):
        rec.put_blob(RUN, 1, 1, bad, b"x")
    with pytest.raises(ValueError):
        rec.read_blob(RUN, 1, 1, bad)
    with pytest.raises(ValueError):
        rec.write_step(RUN, 1, bad, {})
    with pytest.raises(ValueError):
        rec.seal(RUN, verdict={}, steps=[(1, bad, {})], events=[], manifest_update={})
    assert not rec.is_sealed(RUN)
    outside = sorted(p.name for p in rec.root.parent.iterdir())
    assert outside == ["records"]  # nothing written next to the root
    assert sorted(p.name for p in rec.root.iterdir()) == [RUN]


@pytest.mark.parametrize("seq", [-1, True, 1.5, "1"])
def test_bad_seq_rejected(rec: FilesystemRecords, seq) -> None:
    with pytest.raises(ValueError):
        rec.append_log(RUN, seq, "s", b"x", 100)
    with pytest.raises(ValueError):
        rec.put_blob(RUN, 1, seq, "b", b"x")


def test_odd_run_id_writes_stay_inside_root(tmp_path: Path) -> None:
    r = FilesystemRecords(tmp_path / "root")
    for run_id in ["../escape", "a/../../b", "..", "z" * 300]:
        r.open(run_id, {"run_id": run_id})
        r.append_log(run_id, 1, "s", b"x", 10)
        r.put_blob(run_id, 1, 1, "b", b"x")
        assert r.read_blob(run_id, 1, 1, "b") == b"x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]
    assert len(list((tmp_path / "root").iterdir())) == 4


# -- seal ----------------------------------------------------------------------------------------


def _verify_sums(d: Path) -> list[str]:
    lines = (d / "SHA256SUMS").read_text().splitlines()
    paths = [line.split("  ", 1)[1] for line in lines]
    assert paths == sorted(paths)
    for line in lines:
        digest, rel = line.split("  ", 1)
        assert hashlib.sha256((d / rel).read_bytes()).hexdigest() == digest
    on_disk = sorted(
        p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file() and p.name != "SHA256SUMS"
    )
    assert paths == on_disk
    return paths


def test_seal_writes_files_and_sums(rec: FilesystemRecords) -> None:
    rec.append_log(RUN, 1, "build", b"compiling\n", 1000)
    rec.put_blob(RUN, 1, 1, "out.json", b"{}")
    assert not rec.is_sealed(RUN)
    _seal(rec)
    assert rec.is_sealed(RUN)
    d = rec.path(RUN)
    assert json.loads((d / "verdict.json").read_bytes()) == {"state": "SUCCEEDED"}
    assert json.loads((d / "events.json").read_bytes()) == [
        {"kind": "created"},
        {"kind": "finished"},
    ]
    assert json.loads((d / "steps" / "01-build.json").read_bytes()) == {
        "node": "n1",
        "state": "SUCCEEDED",
    }
    assert (d / "steps" / "02-test.json").exists()
    manifest = json.loads((d / "manifest.json").read_bytes())
    assert manifest == {"run_id": RUN, "state": "SUCCEEDED", "ended_at": "2024-01-01T00:00:00Z"}
    paths = _verify_sums(d)
    assert paths == [
        "blobs/01.1-out.json",
        "events.json",
        "logs/01-build.log",
        "manifest.json",
        "steps/01-build.json",
        "steps/02-test.json",
        "verdict.json",
    ]


def test_seal_modes(rec: FilesystemRecords) -> None:
    rec.append_log(RUN, 1, "build", b"x\n", 1000)
    _seal(rec)
    d = rec.path(RUN)
    assert _mode(d) == 0o555
    for p in d.rglob("*"):
        assert _mode(p) == (0o555 if p.is_dir() else 0o444), p


def test_sealed_record_refuses_writes(rec: FilesystemRecords) -> None:
    rec.append_log(RUN, 1, "build", b"x\n", 1000)
    _seal(rec)
    before = (rec.path(RUN) / "logs" / "01-build.log").read_bytes()
    with pytest.raises(RecordSealed):
        rec.append_log(RUN, 1, "build", b"more\n", 1000)
    with pytest.raises(RecordSealed):
        rec.put_blob(RUN, 1, 1, "late", b"x")
    with pytest.raises(RecordSealed):
        rec.write_step(RUN, 1, "build", {})
    assert (rec.path(RUN) / "logs" / "01-build.log").read_bytes() == before
    assert rec.read_blob(RUN, 1, 1, "late") is None
    assert rec.read_log(RUN, 1, "build", 0) == before
    _verify_sums(rec.path(RUN))


def test_seal_is_idempotent(rec: FilesystemRecords) -> None:
    _seal(rec)
    d = rec.path(RUN)
    sums = (d / "SHA256SUMS").read_bytes()
    snapshot = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    rec.seal(RUN, verdict={"state": "DIFFERENT"}, steps=[], events=[], manifest_update={"x": 1})
    assert (d / "SHA256SUMS").read_bytes() == sums
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == snapshot
    assert rec.is_sealed(RUN)


def test_seal_completes_half_seal_after_sums(rec: FilesystemRecords) -> None:
    """Crash after SHA256SUMS and part of the chmods: sealing again finishes the job."""
    rec.append_log(RUN, 1, "build", b"x\n", 1000)
    _seal(rec)
    d = rec.path(RUN)
    os.chmod(d, 0o755)
    os.chmod(d / "logs", 0o755)
    os.chmod(d / "logs" / "01-build.log", 0o644)
    assert not rec.is_sealed(RUN)
    with pytest.raises(RecordSealed):  # a seal has begun: no more writes
        rec.append_log(RUN, 1, "build", b"late\n", 1000)
    _seal(rec)
    assert rec.is_sealed(RUN)
    _verify_sums(d)
    for p in [d, *d.rglob("*")]:
        assert _mode(p) == (0o555 if p.is_dir() else 0o444), p


def test_seal_completes_half_seal_before_sums(rec: FilesystemRecords) -> None:
    """Crash after the verdict but before SHA256SUMS (a stale temp file and a read-only dir left)."""
    d = rec.path(RUN)
    write_atomic(d / "verdict.json", b"{}")
    (d / "blobs" / ".tmp-abandoned").write_bytes(b"junk")
    os.chmod(d / "verdict.json", 0o444)
    os.chmod(d / "steps", 0o555)
    assert not rec.is_sealed(RUN)
    _seal(rec)
    assert rec.is_sealed(RUN)
    assert json.loads((d / "verdict.json").read_bytes()) == {"state": "SUCCEEDED"}
    assert not (d / "blobs" / ".tmp-abandoned").exists()
    assert "steps/01-build.json" in _verify_sums(d)


def test_seal_without_open(tmp_path: Path) -> None:
    r = FilesystemRecords(tmp_path / "r")
    _seal(r, "never-opened")
    assert r.is_sealed("never-opened")
    assert (
        json.loads((r.path("never-opened") / "manifest.json").read_bytes())["state"] == "SUCCEEDED"
    )
    _verify_sums(r.path("never-opened"))
    for dirpath, _d, _f in os.walk(tmp_path):
        os.chmod(dirpath, 0o755)


def test_is_sealed_missing(tmp_path: Path) -> None:
    assert not FilesystemRecords(tmp_path).is_sealed("nothing")


# -- tar -----------------------------------------------------------------------------------------


def test_tar_stream(rec: FilesystemRecords) -> None:
    rec.append_log(RUN, 1, "build", b"line\n" * 1000, 1 << 20)
    big = os.urandom(300_000)
    rec.put_blob(RUN, 1, 1, "big.bin", big)
    _seal(rec)
    d = rec.path(RUN)
    chunks = list(rec.tar_stream(RUN))
    assert len(chunks) > 1
    assert all(isinstance(c, bytes) for c in chunks)
    assert max(len(c) for c in chunks) < len(big)  # really streamed, never the whole archive
    data = b"".join(chunks)
    assert len(data) % tarfile.RECORDSIZE == 0
    top = "run-" + record_dir_name(RUN)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        members = {m.name: m for m in tar.getmembers()}
        expected = {top} | {f"{top}/{p.relative_to(d).as_posix()}" for p in d.rglob("*")}
        assert set(members) == expected
        assert members[top].isdir() and members[top].mode == 0o555
        for p in d.rglob("*"):
            m = members[f"{top}/{p.relative_to(d).as_posix()}"]
            assert m.mode == _mode(p)
            if p.is_dir():
                assert m.isdir()
            else:
                assert m.isfile()
                f = tar.extractfile(m)
                assert f is not None and f.read() == p.read_bytes()
        assert tar.extractfile(f"{top}/blobs/01.1-big.bin").read() == big


def test_tar_stream_hashed_dir_name(tmp_path: Path) -> None:
    r = FilesystemRecords(tmp_path / "r")
    rid = "weird/../id"
    r.open(rid, {"run_id": rid})
    _seal(r, rid)
    data = b"".join(r.tar_stream(rid))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        names = tar.getnames()
    top = "run-" + record_dir_name(rid)
    assert all(n == top or n.startswith(top + "/") for n in names)
    assert all(".." not in n.split("/") for n in names)
    for dirpath, _d, _f in os.walk(tmp_path):
        os.chmod(dirpath, 0o755)


def test_tar_stream_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        FilesystemRecords(tmp_path).tar_stream("nope")


def test_tar_stream_abandoned_early(rec: FilesystemRecords) -> None:
    rec.put_blob(RUN, 1, 1, "big.bin", os.urandom(500_000))
    _seal(rec)
    gen = rec.tar_stream(RUN)
    next(gen)
    gen.close()  # a client that went away: no error
