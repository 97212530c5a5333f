"""What the original fleet's node agent does with logs and blobs
(docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log,
docs/api.md#put-v1runsrun_idstepsseqblobname--upload-an-artifact): progress chunks of a live log
kept apart from the final log and dropped at the seal, the headers a viewer and the agent read back,
appends ordered through the database, and blobs of any valid name, declared in the step's ``out`` or
not, resolved by name as the agent and ``in.from`` read them."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from app.config import to_libpq_url
from app.store.log_lock import LOG_LOCK_CLASS, log_lock_key
from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done, put_blob
from tests.support.apps import client_of
from tests.support.contracts import contract, role
from tests.support.record_contents import tar_files
from tests.support.rows import scalar
from tests.support.submitter import submit

one_app_per_module = True

# Above 1 MiB, so a progress file can be longer than one GET reply.
MAX_BLOB = 1_200_000
GONE = {"error": {"code": 410, "reason": "run has already finished"}}
INVALID_ATTEMPT = {"error": {"code": 400, "reason": "invalid attempt"}}


@pytest.fixture(scope="module")
def module_config() -> dict[str, Any]:
    return {"max_blob_bytes": MAX_BLOB}


# ---------------------------------------------------------------- builders


def placed(client: Any, run_id: str = "r1") -> None:
    """A RUNNING run whose one step (boot, declaring result.json) is bound to node n1."""
    advertise(client, "n1", cap("board"))
    steps = [{"id": "boot", "uses": "dut", "run": ["boot-test"], "out": ["result.json"]}]
    submit(client, contract(run_id, role("dut"), steps=steps), 201)


def booting(client: Any) -> None:
    """:func:`placed`, and n1 has claimed the boot step: uploads are taken only from the step
    that makes them, while it is claimed."""
    placed(client)
    assert claimed(client, "n1")["name"] == "boot"


def retried(client: Any, *, first_attempt: bytes | None = None) -> None:
    """boot, then a check that loops back to it: the check fails once, so boot is claimed again
    in attempt 1. ``first_attempt``: a progress chunk boot's attempt 0 sent while it ran."""
    advertise(client, "n1", cap("board"))
    steps = [
        {"id": "boot", "uses": "dut", "run": ["boot-test"]},
        {
            "id": "check",
            "uses": "dut",
            "run": ["check"],
            "loop": {"back_to": "boot", "max": 3, "until": {"exit_code": 0}},
        },
    ]
    submit(client, contract("r1", role("dut"), steps=steps), 201)
    assert claimed(client, "n1")["name"] == "boot"
    if first_attempt is not None:
        assert chunk(client, 0, first_attempt).status_code == 200
    done(client, "r1", 1, "n1")
    assert claimed(client, "n1")["name"] == "check"
    assert done(client, "r1", 2, "n1", exit_code=1).get("rolled_back") is True
    body = claimed(client, "n1")
    assert (body["name"], body["attempt"]) == ("boot", 1)


def chunk(client: Any, attempt: Any, data: bytes, *, seq: int = 1, name: str = "build") -> Any:
    """A progress chunk, as the agent's uploader sends it while the step runs."""
    return client.put(
        f"/v1/runs/r1/steps/{seq}/log?name={name}&progress=1&attempt={attempt}", data=data
    )


def final_log(client: Any, data: bytes, *, name: str = "build") -> Any:
    """The step's final log, as the agent sends it when the step ends."""
    return client.put(f"/v1/runs/r1/steps/1/log?name={name}", data=data)


def get_log(client: Any, offset: int = 0, *, seq: int = 1, name: str = "build") -> Any:
    resp = client.get(f"/v1/runs/r1/steps/{seq}/log?name={name}&from={offset}")
    assert resp.status_code == 200, resp.get_json()
    return resp


def finish(client: Any) -> None:
    """The claimed boot step uploads its result and reports it done: the run SUCCEEDS and is
    sealed."""
    assert client.put("/v1/runs/r1/steps/1/blob/result.json", data=b"{}").status_code == 204
    assert done(client, "r1", 1, "n1", produced=["result.json"])["run_state"] == "SUCCEEDED"


def record_files(client: Any) -> dict[str, bytes]:
    resp = client.get("/v1/runs/r1/record")
    assert resp.status_code == 200
    return tar_files(resp.data)


def attempt_of(sql: Any, seq: int, run_id: str = "r1") -> int:
    return scalar(sql, "select attempt from steps where run_id = %s and seq = %s", run_id, seq)


# ---------------------------------------------------------------- progress PUT


def test_a_progress_chunk_answers_its_total_and_attempt_and_is_not_the_log(client):
    booting(client)

    resp = chunk(client, 0, b"compiling 1/3\n")

    assert resp.status_code == 200
    assert resp.headers["X-Enode-Log-Bytes"] == "14"
    assert resp.headers["X-Enode-Log-Attempt"] == "0"
    assert "X-Enode-Log-Capped" not in resp.headers
    assert final_log(client, b"done\n").headers["X-Enode-Log-Bytes"] == "5"


def test_progress_chunks_of_one_attempt_are_appended(client):
    retried(client)

    first = chunk(client, 1, b"one\n")
    second = chunk(client, 1, b"two\n")

    assert (first.headers["X-Enode-Log-Bytes"], second.headers["X-Enode-Log-Bytes"]) == ("4", "8")
    assert second.headers["X-Enode-Log-Attempt"] == "1"
    assert get_log(client).data == b"one\ntwo\n"


def test_a_chunk_of_a_lower_attempt_is_discarded_with_the_current_headers(client):
    retried(client)
    chunk(client, 1, b"new\n")

    late = chunk(client, 0, b"old old\n")

    assert late.status_code == 200
    assert (late.headers["X-Enode-Log-Attempt"], late.headers["X-Enode-Log-Bytes"]) == ("1", "4")
    assert get_log(client).data == b"new\n"


def test_a_chunk_of_a_higher_attempt_replaces_the_progress(client):
    retried(client, first_attempt=b"attempt zero\n")

    newer = chunk(client, 1, b"one\n")

    assert (newer.headers["X-Enode-Log-Attempt"], newer.headers["X-Enode-Log-Bytes"]) == ("1", "4")
    live = get_log(client)
    assert live.data == b"one\n" and live.headers["X-Enode-Log-Attempt"] == "1"


@pytest.mark.parametrize("attempt", ["-1", "x", "1.5", "", "0x1", "²", "9" * 30])
def test_a_progress_chunk_whose_attempt_is_not_a_number_from_0_is_400(client, ctx, attempt):
    placed(client)

    resp = chunk(client, attempt, b"x\n")

    assert resp.status_code == 400 and resp.get_json() == INVALID_ATTEMPT
    assert not (ctx.records.root / ".progress").exists()


def test_a_progress_chunk_without_an_attempt_is_400(client):
    placed(client)

    resp = client.put("/v1/runs/r1/steps/1/log?name=build&progress=1", data=b"x\n")

    assert resp.status_code == 400 and resp.get_json() == INVALID_ATTEMPT


def test_progress_past_the_cap_keeps_whole_lines_then_a_cap_line_and_stops(client):
    booting(client)
    head = b"x" * (MAX_BLOB - 10) + b"\n"
    chunk(client, 0, head)

    over = chunk(client, 0, b"abc\ndefghijk\nlmn")
    later = chunk(client, 0, b"more\n")

    body = get_log(client, len(head)).data
    assert body == b'abc\n{"type":"enode.capped","bytes":%d}\n' % MAX_BLOB
    assert over.headers["X-Enode-Log-Capped"] == "1"
    assert over.headers["X-Enode-Log-Bytes"] == str(len(head) + len(body))
    assert later.headers["X-Enode-Log-Capped"] == "1"
    assert later.headers["X-Enode-Log-Bytes"] == over.headers["X-Enode-Log-Bytes"]


# ---------------------------------------------------------------- GET


def test_before_the_seal_a_get_serves_the_progress_with_its_headers(client):
    retried(client)
    chunk(client, 1, b"live line\n")
    final_log(client, b"what the step said\n")

    resp = get_log(client)

    assert resp.data == b"live line\n"
    assert resp.headers["X-Enode-Log-Source"] == "progress"
    assert resp.headers["X-Enode-Log-Attempt"] == "1"
    assert resp.headers["X-Enode-Log-Bytes"] == "10"
    assert "X-Enode-Log-Capped" not in resp.headers


def test_before_the_seal_without_progress_a_get_serves_the_appended_log(client):
    booting(client)
    final_log(client, b"appended\n")

    resp = get_log(client)

    assert resp.data == b"appended\n"
    assert resp.headers["X-Enode-Log-Source"] == "progress"
    assert (resp.headers["X-Enode-Log-Bytes"], resp.headers["X-Enode-Log-Attempt"]) == ("9", "0")


def test_after_the_seal_a_get_serves_the_sealed_log_and_the_progress_is_gone(client, ctx):
    booting(client)
    chunk(client, 0, b"RAW TRANSCRIPT\n")
    final_log(client, b"final log\n")

    finish(client)

    resp = get_log(client)
    assert resp.data == b"final log\n"
    assert resp.headers["X-Enode-Log-Source"] == "sealed"
    assert (resp.headers["X-Enode-Log-Bytes"], resp.headers["X-Enode-Log-Attempt"]) == ("10", "0")
    files = record_files(client)
    assert files["run-r1/logs/01-build.log"] == b"final log\n"
    assert not [path for path, data in files.items() if b"RAW TRANSCRIPT" in data]
    progress = ctx.records.root / ".progress"
    assert not progress.exists() or not any(progress.iterdir())
    late = chunk(client, 0, b"late\n")
    assert late.status_code == 410 and late.get_json() == GONE
    assert not progress.exists() or not any(progress.iterdir())


def test_a_get_from_an_offset_resumes_the_progress_and_keeps_its_total(client):
    booting(client)
    chunk(client, 0, b"first\n")
    chunk(client, 0, b"second\n")

    whole = get_log(client)
    rest = get_log(client, 6)
    end = get_log(client, 13)

    assert whole.data == b"first\nsecond\n" and rest.data == b"second\n" and end.data == b""
    assert {r.headers["X-Enode-Log-Bytes"] for r in (whole, rest, end)} == {"13"}


def test_a_progress_longer_than_one_reply_is_read_in_slices_that_end_at_a_newline(client):
    booting(client)
    lines = b"".join(b"%099d\n" % i for i in range(11_000))  # 1,100,000 bytes
    chunk(client, 0, lines)

    first = get_log(client)
    rest = get_log(client, len(first.data))

    assert 0 < len(first.data) <= 1 << 20 and first.data.endswith(b"\n")
    assert first.data + rest.data == lines
    assert first.headers["X-Enode-Log-Bytes"] == str(len(lines))


def test_a_get_of_capped_progress_says_capped(client):
    booting(client)
    chunk(client, 0, b"y" * MAX_BLOB)  # exactly the cap: not cut yet
    chunk(client, 0, b"z\n")

    head = get_log(client)
    tail = get_log(client, MAX_BLOB)

    assert head.headers["X-Enode-Log-Capped"] == "1" and head.data == b"y" * (1 << 20)
    assert tail.data == b'\n{"type":"enode.capped","bytes":%d}\n' % MAX_BLOB


def test_a_get_of_a_step_the_run_does_not_have_is_200_with_no_bytes(client):
    placed(client)

    resp = get_log(client, seq=7)

    assert resp.data == b""
    assert resp.headers["X-Enode-Log-Bytes"] == "0"
    assert resp.headers["X-Enode-Log-Source"] == "progress"


# ---------------------------------------------------------------- appends through the database


@pytest.mark.parametrize(
    "put",
    [
        pytest.param(lambda c: final_log(c, b"waited\n", name="step"), id="log"),
        pytest.param(lambda c: chunk(c, 0, b"waited\n", name="step"), id="progress"),
    ],
)
def test_an_append_waits_for_the_log_s_database_lock(app, client, db_url, put):
    booting(client)
    other = psycopg.connect(to_libpq_url(db_url))
    try:
        other.execute(
            "select pg_advisory_xact_lock(%s, %s)", (LOG_LOCK_CLASS, log_lock_key("r1", 1, "step"))
        )
        answers: list[Any] = []
        writer = threading.Thread(target=lambda: answers.append(put(client_of(app))), daemon=True)
        writer.start()
        time.sleep(0.5)
        assert writer.is_alive() and answers == []
        assert get_log(client, name="step").data == b""
        other.rollback()  # another host's append ends: this one goes on
        writer.join(10)
    finally:
        other.close()

    assert [a.status_code for a in answers] == [200]
    assert get_log(client, name="step").data == b"waited\n"


# ---------------------------------------------------------------- blobs


def test_an_undeclared_blob_is_stored_and_read_back_by_name(client, sql):
    booting(client)

    status = put_blob(client, "r1", 1, "build-notes.txt", b"warnings: 3\n")

    assert status == 204
    resp = client.get("/v1/runs/r1/blob/build-notes.txt")
    assert (resp.status_code, resp.data) == (200, b"warnings: 3\n")
    assert scalar(sql, "select count(*) from blobs where name = 'build-notes.txt'") == 1


def test_cannot_left_by_one_attempt_is_read_by_the_next(client, sql):
    advertise(client, "n1", cap("board"))
    steps = [
        {"id": "draft", "uses": "dut", "run": ["draft"], "out": ["patch.diff"]},
        {
            "id": "check",
            "uses": "dut",
            "run": ["check"],
            "loop": {"back_to": "draft", "max": 3, "until": {"exit_code": 0}},
        },
    ]
    submit(client, contract("r1", role("dut"), steps=steps), 201)
    assert claimed(client, "n1")["name"] == "draft"
    assert put_blob(client, "r1", 1, "_cannot", b"the header is generated\n") == 204
    done(client, "r1", 1, "n1", produced=["_cannot"])
    assert claimed(client, "n1")["name"] == "check"
    assert done(client, "r1", 2, "n1", exit_code=1).get("rolled_back") is True
    assert claimed(client, "n1")["name"] == "draft"

    resp = client.get("/v1/runs/r1/blob/_cannot")

    assert (resp.status_code, resp.data) == (200, b"the header is generated\n")


SQL_NODE_OF = "select node_id from steps where run_id = 'r1' and seq = %s"
BAD_UPLOAD_NAMES = ["a%0Ab", "tab%09here", "del%7F", "nul%00", "...", "x" * 201]


def test_a_step_may_upload_any_valid_name_but_no_control_character_or_only_dots(client, sql, ctx):
    booting(client)

    statuses = {name: put_blob(client, "r1", 1, name, b"x") for name in BAD_UPLOAD_NAMES}
    mediator_own = put_blob(client, "r1", 1, "_cannot", b"x")

    # A control character is a 400 naming the name; any other bad name names nothing: 404.
    assert (
        statuses == {name: 400 if "%" in name else 404 for name in BAD_UPLOAD_NAMES}
        and mediator_own == 204
    )
    assert [r[0] for r in sql.execute("select name from blobs")] == ["_cannot"]
    attempt = attempt_of(sql, 1)
    assert [p.name for p in (ctx.records.path("r1") / "blobs").iterdir()] == [
        f"01.{attempt}-_cannot"
    ]


def test_a_declared_name_resolves_only_among_the_steps_that_declare_it(client):
    advertise(client, "n1", cap("board"))
    steps = [
        {"id": "make", "uses": "dut", "run": ["make"], "out": ["report.json"]},
        {"id": "scan", "uses": "dut", "run": ["scan"], "out": ["scan.txt"]},
    ]
    submit(client, contract("r1", role("dut"), steps=steps), 201)
    assert claimed(client, "n1")["name"] == "make"
    assert put_blob(client, "r1", 1, "report.json", b'{"v": 1}') == 204
    done(client, "r1", 1, "n1", produced=["report.json"])
    assert claimed(client, "n1")["name"] == "scan"

    stray = put_blob(client, "r1", 2, "report.json", b'{"v": 2}')

    assert stray == 204
    assert client.get("/v1/runs/r1/blob/report.json").data == b'{"v": 1}'


def test_an_undeclared_name_resolves_among_all_blobs_newest_attempt_and_seq_first(client, sql):
    advertise(client, "n1", cap("board"))
    advertise(client, "n2", cap("board"))
    steps = [
        {"id": "prep", "uses": "dut", "run": ["prep"]},
        {
            "id": "build",
            "uses": "builder",
            "run": ["build"],
            "needs": [],
            "loop": {"back_to": "prep", "max": 3, "until": {"exit_code": 0}},
        },
    ]
    submit(client, contract("r1", role("dut"), role("builder"), steps=steps), 201)
    prep_node, build_node = (scalar(sql, SQL_NODE_OF, seq) for seq in (1, 2))
    assert claimed(client, prep_node)["name"] == "prep"
    assert claimed(client, build_node)["name"] == "build"
    # The later step stores first: the order is (attempt, seq), not the time of the upload.
    assert put_blob(client, "r1", 2, "notes.txt", b"build, first attempt") == 204
    assert put_blob(client, "r1", 1, "notes.txt", b"prep, first attempt") == 204
    first = client.get("/v1/runs/r1/blob/notes.txt").data
    before = attempt_of(sql, 1)
    done(client, "r1", 1, prep_node)
    assert done(client, "r1", 2, build_node, exit_code=1).get("rolled_back") is True
    assert attempt_of(sql, 1) == before + 1
    assert claimed(client, prep_node)["name"] == "prep"
    assert put_blob(client, "r1", 1, "notes.txt", b"prep, second attempt") == 204

    again = client.get("/v1/runs/r1/blob/notes.txt").data

    assert (first, again) == (b"build, first attempt", b"prep, second attempt")


def test_an_undeclared_upload_is_not_listed_as_produced(client, sql):
    placed(client)
    assert claimed(client, "n1")["name"] == "boot"
    assert put_blob(client, "r1", 1, "result.json", b"{}") == 204
    assert put_blob(client, "r1", 1, "notes.txt", b"not an output") == 204

    done(client, "r1", 1, "n1", produced=["result.json", "notes.txt"])

    assert scalar(sql, "select produced from steps where run_id = 'r1'") == ["result.json"]
    ledger = client.get("/v1/runs/r1/ledger").get_json()["entries"]
    assert sorted(e["name"] for e in ledger) == ["notes.txt", "result.json"]
