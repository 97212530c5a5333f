"""The filesystem Record store (docs/design.md#records) on disk: its directory layout, atomic
writes, locks that hold across processes, a half-done seal, modes, the tar of the directory, and
where progress chunks of live logs live
(docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log). What every backend does alike
through ``RecordStore`` is in tests/records."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from app.records import (
    FilesystemRecords,
    RecordSealed,
    check_location,
    legacy_record_location,
    record_location,
    write_atomic,
)
from tests.support.record_contents import verify_sums
from tests.support.records import RUN, seal_example


@pytest.fixture
def rec(tmp_path: Path):
    r = FilesystemRecords(tmp_path / "records")
    r.open(RUN, {"run_id": RUN, "state": "RUNNING"})
    for sub in ("steps", "logs", "blobs"):  # as they are once the first files landed
        (r.path(RUN) / sub).mkdir()
    yield r
    for dirpath, _dirs, _files in os.walk(tmp_path):  # let tmp_path cleanup work as non-root
        os.chmod(dirpath, 0o755)


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


# -- record locations / open / exists ------------------------------------------------------------


@pytest.mark.parametrize(
    "run_id",
    ["a/b", "../../etc", "..", ".", ".hidden", "x" * 500, "a\x00b", "a\\b", "", "ü/..", "/abs"],
)
def test_a_record_location_stays_inside_root(tmp_path: Path, run_id: str) -> None:
    r = FilesystemRecords(tmp_path)
    for location in (record_location(run_id), legacy_record_location(run_id)):
        assert check_location(location) == location
        assert "\x00" not in location and not {".", ".."} & set(location.split("/"))
        assert len(location.rpartition("/")[2]) <= 120
        assert r.path(location).resolve().is_relative_to(tmp_path.resolve())
    assert r.path(record_location(run_id)).parent == tmp_path / "_h"
    assert r.path(legacy_record_location(run_id)).parent == tmp_path


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
    # Opening is one small write: the parts appear with their first file.
    assert sorted(p.name for p in r.path("r1").iterdir()) == ["manifest.json"]
    r.put_blob("r1", 1, 0, "out.txt", b"x")
    r.append_log("r1", 1, "build", b"line\n", 1 << 20)
    assert (r.path("r1") / "blobs").is_dir() and (r.path("r1") / "logs").is_dir()


# -- logs ----------------------------------------------------------------------------------------


def test_append_and_read_log(rec: FilesystemRecords) -> None:
    assert rec.append_log(RUN, 1, "step", b"hello\n", 1000).total == 6
    assert rec.append_log(RUN, 1, "step", b"world\n", 1000).total == 12
    assert (rec.path(RUN) / "logs" / "01-step.log").read_bytes() == b"hello\nworld\n"
    assert rec.read_log(RUN, 1, "step", 0) == b"hello\nworld\n"


def test_log_file_names(rec: FilesystemRecords) -> None:
    rec.append_log(RUN, 0, "a", b"x", 10)
    rec.append_log(RUN, 7, "a", b"x", 10)
    rec.append_log(RUN, 123, "a", b"x", 10)
    names = sorted(p.name for p in (rec.path(RUN) / "logs").iterdir())
    assert names == ["00-a.log", "07-a.log", "123-a.log"]


def test_read_log_under_a_missing_root(tmp_path: Path) -> None:
    assert FilesystemRecords(tmp_path / "elsewhere").read_log("nobody", 1, "x", 0) == b""


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


# -- progress ------------------------------------------------------------------------------------


def test_progress_lives_beside_the_record_never_inside_it(rec: FilesystemRecords) -> None:
    rec.put_progress(RUN, 1, "build.step", 2, b"hello\n", 1000)
    d = rec.root / ".progress" / RUN
    assert rec.progress_path(RUN) == d
    assert [p.name for p in d.iterdir()] == ["01-build.step.2.log"]
    assert (d / "01-build.step.2.log").read_bytes() == b"hello\n"
    assert _mode(d) == 0o700 and _mode(d / "01-build.step.2.log") == 0o600  # a raw transcript
    assert not [p for p in rec.path(RUN).rglob("*") if p.is_file() and p.name != "manifest.json"]


def test_a_higher_attempt_removes_the_older_progress_files(rec: FilesystemRecords) -> None:
    rec.put_progress(RUN, 1, "build", 0, b"old\n", 1000)
    rec.put_progress(RUN, 2, "build", 0, b"other step\n", 1000)
    rec.put_progress(RUN, 1, "build", 3, b"new\n", 1000)
    names = sorted(p.name for p in rec.progress_path(RUN).iterdir())
    assert names == ["01-build.3.log", "02-build.0.log"]


def test_files_in_the_progress_directory_that_name_no_attempt_are_ignored(
    rec: FilesystemRecords,
) -> None:
    rec.put_progress(RUN, 1, "build", 1, b"x\n", 1000)
    d = rec.progress_path(RUN)
    for junk in ("garbage.txt", "01-build.log", "01-build.x.log", "01-build.9.tmp", ".tmp-01"):
        (d / junk).write_bytes(b"junk\n")
    assert rec.put_progress(RUN, 1, "build", 1, b"y\n", 1000).total == 4
    assert rec.read_progress(RUN, 1, "build", 0) == (b"x\ny\n", (4, 1, False))


def test_the_seal_removes_the_progress_directory_and_the_tar_never_holds_it(
    rec: FilesystemRecords,
) -> None:
    rec.put_progress(RUN, 1, "build", 0, b"RAW\n", 1000)
    seal_example(rec)
    assert not rec.progress_path(RUN).exists()
    with tarfile.open(fileobj=io.BytesIO(b"".join(rec.tar_stream(RUN))), mode="r:") as tar:
        assert not [n for n in tar.getnames() if "progress" in n]
    with pytest.raises(RecordSealed):
        rec.put_progress(RUN, 1, "build", 0, b"late\n", 1000)
    assert not rec.progress_path(RUN).exists()


def test_a_seal_again_drops_progress_left_by_a_seal_that_stopped_halfway(
    rec: FilesystemRecords,
) -> None:
    seal_example(rec)
    left = rec.progress_path(RUN) / "01-build.0.log"  # as if written before a crash mid-seal
    left.parent.mkdir(parents=True)
    left.write_bytes(b"x\n")
    seal_example(rec)
    assert not rec.progress_path(RUN).exists()


def _progress_worker(root: str, i: int) -> None:
    r = FilesystemRecords(root)
    for _ in range(40):
        r.put_progress(RUN, 1, "p", 0, b"proc%d-line\n" % i, 1 << 30)


def test_concurrent_progress_chunks_processes(rec: FilesystemRecords) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_progress_worker, args=(str(rec.root), i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    data = (rec.progress_path(RUN) / "01-p.0.log").read_bytes()
    assert len(data) == sum(40 * len(b"proc%d-line\n" % i) for i in range(4))
    assert all(line.startswith(b"proc") and line.endswith(b"-line") for line in data.splitlines())


# -- blobs / steps -------------------------------------------------------------------------------


def test_put_and_read_blob(rec: FilesystemRecords) -> None:
    rec.put_blob(RUN, 1, 2, "report.json", b'{"ok": true}')
    assert (rec.path(RUN) / "blobs" / "01.2-report.json").read_bytes() == b'{"ok": true}'
    rec.put_blob(RUN, 1, 2, "report.json", b"second")
    assert (rec.path(RUN) / "blobs" / "01.2-report.json").read_bytes() == b"second"
    rec.put_blob(RUN, 1, 2, "empty", b"")
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
        rec.put_blob(RUN, 1, 1, bad, b"x")
    with pytest.raises(ValueError):
        rec.write_step(RUN, 1, bad, {})
    with pytest.raises(ValueError):
        rec.seal(RUN, verdict={}, steps=[(1, bad, {})], events=[], manifest_update={})
    assert not rec.is_sealed(RUN)
    outside = sorted(p.name for p in rec.root.parent.iterdir())
    assert outside == ["records"]  # nothing written next to the root
    assert sorted(p.name for p in rec.root.iterdir()) == [RUN]


def test_odd_run_id_writes_stay_inside_root(tmp_path: Path) -> None:
    r = FilesystemRecords(tmp_path / "root")
    for run_id in ["../escape", "a/../../b", "..", "z" * 300]:
        where = record_location(run_id)
        r.open(where, {"run_id": run_id})
        r.append_log(where, 1, "s", b"x", 10)
        r.put_blob(where, 1, 1, "b", b"x")
        assert r.read_blob(where, 1, 1, "b") == b"x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]
    assert [p.name for p in (tmp_path / "root").iterdir()] == ["_h"]
    assert len(list((tmp_path / "root" / "_h").iterdir())) == 4


# -- seal ----------------------------------------------------------------------------------------


def test_seal_writes_files_and_sums(rec: FilesystemRecords) -> None:
    rec.append_log(RUN, 1, "build", b"compiling\n", 1000)
    rec.put_blob(RUN, 1, 1, "out.json", b"{}")
    assert not rec.is_sealed(RUN)
    seal_example(rec)
    assert rec.is_sealed(RUN)
    d = rec.path(RUN)
    assert json.loads((d / "verdict.json").read_bytes()) == {"state": "SUCCEEDED"}
    assert json.loads((d / "steps" / "01-build.json").read_bytes()) == {
        "node": "n1",
        "state": "SUCCEEDED",
    }
    assert (d / "steps" / "02-test.json").exists()
    paths = verify_sums(d)
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
    seal_example(rec)
    d = rec.path(RUN)
    assert _mode(d) == 0o555
    for p in d.rglob("*"):
        assert _mode(p) == (0o555 if p.is_dir() else 0o444), p


def test_sealed_record_refuses_writes(rec: FilesystemRecords) -> None:
    rec.append_log(RUN, 1, "build", b"x\n", 1000)
    seal_example(rec)
    before = (rec.path(RUN) / "logs" / "01-build.log").read_bytes()
    step = (rec.path(RUN) / "steps" / "01-build.json").read_bytes()
    with pytest.raises(RecordSealed):
        rec.append_log(RUN, 1, "build", b"more\n", 1000)
    with pytest.raises(RecordSealed):
        rec.put_blob(RUN, 1, 1, "late", b"x")
    with pytest.raises(RecordSealed):
        rec.write_step(RUN, 1, "build", {})
    assert (rec.path(RUN) / "logs" / "01-build.log").read_bytes() == before
    assert (rec.path(RUN) / "steps" / "01-build.json").read_bytes() == step
    assert not (rec.path(RUN) / "blobs" / "01.1-late").exists()
    verify_sums(rec.path(RUN))


def test_seal_completes_half_seal_after_sums(rec: FilesystemRecords) -> None:
    """Crash after SHA256SUMS and part of the chmods: sealing again finishes the job."""
    rec.append_log(RUN, 1, "build", b"x\n", 1000)
    seal_example(rec)
    d = rec.path(RUN)
    os.chmod(d, 0o755)
    os.chmod(d / "logs", 0o755)
    os.chmod(d / "logs" / "01-build.log", 0o644)
    assert not rec.is_sealed(RUN)
    with pytest.raises(RecordSealed):  # a seal has begun: no more writes
        rec.append_log(RUN, 1, "build", b"late\n", 1000)
    seal_example(rec)
    assert rec.is_sealed(RUN)
    verify_sums(d)
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
    seal_example(rec)
    assert rec.is_sealed(RUN)
    assert json.loads((d / "verdict.json").read_bytes()) == {"state": "SUCCEEDED"}
    assert not (d / "blobs" / ".tmp-abandoned").exists()
    assert "steps/01-build.json" in verify_sums(d)


# -- tar -----------------------------------------------------------------------------------------


def test_tar_stream_mirrors_the_directory_on_disk(rec: FilesystemRecords) -> None:
    rec.append_log(RUN, 1, "build", b"line\n" * 1000, 1 << 20)
    big = os.urandom(300_000)
    rec.put_blob(RUN, 1, 1, "big.bin", big)
    seal_example(rec)
    d = rec.path(RUN)
    chunks = list(rec.tar_stream(RUN))
    assert len(chunks) > 1
    assert all(isinstance(c, bytes) for c in chunks)
    assert max(len(c) for c in chunks) < len(big)  # really streamed, never the whole archive
    data = b"".join(chunks)
    assert len(data) % tarfile.RECORDSIZE == 0
    top = "run-" + RUN
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
        f = tar.extractfile(f"{top}/blobs/01.1-big.bin")
        assert f is not None and f.read() == big


def test_tar_stream_is_byte_for_byte_what_tarfile_writes_for_the_directory(
    rec: FilesystemRecords,
) -> None:
    rec.append_log(RUN, 1, "build", b"line\n" * 30_000, 1 << 20)
    rec.put_blob(RUN, 1, 1, "big.bin", os.urandom(300_001))
    rec.put_blob(RUN, 1, 1, "empty", b"")
    rec.put_blob(RUN, 2, 1, "ünïcødé-名前", b"x" * 511)
    rec.put_blob(RUN, 2, 1, "n" * 190, b"y" * 512)
    d = rec.path(RUN)
    os.link(d / "blobs" / "01.1-big.bin", d / "blobs" / "02.1-same-file")  # a hard link
    seal_example(rec)
    top = "run-" + RUN
    want = io.BytesIO()
    with tarfile.open(fileobj=want, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        tar.add(d, arcname=top)
    got = b"".join(rec.tar_stream(RUN))
    assert got == want.getvalue()
    with tarfile.open(fileobj=io.BytesIO(got), mode="r:") as tar:
        link = tar.getmember(f"{top}/blobs/02.1-same-file")
        assert link.islnk() and link.linkname == f"{top}/blobs/01.1-big.bin"


def test_tar_stream_skips_symlinks_and_special_files(
    rec: FilesystemRecords, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"not in the record")
    d = rec.path(RUN)
    os.symlink(secret, d / "blobs" / "01.1-link")
    os.symlink(tmp_path, d / "dirlink")
    os.mkfifo(d / "logs" / "01-fifo.log")
    rec.put_blob(RUN, 1, 1, "real", b"kept")
    data = b"".join(rec.tar_stream(RUN))
    assert b"not in the record" not in data
    top = "run-" + RUN
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        names = tar.getnames()
    assert names == [
        top,
        f"{top}/blobs",
        f"{top}/blobs/01.1-real",
        f"{top}/logs",
        f"{top}/manifest.json",
        f"{top}/steps",
    ]


def test_sha256sum_checks_a_sealed_record_whose_names_hold_a_newline_or_a_backslash(
    rec: FilesystemRecords,
) -> None:
    """A Record from before control characters were refused in names may hold such files: the
    seal escapes their SHA256SUMS lines the way GNU coreutils does, so ``sha256sum -c`` passes."""
    blobs = rec.path(RUN) / "blobs"
    blobs.mkdir(exist_ok=True)
    for name, data in [("01.0-a\nb", b"x"), ("01.0-c\\d", b"y"), ("01.0-e\rf", b"z")]:
        (blobs / name).write_bytes(data)
    seal_example(rec)

    check = subprocess.run(
        ["sha256sum", "--strict", "-c", "SHA256SUMS"],
        cwd=rec.path(RUN),
        capture_output=True,
        check=False,
    )

    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count(b": OK") == len(list(_regular_files(rec.path(RUN)))) - 1


def _regular_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]
