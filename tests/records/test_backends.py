"""Every Record store backend behaves alike through ``RecordStore`` (docs/design.md#records): logs
with a cap and a truncation note, progress chunks of live logs apart from them
(docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log), whole blobs, name checks, the seal
and what it refuses and drops, the tar of a sealed Record.

A backend joins by adding a factory to ``BACKENDS``: a context manager that is given a fresh
``tmp_path`` and yields an empty store, cleaning up after it."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.records import (
    FilesystemRecords,
    LogState,
    RecordSealed,
    RecordStore,
    check_location,
    check_name,
    legacy_record_location,
    record_location,
)
from app.records.common import json_bytes
from app.records.interface import location_name
from tests.support.record_contents import verify_sums
from tests.support.records import BACKENDS, MULTIPART, RUN, Backend, seal_example

NOTE = b"\n[mediator: log truncated at %d bytes]\n"
CAPPED = b'{"type":"enode.capped","bytes":%d}\n'
WHOLE = 1 << 30  # a read_log limit past any log here: the whole log, never cut


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RecordStore]:
    backend: Backend = request.param
    with backend(tmp_path) as s:
        yield s


@pytest.fixture
def rec(store: RecordStore) -> RecordStore:
    store.open(RUN, {"run_id": RUN, "state": "RUNNING"})
    return store


def _log(rec: RecordStore, seq: int, name: str, run_id: str = RUN) -> bytes:
    return rec.read_log(run_id, seq, name, 0, limit=WHOLE)


def _members(rec: RecordStore, run_id: str = RUN) -> dict[str, tarfile.TarInfo]:
    data = b"".join(rec.tar_stream(run_id))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return {m.name: m for m in tar.getmembers()}


def _files(rec: RecordStore, location: str = RUN) -> dict[str, bytes]:
    """The files of the run's Record as its tar holds them, by path inside the Record."""
    top = "run-" + location_name(location)
    out: dict[str, bytes] = {}
    data = b"".join(rec.tar_stream(location))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar.getmembers():
            assert m.name == top or m.name.startswith(top + "/"), m.name
            if m.isfile():
                f = tar.extractfile(m)
                assert f is not None
                out[m.name[len(top) + 1 :]] = f.read()
    return out


# -- the interface ---------------------------------------------------------------------------------


def _as_store(records: FilesystemRecords) -> RecordStore:
    return records  # the filesystem backend is a RecordStore to the type checker too


def test_every_backend_is_a_record_store(store: RecordStore) -> None:
    assert isinstance(store, RecordStore)


def test_filesystem_records_satisfies_the_protocol(tmp_path: Path) -> None:
    assert isinstance(_as_store(FilesystemRecords(tmp_path)), RecordStore)
    assert not isinstance(object(), RecordStore)


# -- names -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["step", "report.json", "a-b_c.d", "ünïcødé", "x" * 200])
def test_check_name_passes_one_path_segment(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize(
    "bad", ["", ".", "..", "a/b", "../x", "/abs", "a\\b", "..\\x", "a\x00b", "\udcff", "x" * 201]
)
def test_check_name_refuses_anything_else(bad: str) -> None:
    with pytest.raises(ValueError):
        check_name(bad)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_plain_run_id_is_its_record_location() -> None:
    assert record_location("run-abc.1.2:x@y") == "run-abc.1.2:x@y"
    assert record_location("x" * 120) == "x" * 120


@pytest.mark.parametrize(
    "run_id",
    ["a/b", "a\\b", "..", ".hidden", "x" * 121, "under_score", "_h", "run-" + "0" * 40, "ü", "a\n"],
)
def test_any_other_run_id_is_hashed_whole_under_h(run_id: str) -> None:
    assert record_location(run_id) == "_h/" + _sha256(run_id)


def test_no_new_location_is_where_the_old_rule_put_a_hashed_record() -> None:
    """The old rule hashed a long id to ``run-`` and 40 hex digits, which is a plain run id too:
    a run by that name is hashed now, so it never writes into the old Record."""
    long_id = "long-" + "x" * 150
    old = legacy_record_location(long_id)
    assert old == "run-" + _sha256(long_id)[:40]
    assert record_location(old) != old
    assert legacy_record_location("plain-1") == record_location("plain-1") == "plain-1"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        ".",
        "..",
        "a/b",
        "../x",
        ".hidden",
        "_h",
        "_x",
        "_h/" + "0" * 63,
        "_h/" + "G" * 64,
        "_h/../x",
        "x" * 121,
        "a\x00b",
        "plain\n",
        "_h/" + "0" * 64 + "\n",
    ],
)
def test_a_location_that_could_leave_the_root_is_a_value_error(
    store: RecordStore, bad: str
) -> None:
    with pytest.raises(ValueError):
        check_location(bad)
    with pytest.raises(ValueError):
        store.open(bad, {})
    with pytest.raises(ValueError):
        store.put_blob(bad, 1, 0, "b", b"x")
    with pytest.raises(ValueError):
        store.exists(bad)


BAD_NAMES = ["", ".", "..", "a/b", "../x", "/abs", "a\\b", "..\\x", "a\x00b"]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_a_bad_log_blob_or_step_name_is_a_value_error(rec: RecordStore, bad: str) -> None:
    with pytest.raises(ValueError):
        rec.append_log(RUN, 1, bad, b"x", 100)
    with pytest.raises(ValueError):
        rec.read_log(RUN, 1, bad, 0)
    with pytest.raises(ValueError):
        rec.put_blob(RUN, 1, 1, bad, b"x")
    with pytest.raises(ValueError):
        rec.read_blob(RUN, 1, 1, bad)
    with pytest.raises(ValueError):
        rec.seal(RUN, verdict={}, steps=[(1, bad, {})], events=[], manifest_update={})
    with pytest.raises(ValueError):
        rec.put_progress(RUN, 1, bad, 0, b"x", 100)
    with pytest.raises(ValueError):
        rec.read_progress(RUN, 1, bad, 0)
    with pytest.raises(ValueError):
        rec.log_slice(RUN, 1, bad, 0)
    assert not rec.is_sealed(RUN)
    assert rec.read_progress(RUN, 1, "s", 0) is None


@pytest.mark.parametrize("seq", [-1, True, 1.5, "1"])
def test_a_bad_seq_or_attempt_is_a_value_error(rec: RecordStore, seq: Any) -> None:
    with pytest.raises(ValueError):
        rec.append_log(RUN, seq, "s", b"x", 100)
    with pytest.raises(ValueError):
        rec.put_blob(RUN, 1, seq, "b", b"x")
    with pytest.raises(ValueError):
        rec.put_progress(RUN, seq, "s", 0, b"x", 100)
    with pytest.raises(ValueError):
        rec.put_progress(RUN, 1, "s", seq, b"x", 100)
    with pytest.raises(ValueError):
        rec.read_progress(RUN, seq, "s", 0)
    assert rec.read_progress(RUN, 1, "s", 0) is None


def test_odd_run_ids_each_get_their_own_record(store: RecordStore) -> None:
    run_ids = ["../escape", "a/../../b", "..", "z" * 300, "run-" + _sha256("z" * 300)[:40]]
    locations = [record_location(run_id) for run_id in run_ids]
    assert len(set(locations)) == len(run_ids)
    for i, where in enumerate(locations):
        store.open(where, {"run_id": run_ids[i]})
        store.append_log(where, 1, "s", b"%d" % i, 10)
        store.put_blob(where, 1, 1, "b", b"%d" % i)
    for i, where in enumerate(locations):
        assert store.exists(where)
        assert store.read_blob(where, 1, 1, "b") == b"%d" % i
        assert _log(store, 1, "s", where) == b"%d" % i


# -- open / exists -------------------------------------------------------------------------------


def test_open_is_idempotent_and_the_record_then_exists(store: RecordStore) -> None:
    assert not store.exists("r1")
    store.open("r1", {"run_id": "r1"})
    store.open("r1", {"run_id": "r1", "again": True})
    assert store.exists("r1")
    seal_example(store, "r1")
    assert json.loads(_files(store, "r1")["manifest.json"]) == {
        "run_id": "r1",
        "again": True,
        "state": "SUCCEEDED",
        "ended_at": "2024-01-01T00:00:00Z",
    }


def test_an_opened_manifest_is_the_whole_document(store: RecordStore) -> None:
    manifest = {"run_id": "r2", "state": "QUEUED", "requires": [{"as": "dut", "n": 1}]}
    store.open("r2", manifest)
    assert _files(store, "r2")["manifest.json"] == json_bytes(manifest)


def test_a_manifest_a_crashed_attempt_left_half_written_is_replaced_whole(tmp_path: Path) -> None:
    records = FilesystemRecords(tmp_path)
    left = records.path("r3")
    left.mkdir(parents=True)
    (left / "manifest.json").write_bytes(b'{"run_id": "r3", "sta')
    records.open("r3", {"run_id": "r3", "state": "RUNNING"})
    assert json.loads((left / "manifest.json").read_bytes()) == {"run_id": "r3", "state": "RUNNING"}
    assert [p.name for p in left.iterdir()] == ["manifest.json"]  # no temporary file left


# -- logs ----------------------------------------------------------------------------------------


def test_append_and_read_log(rec: RecordStore) -> None:
    assert rec.append_log(RUN, 1, "step", b"hello\n", 1000) == (6, 0, False)
    assert rec.append_log(RUN, 1, "step", b"world\n", 1000) == (12, 0, False)
    assert rec.read_log(RUN, 1, "step", 0) == b"hello\nworld\n"
    assert rec.read_log(RUN, 1, "step", 6) == b"world\n"
    assert rec.read_log(RUN, 1, "step", 12) == b""
    assert rec.read_log(RUN, 1, "step", 999) == b""
    assert rec.append_log(RUN, 1, "step", b"", 1000) == (12, 0, False)


def test_logs_of_different_steps_and_names_are_apart(rec: RecordStore) -> None:
    rec.append_log(RUN, 1, "a", b"1a", 10)
    rec.append_log(RUN, 2, "a", b"2a", 10)
    rec.append_log(RUN, 1, "b", b"1b", 10)
    assert [_log(rec, 1, "a"), _log(rec, 2, "a"), _log(rec, 1, "b")] == [b"1a", b"2a", b"1b"]


def test_read_missing_log(rec: RecordStore) -> None:
    assert rec.read_log(RUN, 3, "nope", 0) == b""
    assert rec.read_log("nobody", 1, "x", 0) == b""


def test_log_cap_and_note_exact_bytes(rec: RecordStore) -> None:
    cap = 10
    assert rec.append_log(RUN, 1, "s", b"01234", cap) == (5, 0, False)
    state = rec.append_log(RUN, 1, "s", b"56789abcdef", cap)
    expected = b"0123456789" + NOTE % cap
    assert state == (len(expected), 0, True)
    assert _log(rec, 1, "s") == expected
    assert rec.append_log(RUN, 1, "s", b"more\n", cap) == (len(expected), 0, True)
    assert rec.append_log(RUN, 1, "s", b"x" * 100, cap) == (len(expected), 0, True)
    assert _log(rec, 1, "s") == expected
    assert expected == b"0123456789\n[mediator: log truncated at 10 bytes]\n"


def test_log_exactly_at_cap_then_note(rec: RecordStore) -> None:
    assert rec.append_log(RUN, 1, "s", b"0123456789", 10) == (10, 0, False)  # fits, no note
    assert rec.append_log(RUN, 1, "s", b"", 10) == (10, 0, False)
    state = rec.append_log(RUN, 1, "s", b"x", 10)
    assert _log(rec, 1, "s") == b"0123456789" + NOTE % 10
    assert state == (10 + len(NOTE % 10), 0, True)


def test_log_first_append_over_cap(rec: RecordStore) -> None:
    state = rec.append_log(RUN, 2, "s", b"a" * 50, 20)
    assert _log(rec, 2, "s") == b"a" * 20 + NOTE % 20
    assert state == (20 + len(NOTE % 20), 0, True)


def test_a_log_with_a_budget_is_cut_where_the_budget_ends_and_never_grows_again(
    rec: RecordStore,
) -> None:
    # The run's records.max_run_bytes leaves a log this much room
    # (docs/security.md#runs-records-and-uploads): the note names where the log was cut, and a later
    # append, with room or without, adds nothing.
    assert rec.append_log(RUN, 1, "s", b"0123456789", 1000, budget=100) == (10, 0, False)
    state = rec.append_log(RUN, 1, "s", b"abcdefghij", 1000, budget=4)
    expected = b"0123456789abcd" + NOTE % 14
    assert state == (len(expected), 0, True)
    assert rec.append_log(RUN, 1, "s", b"more", 1000, budget=500) == (len(expected), 0, True)
    assert rec.append_log(RUN, 1, "s", b"more", 1000, budget=0) == (len(expected), 0, True)
    assert _log(rec, 1, "s") == expected


def test_a_log_with_no_budget_left_takes_only_the_note(rec: RecordStore) -> None:
    state = rec.append_log(RUN, 1, "s", b"hello\n", 1000, budget=0)

    assert state == (len(NOTE % 0), 0, True)
    assert _log(rec, 1, "s") == NOTE % 0


def test_a_log_within_its_budget_is_not_cut(rec: RecordStore) -> None:
    assert rec.append_log(RUN, 1, "s", b"0123456789", 1000, budget=10) == (10, 0, False)
    assert rec.append_log(RUN, 1, "s", b"", 1000, budget=0) == (10, 0, False)
    assert _log(rec, 1, "s") == b"0123456789"


def test_a_progress_chunk_with_a_budget_keeps_the_whole_lines_within_it(rec: RecordStore) -> None:
    first = rec.put_progress(RUN, 1, "p", 0, b"aaaa\n", 1000, budget=100)
    cut = rec.put_progress(RUN, 1, "p", 0, b"bbbb\ncccc\ndddd\n", 1000, budget=12)

    expected = b"aaaa\nbbbb\ncccc\n" + CAPPED % 17
    assert first == (5, 0, False)
    assert cut == (len(expected), 0, True)
    assert rec.read_progress(RUN, 1, "p", 0) == (expected, (len(expected), 0, True))
    newer = rec.put_progress(RUN, 1, "p", 1, b"eeee\nffff\n", 1000, budget=7)
    assert newer == (5 + len(CAPPED % 7), 1, True)
    assert rec.read_progress(RUN, 1, "p", 0)[0] == b"eeee\n" + CAPPED % 7


def test_concurrent_appends_threads(rec: RecordStore) -> None:
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
    data = _log(rec, 1, "c")
    assert len(data) == n_threads * per * (len(line) + 2)
    lines = data.splitlines(keepends=True)
    assert len(lines) == n_threads * per
    for i in range(n_threads):
        assert lines.count(b"%d:" % i + line) == per


def test_concurrent_appends_threads_with_cap(rec: RecordStore) -> None:
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
    data = _log(rec, 1, "cc")
    assert len(data) == cap + len(NOTE % cap)
    assert data.endswith(NOTE % cap) and data.count(b"[mediator:") == 1


def test_read_log_limit_cuts_at_newline(rec: RecordStore) -> None:
    rec.append_log(RUN, 1, "s", b"aaa\nbbb\nccc", 1000)
    assert rec.read_log(RUN, 1, "s", 0, limit=6) == b"aaa\n"  # more remain: cut after newline
    assert rec.read_log(RUN, 1, "s", 0, limit=8) == b"aaa\nbbb\n"
    assert rec.read_log(RUN, 1, "s", 0, limit=9) == b"aaa\nbbb\n"
    assert rec.read_log(RUN, 1, "s", 0, limit=11) == b"aaa\nbbb\nccc"  # nothing beyond: no cut
    assert rec.read_log(RUN, 1, "s", 0, limit=100) == b"aaa\nbbb\nccc"
    assert rec.read_log(RUN, 1, "s", 4, limit=5) == b"bbb\n"
    assert rec.read_log(RUN, 1, "s", 8, limit=2) == b"cc"  # no newline within the limit: raw
    assert rec.read_log(RUN, 1, "s", 0, limit=0) == b""


def test_read_log_follow(rec: RecordStore) -> None:
    body = b"x" * 10 + b"\n" + b"y" * 10 + b"\n" + b"z" * 5
    rec.append_log(RUN, 1, "f", body, 1 << 20)
    got, off = b"", 0
    while True:
        chunk = rec.read_log(RUN, 1, "f", off, limit=15)
        if not chunk:
            break
        got += chunk
        off += len(chunk)
    assert got == body == _log(rec, 1, "f")


def test_read_log_default_limit(rec: RecordStore) -> None:
    body = (b"l" * 99 + b"\n") * 20000  # 2,000,000 bytes
    rec.append_log(RUN, 1, "big", body, 1 << 30)
    first = rec.read_log(RUN, 1, "big", 0)
    assert len(first) <= 1 << 20 and first.endswith(b"\n") and len(first) % 100 == 0
    assert len(first) == (1 << 20) // 100 * 100


def test_read_log_bad_offset(rec: RecordStore) -> None:
    with pytest.raises(ValueError):
        rec.read_log(RUN, 1, "s", -1)


def test_log_slice_tells_the_log_s_length_and_whether_the_cap_cut_it(rec: RecordStore) -> None:
    assert rec.log_slice(RUN, 1, "s", 0) == (b"", LogState(0, 0, False))
    rec.append_log(RUN, 1, "s", b"aaa\nbbb\n", 10)
    assert rec.log_slice(RUN, 1, "s", 4) == (b"bbb\n", LogState(8, 0, False))
    assert rec.log_slice(RUN, 1, "s", 0, limit=5) == (b"aaa\n", LogState(8, 0, False))
    rec.append_log(RUN, 1, "s", b"ccc\n", 10)
    whole = b"aaa\nbbb\ncc" + NOTE % 10
    assert rec.log_slice(RUN, 1, "s", 0, limit=WHOLE) == (whole, LogState(len(whole), 0, True))
    with pytest.raises(ValueError):
        rec.log_slice(RUN, 1, "s", -1)


# -- progress --------------------------------------------------------------------------------------


def _progress(
    rec: RecordStore, seq: int, name: str, offset: int = 0, run_id: str = RUN
) -> bytes | None:
    got = rec.read_progress(run_id, seq, name, offset, limit=WHOLE)
    return None if got is None else got[0]


def test_progress_of_one_attempt_is_appended_and_kept_apart_from_the_log(
    rec: RecordStore,
) -> None:
    assert rec.read_progress(RUN, 1, "build", 0) is None
    assert rec.put_progress(RUN, 1, "build", 0, b"one\n", 1000) == LogState(4, 0, False)
    assert rec.put_progress(RUN, 1, "build", 0, b"two\n", 1000) == LogState(8, 0, False)
    assert rec.read_progress(RUN, 1, "build", 0) == (b"one\ntwo\n", LogState(8, 0, False))
    assert rec.read_progress(RUN, 1, "build", 4) == (b"two\n", LogState(8, 0, False))
    assert rec.read_progress(RUN, 1, "build", 99) == (b"", LogState(8, 0, False))
    assert _log(rec, 1, "build") == b""
    rec.append_log(RUN, 1, "build", b"final\n", 1000)
    assert _progress(rec, 1, "build") == b"one\ntwo\n"
    assert rec.put_progress(RUN, 1, "build", 0, b"", 1000) == LogState(8, 0, False)


def test_progress_of_different_steps_and_names_is_apart(rec: RecordStore) -> None:
    rec.put_progress(RUN, 1, "a", 0, b"1a", 10)
    rec.put_progress(RUN, 2, "a", 5, b"2a", 10)
    rec.put_progress(RUN, 1, "a.b", 0, b"1ab", 10)
    assert [_progress(rec, 1, "a"), _progress(rec, 2, "a"), _progress(rec, 1, "a.b")] == [
        b"1a",
        b"2a",
        b"1ab",
    ]
    assert rec.read_progress(RUN, 3, "a", 0) is None
    assert rec.read_progress("nobody", 1, "a", 0) is None


def test_a_chunk_of_a_lower_attempt_changes_nothing(rec: RecordStore) -> None:
    rec.put_progress(RUN, 1, "build", 2, b"aa\n", 1000)
    late = rec.put_progress(RUN, 1, "build", 1, b"cc\n", 1000)
    assert late == LogState(3, 2, False)
    assert rec.read_progress(RUN, 1, "build", 0) == (b"aa\n", LogState(3, 2, False))


def test_a_chunk_of_a_higher_attempt_starts_the_progress_afresh(rec: RecordStore) -> None:
    rec.put_progress(RUN, 1, "build", 0, b"old old\n", 1000)
    assert rec.put_progress(RUN, 1, "build", 1, b"new\n", 1000) == LogState(4, 1, False)
    assert rec.read_progress(RUN, 1, "build", 0) == (b"new\n", LogState(4, 1, False))
    assert rec.put_progress(RUN, 1, "build", 0, b"stale\n", 1000) == LogState(4, 1, False)
    assert rec.put_progress(RUN, 1, "build", 7, b"", 1000) == LogState(0, 7, False)
    assert rec.read_progress(RUN, 1, "build", 0) == (b"", LogState(0, 7, False))


def test_progress_within_the_cap_is_stored_as_sent(rec: RecordStore) -> None:
    assert rec.put_progress(RUN, 1, "s", 0, b"half a li", 20) == LogState(9, 0, False)
    assert rec.put_progress(RUN, 1, "s", 0, b"ne\n" + b"x" * 8, 20) == LogState(20, 0, False)
    assert _progress(rec, 1, "s") == b"half a line\n" + b"x" * 8


def test_progress_past_the_cap_keeps_whole_lines_then_one_cap_line(rec: RecordStore) -> None:
    state = rec.put_progress(RUN, 1, "s", 0, b"aaaa\nbbbb\ncc", 10)
    body = b"aaaa\nbbbb\n" + CAPPED % 10
    assert state == LogState(len(body), 0, True)
    assert _progress(rec, 1, "s") == body
    for more in (b"more\n", b"", b"x" * 100):
        assert rec.put_progress(RUN, 1, "s", 0, more, 10) == LogState(len(body), 0, True)
    assert rec.read_progress(RUN, 1, "s", 0, limit=WHOLE) == (body, LogState(len(body), 0, True))


def test_the_cap_line_closes_a_half_line_first(rec: RecordStore) -> None:
    rec.put_progress(RUN, 1, "s", 0, b"aaaa\nbb", 200)
    state = rec.put_progress(RUN, 1, "s", 0, b"x" * 300, 200)  # no newline fits: none of it
    body = b"aaaa\nbb\n" + CAPPED % 200
    assert state == LogState(len(body), 0, True) and len(body) < 200
    assert _progress(rec, 1, "s") == body


def test_a_first_chunk_past_the_cap_without_a_newline_is_only_the_cap_line(
    rec: RecordStore,
) -> None:
    assert rec.put_progress(RUN, 1, "s", 3, b"y" * 50, 20) == LogState(len(CAPPED % 20), 3, True)
    assert _progress(rec, 1, "s") == CAPPED % 20
    assert rec.put_progress(RUN, 1, "s", 4, b"fresh\n", 20) == LogState(6, 4, False)


def test_progress_that_only_looks_like_a_cap_line_inside_a_line_is_not_capped(
    rec: RecordStore,
) -> None:
    text = b"say " + CAPPED % 5
    assert rec.put_progress(RUN, 1, "s", 0, text, 1000) == LogState(len(text), 0, False)
    assert rec.put_progress(RUN, 1, "s", 0, b"on\n", 1000) == LogState(len(text) + 3, 0, False)


def test_read_progress_limit_cuts_at_a_newline(rec: RecordStore) -> None:
    rec.put_progress(RUN, 1, "s", 0, b"aaa\nbbb\nccc", 1000)
    state = LogState(11, 0, False)
    assert rec.read_progress(RUN, 1, "s", 0, limit=6) == (b"aaa\n", state)
    assert rec.read_progress(RUN, 1, "s", 0, limit=11) == (b"aaa\nbbb\nccc", state)
    assert rec.read_progress(RUN, 1, "s", 8, limit=2) == (b"cc", state)
    assert rec.read_progress(RUN, 1, "s", 0, limit=0) == (b"", state)
    with pytest.raises(ValueError):
        rec.read_progress(RUN, 1, "s", -1)


def test_concurrent_progress_chunks_threads(rec: RecordStore) -> None:
    line = b"0123456789abcdef\n"
    n_threads, per = 8, 40
    barrier = threading.Barrier(n_threads)

    def worker(i: int) -> None:
        barrier.wait()
        for _ in range(per):
            rec.put_progress(RUN, 1, "c", 0, b"%d:" % i + line, 1 << 30)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = _progress(rec, 1, "c")
    assert data is not None and len(data) == n_threads * per * (len(line) + 2)
    lines = data.splitlines(keepends=True)
    assert all(lines.count(b"%d:" % i + line) == per for i in range(n_threads))


def test_the_seal_drops_progress_and_refuses_more(rec: RecordStore) -> None:
    rec.put_progress(RUN, 1, "build", 0, b"RAW TRANSCRIPT\n", 1000)
    rec.append_log(RUN, 1, "build", b"final\n", 1000)
    seal_example(rec)
    assert rec.read_progress(RUN, 1, "build", 0) is None
    files = _files(rec)
    assert files["logs/01-build.log"] == b"final\n"
    assert not [p for p, data in files.items() if b"RAW TRANSCRIPT" in data]
    assert "logs/01-build.log" in verify_sums(files)
    with pytest.raises(RecordSealed):
        rec.put_progress(RUN, 1, "build", 0, b"late\n", 1000)
    assert rec.read_progress(RUN, 1, "build", 0) is None
    seal_example(rec)  # again: nothing changes
    assert _files(rec) == files


# -- blobs ---------------------------------------------------------------------------------------


def test_put_and_read_blob(rec: RecordStore) -> None:
    digest = rec.put_blob(RUN, 1, 2, "report.json", b'{"ok": true}')
    assert digest == hashlib.sha256(b'{"ok": true}').hexdigest()
    assert rec.read_blob(RUN, 1, 2, "report.json") == b'{"ok": true}'
    assert rec.read_blob(RUN, 1, 1, "report.json") is None
    assert rec.read_blob(RUN, 1, 2, "other") is None
    assert rec.read_blob("no-such-run", 1, 2, "report.json") is None
    rec.put_blob(RUN, 1, 2, "report.json", b"second")
    assert rec.read_blob(RUN, 1, 2, "report.json") == b"second"
    assert rec.put_blob(RUN, 1, 2, "empty", b"") == hashlib.sha256(b"").hexdigest()
    assert rec.read_blob(RUN, 1, 2, "empty") == b""


def test_a_blob_read_with_a_limit_gives_at_most_that_many_bytes_from_its_start(
    rec: RecordStore,
) -> None:
    # What the asks inbox shows of an artifact: never more than its first 32 KiB are read.
    body = bytes(range(256)) * 200  # 51,200 bytes
    rec.put_blob(RUN, 1, 0, "boot.log", body)
    rec.put_blob(RUN, 1, 0, "empty", b"")

    assert rec.read_blob(RUN, 1, 0, "boot.log", limit=32 * 1024 + 1) == body[: 32 * 1024 + 1]
    assert rec.read_blob(RUN, 1, 0, "boot.log", limit=len(body) + 10) == body
    assert rec.read_blob(RUN, 1, 0, "boot.log", limit=1) == body[:1]
    assert rec.read_blob(RUN, 1, 0, "empty", limit=100) == b""
    assert rec.read_blob(RUN, 1, 0, "missing", limit=100) is None


# -- seal ----------------------------------------------------------------------------------------


def test_seal_writes_files_and_sums(rec: RecordStore) -> None:
    rec.append_log(RUN, 1, "build", b"compiling\n", 1000)
    rec.put_blob(RUN, 1, 1, "out.json", b"{}")
    assert not rec.is_sealed(RUN)
    seal_example(rec)
    assert rec.is_sealed(RUN)
    files = _files(rec)
    assert json.loads(files["verdict.json"]) == {"state": "SUCCEEDED"}
    assert json.loads(files["events.json"]) == [{"kind": "created"}, {"kind": "finished"}]
    assert json.loads(files["steps/01-build.json"]) == {"node": "n1", "state": "SUCCEEDED"}
    assert json.loads(files["steps/02-test.json"]) == {"state": "SUCCEEDED"}
    manifest = json.loads(files["manifest.json"])
    assert manifest == {"run_id": RUN, "state": "SUCCEEDED", "ended_at": "2024-01-01T00:00:00Z"}
    assert files["logs/01-build.log"] == b"compiling\n"
    assert files["blobs/01.1-out.json"] == b"{}"
    assert verify_sums(files) == [
        "blobs/01.1-out.json",
        "events.json",
        "logs/01-build.log",
        "manifest.json",
        "steps/01-build.json",
        "steps/02-test.json",
        "verdict.json",
    ]


def test_record_documents_are_sorted_json_indented_by_two(rec: RecordStore) -> None:
    rec.seal(RUN, verdict={"b": 1, "a": [1, 2]}, steps=[], events=[], manifest_update={})
    text = _files(rec)["verdict.json"].decode()
    assert json.loads(text) == {"a": [1, 2], "b": 1}
    assert text.index('"a"') < text.index('"b"')
    assert '\n  "a": [\n' in text and text.endswith("}\n")


def test_sealed_record_refuses_writes(rec: RecordStore) -> None:
    rec.append_log(RUN, 1, "build", b"x\n", 1000)
    seal_example(rec)
    before = _files(rec)
    with pytest.raises(RecordSealed):
        rec.append_log(RUN, 1, "build", b"more\n", 1000)
    with pytest.raises(RecordSealed):
        rec.put_blob(RUN, 1, 1, "late", b"x")
    assert rec.read_blob(RUN, 1, 1, "late") is None
    assert rec.read_log(RUN, 1, "build", 0) == b"x\n"
    assert _files(rec) == before
    verify_sums(before)


def test_seal_is_idempotent(rec: RecordStore) -> None:
    seal_example(rec)
    before = _files(rec)
    rec.seal(RUN, verdict={"state": "DIFFERENT"}, steps=[], events=[], manifest_update={"x": 1})
    assert _files(rec) == before
    assert rec.is_sealed(RUN)


def test_seal_without_open(store: RecordStore) -> None:
    seal_example(store, "never-opened")
    assert store.is_sealed("never-opened")
    files = _files(store, "never-opened")
    assert json.loads(files["manifest.json"])["state"] == "SUCCEEDED"
    verify_sums(files)


def test_is_sealed_missing(store: RecordStore) -> None:
    assert not store.is_sealed("nothing")
    assert not store.exists("nothing")


# -- tar -----------------------------------------------------------------------------------------


def test_tar_stream(rec: RecordStore) -> None:
    rec.append_log(RUN, 1, "build", b"line\n" * 1000, 1 << 20)
    big = os.urandom(300_000)
    rec.put_blob(RUN, 1, 1, "big.bin", big)
    seal_example(rec)
    chunks = list(rec.tar_stream(RUN))
    assert len(chunks) > 1
    assert all(isinstance(c, bytes) for c in chunks)
    assert max(len(c) for c in chunks) < len(big)  # really streamed, never the whole archive
    data = b"".join(chunks)
    assert len(data) % tarfile.RECORDSIZE == 0
    top = "run-" + RUN
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        members = {m.name: m for m in tar.getmembers()}
        dirs = {n for n, m in members.items() if m.isdir()}
        assert dirs == {top, f"{top}/steps", f"{top}/logs", f"{top}/blobs"}
        assert all(members[n].mode == 0o555 for n in dirs)  # sealed: read-only
        files = {n for n, m in members.items() if m.isfile()}
        assert files == set(members) - dirs
        assert all(members[n].mode == 0o444 for n in files)
        f = tar.extractfile(f"{top}/blobs/01.1-big.bin")
        assert f is not None and f.read() == big
        f = tar.extractfile(f"{top}/logs/01-build.log")
        assert f is not None and f.read() == b"line\n" * 1000
    verify_sums(_files(rec))


def test_tar_stream_hashed_dir_name(store: RecordStore) -> None:
    rid = "weird/../id"
    where = record_location(rid)
    store.open(where, {"run_id": rid})
    seal_example(store, where)
    names = list(_members(store, where))
    top = "run-" + _sha256(rid)
    assert top in names
    assert all(n == top or n.startswith(top + "/") for n in names)
    assert all(".." not in n.split("/") for n in names)


def test_tar_stream_missing(store: RecordStore) -> None:
    with pytest.raises(FileNotFoundError):
        store.tar_stream("nope")  # at once, before any chunk is asked for


def test_tar_stream_abandoned_early(rec: RecordStore) -> None:
    rec.put_blob(RUN, 1, 1, "big.bin", os.urandom(500_000))
    seal_example(rec)
    gen = rec.tar_stream(RUN)
    next(gen)
    close = getattr(gen, "close", None)
    if close is not None:
        close()  # a client that went away: no error


# -- delete --------------------------------------------------------------------------------------


def test_delete_removes_a_sealed_record_and_leaves_the_others(store: RecordStore) -> None:
    for run_id in ("gone", "kept"):
        store.open(run_id, {"run_id": run_id})
        store.append_log(run_id, 1, "build", b"line\n", 1000)
        store.put_blob(run_id, 1, 1, "out.json", b"{}")
        store.put_progress(run_id, 2, "test", 0, b"live\n", 1000)
    seal_example(store, "gone")
    store.delete("gone")
    assert not store.exists("gone") and not store.is_sealed("gone")
    assert store.read_blob("gone", 1, 1, "out.json") is None
    assert _log(store, 1, "build", "gone") == b""
    assert store.read_progress("gone", 2, "test", 0) is None
    with pytest.raises(FileNotFoundError):
        store.tar_stream("gone")
    assert store.exists("kept") and store.read_blob("kept", 1, 1, "out.json") == b"{}"
    assert _log(store, 1, "build", "kept") == b"line\n"
    assert _progress(store, 2, "test", run_id="kept") == b"live\n"
    store.delete("gone")  # again, and a run that never had a Record: nothing to do
    store.delete("never-there")


def test_delete_removes_an_unsealed_record_with_its_progress(rec: RecordStore) -> None:
    rec.append_log(RUN, 1, "build", b"x\n", 100)
    rec.put_progress(RUN, 1, "build", 3, b"p\n", 100)
    rec.delete(RUN)
    assert not rec.exists(RUN)
    assert rec.read_progress(RUN, 1, "build", 0) is None
    assert _log(rec, 1, "build") == b""


# -- large objects -------------------------------------------------------------------------------


def test_a_blob_and_a_log_past_the_multipart_threshold_seal_and_stream_whole(
    rec: RecordStore,
) -> None:
    big = os.urandom(MULTIPART + 123_457)
    assert rec.put_blob(RUN, 1, 1, "big.bin", big) == hashlib.sha256(big).hexdigest()
    assert rec.read_blob(RUN, 1, 1, "big.bin") == big
    piece = os.urandom(1 << 20)
    for _ in range(6):  # a log longer than one part once it is sealed as one object
        rec.append_log(RUN, 1, "build", piece, 1 << 30)
    seal_example(rec)
    files = _files(rec)
    assert files["blobs/01.1-big.bin"] == big
    assert files["logs/01-build.log"] == piece * 6
    assert rec.read_log(RUN, 1, "build", 5 << 20, limit=WHOLE) == piece
    assert "blobs/01.1-big.bin" in verify_sums(files)
