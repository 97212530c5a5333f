"""The ``mediator`` client commands against a real gunicorn
(docs/client.md#following-a-run-answering-listing): each command run as a process of its own
(``python -m app.commands``) over real HTTP, its output for people and with ``--json``, and its exit
codes: 0 done or SUCCEEDED, 1 FAILED, 2 a usage error, 3 unreachable, 5 credentials refused (401,
403), 6 any other refusal (a 4xx, with the server's reason, or input the client refuses itself).
Node agents are played by the test over HTTP."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.client.cli import (
    TIMEOUT,
    CountingProxy,
    Running,
    client_env,
    complete,
    mediator,
    write,
)
from tests.support.actors import Node, Submitter, cap, expect
from tests.support.apps import ROOT
from tests.support.contracts import contract, role
from tests.support.submitter import run_view

# One gunicorn for the module, its tables emptied before each test (tests/conftest.py).
one_server_per_module = True

pytestmark = pytest.mark.slow  # processes of the client


# ------------------------------------------------------------------------------ the fleet


def board(server: Any, node: str) -> Node:
    """The node agent ``node`` (its instance ``<node>-1``) of the live server."""
    return Node(server, node, f"{node}-1")


def advertise(server: Any, node: str, *caps: dict[str, Any]) -> None:
    board(server, node).advertise(*caps)


def claim(server: Any, node: str) -> dict[str, Any]:
    return board(server, node).claimed(wait=5)


def report(server: Any, run_id: str, seq: int, node: str, exit_code: int = 0) -> None:
    board(server, node).done(run_id, seq, exit_code=exit_code)


def put_log(server: Any, run_id: str, seq: int, data: bytes) -> None:
    expect(board(server, "").put_log(run_id, seq, data), 200)


def submit_api(server: Any, doc: dict[str, Any], status: int) -> dict[str, Any]:
    return Submitter(server, "other@lab.test").submitted(doc, status)


def sign_off(run_id: str) -> dict[str, Any]:
    """One board step, then an ask of qa@lab.test whose answer is ``{verdict, ok}``."""
    return contract(
        run_id,
        role("dut"),
        steps=[
            {"id": "boot", "uses": "dut", "run": ["boot-test"]},
            {
                "id": "sign-off",
                "ask": {"prompt": "Boot log looks right?", "answerers": ["qa@lab.test"]},
                "out": ["decision"],
                "schema": {
                    "decision": {
                        "type": "object",
                        "required": ["verdict", "ok"],
                        "properties": {
                            "verdict": {"enum": ["approve", "reject"]},
                            "ok": {"type": "boolean"},
                        },
                        "additionalProperties": False,
                    }
                },
            },
        ],
        success_when=[{"step": "sign-off", "produced": ["decision"]}],
    )


def asked(server: Any, run_id: str) -> None:
    """Run the board step of a :func:`sign_off` run, so its ask is raised."""
    step = claim(server, "board-1")
    assert (step["run_id"], step["seq"]) == (run_id, 1)
    report(server, run_id, 1, "board-1")


# ------------------------------------------------------------------------- validate, offline


def test_validate_checks_a_contract_offline_and_takes_the_servers_reason(tmp_path, live_server):
    good = write(tmp_path, contract("ok-1"), "good.json")
    bad_doc = contract("bad-1", steps=[{"id": "boot", "uses": "dutt", "run": ["x"]}])
    bad = write(tmp_path, bad_doc, "bad.json")

    valid = mediator(None, "validate", good)
    invalid = mediator(None, "validate", bad)

    assert (valid.returncode, valid.stdout) == (0, f"{good}: valid, run ok-1, 1 roles, 1 steps\n")
    server_reason = live_server.post("/v1/runs", json=bad_doc).json()["error"]["reason"]
    assert server_reason == 'step "boot" uses undeclared role "dutt"'
    assert invalid.returncode == 6
    assert invalid.stderr == f"mediator: {bad}: {server_reason}\n"


def test_validate_reads_yaml_and_says_where_a_json_file_is_broken(tmp_path):
    (tmp_path / "run.yaml").write_text(
        "run_id: y-1\nrequires: [{as: dut, capability: board}]\n"
        "steps: [{id: boot, uses: dut, run: [boot-test]}]\n"
    )
    (tmp_path / "broken.json").write_text('{"run_id": "x",\n  "requires": [}\n')

    yaml_ok = mediator(None, "validate", str(tmp_path / "run.yaml"), "--json")
    broken = mediator(None, "validate", str(tmp_path / "broken.json"))

    assert yaml_ok.returncode == 0
    assert json.loads(yaml_ok.stdout) == {"valid": True, "run_id": "y-1", "warnings": []}
    assert broken.returncode == 6
    assert broken.stderr.startswith(f"mediator: {tmp_path / 'broken.json'} is not valid JSON: ")
    assert "line 2" in broken.stderr


def test_validate_names_a_capability_the_configuration_does_not_list(tmp_path):
    path = write(tmp_path, contract("cap-1", role("dut", "bord")))

    result = mediator(None, "validate", path, MEDIATOR_CONTRACT_CAPABILITIES="board,host")

    assert result.returncode == 6
    assert result.stderr == f'mediator: {path}: unknown capability: "bord"\n'


def test_validate_reads_none_of_the_servers_configuration_but_what_it_checks_by(tmp_path):
    """A shell of the server's host has its secrets set: validate, an offline command, reads only
    max_body_bytes and contract.capabilities, and is not refused for a server setting it never
    uses (it was: ``invalid configuration: token: shorter than 32 characters``)."""
    path = write(tmp_path, contract("off-1"))
    server_env = {
        "MEDIATOR_TOKEN": "short",
        "MEDIATOR_TOKENS": "not json",
        "MEDIATOR_RECORDS_BACKEND": "s3",
        "MEDIATOR_NOT_A_KEY": "x",
    }

    result = mediator(None, "validate", path, **server_env)
    capped = mediator(None, "validate", path, MEDIATOR_MAX_BODY_BYTES="10", **server_env)
    bad_cap = mediator(None, "validate", path, MEDIATOR_MAX_BODY_BYTES="many")

    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"{path}: valid, run off-1, 1 roles, 1 steps\n"
    assert capped.returncode == 6 and "over max_body_bytes (10)" in capped.stderr
    # A configuration that cannot be used is the usage's code, as for the server's commands.
    assert bad_cap.returncode == 2 and "max_body_bytes" in bad_cap.stderr


# ------------------------------------------------------------------------------- submitting


def test_submit_places_a_run_and_prints_where(tmp_path, live_server):
    advertise(live_server, "board-1", cap("board", soc="imx8mp"))
    path = write(tmp_path, contract("place-1", role("dut", soc="imx8mp")))

    result = mediator(live_server, "submit", path)

    assert (result.returncode, result.stdout) == (0, "place-1: RUNNING on dut=board-1\n")
    placed = run_view(live_server, "place-1")
    assert placed["state"] == "RUNNING" and placed["principal"] == "me@lab.test"


def test_submit_twice_says_the_run_is_already_known(tmp_path, live_server):
    advertise(live_server, "board-1")
    path = write(tmp_path, contract("again-1"))
    assert mediator(live_server, "submit", path).returncode == 0

    again = mediator(live_server, "submit", path)

    assert (again.returncode, again.stdout) == (0, "again-1: already known, RUNNING\n")


def test_submit_dry_run_shows_the_assignment_and_stores_nothing(tmp_path, live_server):
    advertise(live_server, "board-1")
    path = write(tmp_path, contract("dry-1"))

    result = mediator(live_server, "submit", path, "--dry-run")
    as_json = mediator(live_server, "--json", "submit", "--dry-run", path)

    assert (result.returncode, result.stdout) == (0, "dry-1: would be placed on dut=board-1\n")
    assert json.loads(as_json.stdout) == {
        "run_id": "dry-1",
        "state": "DRY_RUN",
        "team": "default",
        "assigned": [{"as": "dut", "nodes": [{"node": "board-1", "label": None}]}],
        "warnings": [],
    }
    assert live_server.get("/v1/runs/dry-1").status_code == 404


def test_a_run_no_node_can_take_is_refused_with_the_matchers_reason(tmp_path, live_server):
    advertise(live_server, "board-1", cap("board", soc="imx8mp"))
    path = write(tmp_path, contract("none-1", role("dut", soc="am62")))

    result = mediator(live_server, "submit", path)

    assert result.returncode == 6
    assert result.stderr == "mediator: need 1, fleet has 0 - board soc=am62\n"
    assert result.stdout == ""


def test_an_invalid_contract_is_refused_with_the_servers_reason(tmp_path, live_server):
    path = write(tmp_path, {"run_id": "bad id", "requires": [], "steps": []})

    result = mediator(live_server, "submit", path)
    as_json = mediator(live_server, "submit", path, "--json")

    reason = live_server.post("/v1/runs", json=json.loads(Path(path).read_text())).json()
    assert result.returncode == 6
    assert result.stderr == f"mediator: {reason['error']['reason']}\n"
    assert as_json.returncode == 6 and json.loads(as_json.stdout) == reason


def test_a_wrong_token_is_refused_and_says_which_option_sets_it(tmp_path, live_server):
    result = mediator(live_server, "--token", "not-the-token", "runs")

    assert result.returncode == 5
    assert result.stderr == (
        "mediator: missing or invalid token (set --token, MEDIATOR_CLIENT_TOKEN or a profile's "
        "token)\n"
    )


def test_a_mediator_that_does_not_answer_is_exit_3(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, never listening
        result = mediator(None, "--url", closed, "runs")

    assert result.returncode == 3
    assert result.stderr == (
        f"mediator: cannot reach the Mediator at {closed} (connection refused): start it, "
        "or set --url, MEDIATOR_CLIENT_URL or a profile's url\n"
    )


def test_a_mediator_that_fails_with_a_5xx_is_exit_3_with_its_reason():
    class Failing(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"error": {"code": 503, "reason": "database unavailable"}}'
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Failing) as failing:
        threading.Thread(target=failing.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{failing.server_address[1]}"
        result = mediator(None, "--url", url, "nodes")
        failing.shutdown()

    assert result.returncode == 3
    assert result.stderr == f"mediator: the Mediator at {url} failed (503): database unavailable\n"


def test_the_principal_is_git_config_user_email_when_none_is_given(tmp_path, live_server):
    advertise(live_server, "board-1")
    gitconfig = tmp_path / "gitconfig"
    gitconfig.write_text("[user]\n\temail = git-user@lab.test\n")
    path = write(tmp_path, contract("git-1"))

    result = mediator(
        live_server, "submit", path, MEDIATOR_CLIENT_PRINCIPAL="", GIT_CONFIG_GLOBAL=str(gitconfig)
    )

    assert result.returncode == 0, result.stderr
    assert run_view(live_server, "git-1")["principal"] == "git-user@lab.test"


# ---------------------------------------------------------------------------------- --wait


def test_submit_wait_shows_the_wait_then_the_promotion_the_steps_and_the_verdict(
    tmp_path, live_server
):
    advertise(live_server, "board-1", cap("board", soc="imx8mp"))
    submit_api(live_server, contract("holder-1", role("dut", soc="imx8mp")), 201)
    doc = contract(
        "waiter-1",
        role("dut", soc="imx8mp"),
        steps=[{"id": "boot", "uses": "dut", "run": ["boot-test"]}],
        success_when=[{"step": "boot", "exit_code": 0}],
    )
    waiting = Running(live_server, "submit", write(tmp_path, doc), "--wait", "--interval", "0.1")

    assert waiting.line_with("waiter-1 QUEUED").endswith("  waiter-1 QUEUED")
    line = waiting.line_with("waiting:")
    assert line.endswith(
        "  waiting: position 1 (0 ahead), expected start unknown (no_history); dut [board soc=imx8mp]:"
        " 1 of 1 busy, held by holder-1"
    )
    cancelled = live_server.post("/v1/runs/holder-1/cancel")
    assert cancelled.json() == {"run_id": "holder-1", "state": "FAILED"}
    assert waiting.line_with("waiter-1 RUNNING").endswith("  waiter-1 RUNNING on dut=board-1")
    step = claim(live_server, "board-1")
    assert (step["run_id"], step["seq"]) == ("waiter-1", 1)
    assert waiting.line_with("step 1 boot: running").endswith("  step 1 boot: running on board-1")
    report(live_server, "waiter-1", 1, "board-1", exit_code=0)
    code, lines, err = waiting.finish()

    assert code == 0, err
    # After "HH:MM:SS  " or the indent; VERIFYING shows when a look falls between the last
    # result and the verdict.
    shown = [line[10:] for line in lines if "VERIFYING" not in line]
    assert shown[-3:] == [
        "step 1 boot: DONE (exit 0)",
        "waiter-1 SUCCEEDED",
        "ok    boot: exit_code want 0, got 0",
    ]
    assert [s for s in shown if s.startswith("waiter-1 ")] == [
        "waiter-1 QUEUED",
        "waiter-1 RUNNING on dut=board-1",
        "waiter-1 SUCCEEDED",
    ]


def test_submit_wait_of_a_run_that_fails_ends_with_its_verdict_and_exit_1(tmp_path, live_server):
    advertise(live_server, "board-1")
    doc = contract(
        "fails-1",
        role("dut"),
        steps=[{"id": "boot", "uses": "dut", "run": ["boot-test"]}],
        success_when=[{"step": "boot", "exit_code": 0}],
    )
    waiting = Running(live_server, "submit", write(tmp_path, doc), "--wait", "--interval", "0.1")
    waiting.line_with("fails-1 RUNNING on dut=board-1")
    claim(live_server, "board-1")
    report(live_server, "fails-1", 1, "board-1", exit_code=3)
    code, lines, err = waiting.finish()

    assert code == 1, err
    shown = [line[10:] for line in lines if "VERIFYING" not in line]
    assert shown[-3:] == [
        "step 1 boot: DONE (exit 3)",
        "fails-1 FAILED",
        "FAIL  boot: exit_code want 0, got 3",
    ]


def test_submit_wait_json_prints_the_last_view_and_the_progress_on_stderr(tmp_path, live_server):
    advertise(live_server, "board-1")
    submitted = Running(
        live_server, "--json", "submit", write(tmp_path, contract("js-1")), "--wait"
    )
    deadline = time.monotonic() + 30
    while live_server.get("/v1/runs/js-1").status_code == 404:
        assert time.monotonic() < deadline, "the run was never submitted"
        time.sleep(0.05)  # the process submits on its own: nothing to await but its run
    claim(live_server, "board-1")
    report(live_server, "js-1", 1, "board-1")
    code, lines, err = submitted.finish()

    assert code == 0, err
    last = json.loads("\n".join(lines))
    assert last == run_view(live_server, "js-1") and last["state"] == "SUCCEEDED"
    assert "js-1 SUCCEEDED" in err


# ------------------------------------------------------------------------ reading the state


def test_status_of_a_queued_run_says_what_it_waits_for(tmp_path, live_server):
    advertise(live_server, "board-1")
    submit_api(live_server, contract("busy-1"), 201)
    submit_api(live_server, contract("queued-1"), 202)

    result = mediator(live_server, "status", "queued-1")
    as_json = mediator(live_server, "status", "queued-1", "--json")

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "run        queued-1"
    assert lines[1] == "state      QUEUED"
    assert (
        "waiting    position 1 (0 ahead), expected start unknown (no_history); dut [board]:"
        " 1 of 1 busy, held by busy-1"
    ) in lines
    assert lines[-2].split() == ["SEQ", "STEP", "KIND", "STATE", "USES", "NODE", "ATTEMPT"] + [
        "EXIT",
        "STARTED",
        "ENDED",
        "ERROR",
    ]
    assert lines[-1].split() == ["1", "use-dut", "run", "PENDING", "dut"] + ["-"] * 6
    shown = json.loads(as_json.stdout)
    assert shown["queue"] == {"position": 1, "ahead": 0}
    assert shown["requires"][0]["held_by"] == ["busy-1"]


def test_status_of_an_unknown_run_is_refused(live_server):
    result = mediator(live_server, "status", "nope-1")

    assert (result.returncode, result.stderr) == (6, "mediator: no such run: nope-1\n")


def test_runs_lists_runs_newest_first_and_filters_them(live_server):
    advertise(live_server, "board-1")
    submit_api(live_server, contract("first-1", work={"system": "gerrit", "change_id": "7"}), 201)
    submit_api(live_server, contract("second-1"), 202)

    every = mediator(live_server, "runs")
    queued = mediator(live_server, "runs", "--state", "QUEUED")
    of_work = mediator(live_server, "runs", "--work", "gerrit:7", "--json")
    empty = mediator(live_server, "runs", "--state", "SUCCEEDED")

    lines = every.stdout.splitlines()
    assert lines[0].split() == ["RUN", "STATE", "WORK", "PRINCIPAL", "CREATED", "ENDED"]
    assert [line.split()[:4] for line in lines[1:]] == [
        ["second-1", "QUEUED", "-", "other@lab.test"],
        ["first-1", "RUNNING", "gerrit:7", "other@lab.test"],
    ]
    assert [line.split()[0] for line in queued.stdout.splitlines()[1:]] == ["second-1"]
    assert [r["run_id"] for r in json.loads(of_work.stdout)["runs"]] == ["first-1"]
    assert (empty.returncode, empty.stdout) == (0, "no runs\n")


def test_runs_with_a_bad_filter_is_refused_with_the_servers_reason(live_server):
    result = mediator(live_server, "runs", "--since", "yesterday")

    reason = live_server.get("/v1/runs?since=yesterday").json()["error"]["reason"]
    assert (result.returncode, result.stderr) == (6, f"mediator: {reason}\n")


def test_nodes_shows_the_fleet_with_leases(live_server):
    advertise(live_server, "board-1", cap("board", soc="imx8mp"))
    advertise(live_server, "host-1", cap("agent.reason"))
    submit_api(live_server, contract("lease-1", role("dut", soc="imx8mp")), 201)

    result = mediator(live_server, "nodes")
    as_json = mediator(live_server, "nodes", "--json")

    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NODE", "LABEL", "LIVE", "LEASED", "TO", "DRAIN"] + [
        "CAPABILITIES",
        "SEEN",
    ]
    assert lines[1].split()[:7] == ["board-1", "-", "yes", "lease-1", "-", "board", "soc=imx8mp"]
    assert lines[2].split()[:6] == ["host-1", "-", "yes", "-", "-", "agent.reason"]
    assert [n["node_id"] for n in json.loads(as_json.stdout)["nodes"]] == ["board-1", "host-1"]


# ----------------------------------------------------------------------------------- acting


def test_cancel_cancels_a_run_and_leaves_a_finished_one_as_it_is(tmp_path, live_server):
    advertise(live_server, "board-1")
    submit_api(live_server, contract("cancel-1"), 201)
    submit_api(live_server, contract("done-1"), 202)

    cancelled = mediator(live_server, "cancel", "cancel-1")
    assert (cancelled.returncode, cancelled.stdout) == (0, "cancel-1: cancelled, FAILED\n")
    assert run_view(live_server, "done-1")["state"] == "RUNNING"  # promoted by the cancel
    claim(live_server, "board-1")
    report(live_server, "done-1", 1, "board-1")
    finished = mediator(live_server, "cancel", "done-1")
    unknown = mediator(live_server, "cancel", "nope-1", "--json")

    assert (finished.returncode, finished.stdout) == (
        0,
        "done-1: had already finished, SUCCEEDED\n",
    )
    assert unknown.returncode == 6
    assert json.loads(unknown.stdout) == {"error": {"code": 404, "reason": "no such run: nope-1"}}
    assert unknown.stderr == "mediator: no such run: nope-1\n"


def test_asks_lists_open_asks_and_answer_set_types_the_fields_by_the_schema(live_server):
    advertise(live_server, "board-1")
    submit_api(live_server, sign_off("ask-1"), 201)
    asked(live_server, "ask-1")

    listed = mediator(live_server, "asks", MEDIATOR_CLIENT_PRINCIPAL="qa@lab.test")
    answered = mediator(
        live_server,
        "answer",
        "ask-1",
        "2",
        "--set",
        "verdict=approve",
        "--set",
        "ok=yes",
        MEDIATOR_CLIENT_PRINCIPAL="qa@lab.test",
    )

    lines = listed.stdout.splitlines()
    assert lines[0].split()[:4] == ["RUN", "SEQ", "STEP", "PROMPT"]
    assert "ask-1  2    sign-off  Boot log looks right?" in lines[1]
    assert "ok=boolean, verdict=approve|reject" in lines[1] or (
        "verdict=approve|reject, ok=boolean" in lines[1]
    )
    assert "  yes  " in lines[1] and "qa@lab.test" in lines[1]
    assert (answered.returncode, answered.stdout) == (0, "ask-1: step 2 answered, run SUCCEEDED\n")
    blob = live_server.get("/v1/runs/ask-1/blob/decision")
    assert blob.json() == {"verdict": "approve", "ok": True}


def test_answer_with_a_json_document_and_the_refusals_of_answer(tmp_path, live_server):
    advertise(live_server, "board-1")
    submit_api(live_server, sign_off("ask-2"), 201)
    asked(live_server, "ask-2")

    not_allowed = mediator(live_server, "answer", "ask-2", "2", "--set", "verdict=approve")
    bad_enum = mediator(
        live_server, "answer", "ask-2", "2", "--set", "verdict=maybe", "--set", "ok=true"
    )
    schema = mediator(
        live_server,
        "answer",
        "ask-2",
        "2",
        "--input",
        '{"verdict": "reject"}',
        MEDIATOR_CLIENT_PRINCIPAL="qa@lab.test",
    )
    neither = mediator(live_server, "answer", "ask-2", "2")
    (tmp_path / "answer.json").write_text('{"verdict": "reject", "ok": false}')
    answered = mediator(
        live_server,
        "--json",
        "answer",
        "ask-2",
        "2",
        "--input",
        f"@{tmp_path / 'answer.json'}",
        MEDIATOR_CLIENT_PRINCIPAL="qa@lab.test",
    )
    again = mediator(
        live_server,
        "answer",
        "ask-2",
        "2",
        "--set",
        "ok=no",
        MEDIATOR_CLIENT_PRINCIPAL="qa@lab.test",
    )

    assert not_allowed.returncode == 5  # a 403: this principal may not answer it
    assert not_allowed.stderr.startswith("mediator: principal is not an allowed answerer")
    assert (bad_enum.returncode, bad_enum.stderr) == (
        6,
        'mediator: verdict must be one of "approve", "reject", got \'maybe\'\n',
    )
    assert schema.returncode == 6
    assert schema.stderr.startswith("mediator: schema violation: $: 'ok' is a required property")
    assert neither.returncode == 2 and "give the answer with --set" in neither.stderr
    assert answered.returncode == 0, answered.stderr
    assert json.loads(answered.stdout)["run_id"] == "ask-2"
    assert (again.returncode, again.stderr) == (6, "mediator: step is not awaiting an answer\n")


def test_record_writes_the_sealed_record_and_refuses_before_the_seal(tmp_path, live_server):
    advertise(live_server, "board-1")
    submit_api(live_server, contract("rec-1"), 201)
    target = tmp_path / "rec-1.tar"

    early = mediator(live_server, "record", "rec-1", "-o", str(target))
    claim(live_server, "board-1")
    put_log(live_server, "rec-1", 1, b"booted\n")
    report(live_server, "rec-1", 1, "board-1")
    written = mediator(live_server, "record", "rec-1", "-o", str(target))

    assert (early.returncode, early.stderr) == (6, "mediator: run is not sealed yet\n")
    assert written.returncode == 0, written.stderr
    size = target.stat().st_size
    assert written.stdout == f"rec-1: Record written to {target} ({size} bytes)\n"
    with tarfile.open(target) as tar:
        names = tar.getnames()
        log = tar.extractfile("run-rec-1/logs/01-step.log")
        assert log is not None and log.read() == b"booted\n"
    assert "run-rec-1/verdict.json" in names
    assert list(tmp_path.glob(".*.part")) == []


def test_record_to_stdout_is_the_tar_itself(live_server):
    advertise(live_server, "board-1")
    submit_api(live_server, contract("rec-2"), 201)
    claim(live_server, "board-1")
    report(live_server, "rec-2", 1, "board-1")

    result = subprocess.run(
        [sys.executable, "-m", "app.commands.main", "record", "rec-2", "-o", "-"],
        cwd=ROOT,
        env=client_env(live_server),
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    with tarfile.open(fileobj=io.BytesIO(result.stdout)) as tar:
        assert "run-rec-2/verdict.json" in tar.getnames()


def test_logs_prints_a_steps_log_and_follow_goes_on_until_the_step_ends(live_server):
    advertise(live_server, "board-1")
    submit_api(live_server, contract("log-1"), 201)
    claim(live_server, "board-1")
    put_log(live_server, "log-1", 1, b"line one\n")

    printed = mediator(live_server, "logs", "log-1", "1")
    following = Running(live_server, "logs", "log-1", "1", "--follow", "--interval", "0.1")
    following.line_with("line one")
    put_log(live_server, "log-1", 1, b"line two\n")
    following.line_with("line two")
    put_log(live_server, "log-1", 1, b"line three\n")
    report(live_server, "log-1", 1, "board-1")
    code, lines, err = following.finish()
    no_step = mediator(live_server, "logs", "log-1", "7")

    assert (printed.returncode, printed.stdout) == (0, "line one\n")
    assert code == 0, err
    assert lines == ["line one", "line two", "line three"]
    assert (no_step.returncode, no_step.stderr) == (
        6,
        "mediator: run log-1 has no step 7 (its steps are 1 to 1)\n",
    )


# ---------------------------------------------------------------- the server's own commands


def test_the_client_options_leave_the_server_commands_as_they_are(live_server):
    result = mediator(
        live_server,
        "--url",
        "http://127.0.0.1:9",
        "--principal",
        "me@lab.test",
        "server",
        "db",
        "check",
        MEDIATOR_DATABASE_URL=live_server.env["MEDIATOR_DATABASE_URL"],
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("database is at ")
    # The client's variables (MEDIATOR_CLIENT_*) are not unknown variables to the server's commands.
    assert result.stderr == ""


# ------------------------------------------------------------------------ answers from a file


def test_answer_input_reads_stdin_and_the_old_json_spelling_still_works_with_a_warning(
    live_server,
):
    advertise(live_server, "board-1")
    submit_api(live_server, sign_off("ask-3"), 201)
    asked(live_server, "ask-3")

    broken = subprocess.run(
        [sys.executable, "-m", "app.commands.main", "answer", "ask-3", "2", "--input", "-"],
        cwd=ROOT,
        env=client_env(live_server, MEDIATOR_CLIENT_PRINCIPAL="qa@lab.test"),
        input='{"verdict": ',
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    from_stdin = subprocess.run(
        [sys.executable, "-m", "app.commands.main", "answer", "ask-3", "2", "--input", "-"],
        cwd=ROOT,
        env=client_env(live_server, MEDIATOR_CLIENT_PRINCIPAL="qa@lab.test"),
        input='{"verdict": "approve", "ok": true}',
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    submit_api(live_server, sign_off("ask-4"), 201)  # the board is free again
    asked(live_server, "ask-4")
    old = mediator(
        live_server,
        "answer",
        "ask-4",
        "2",
        "--json",
        '{"verdict": "reject", "ok": false}',
        MEDIATOR_CLIENT_PRINCIPAL="qa@lab.test",
    )
    as_json = mediator(
        live_server,
        "answer",
        "ask-4",
        "2",
        "--input",
        '{"verdict": "reject", "ok": false}',
        "--json",
        MEDIATOR_CLIENT_PRINCIPAL="qa@lab.test",
    )

    assert broken.returncode == 6
    assert broken.stderr.startswith("mediator: stdin is not valid JSON: ")
    assert (from_stdin.returncode, from_stdin.stdout) == (
        0,
        "ask-3: step 2 answered, run SUCCEEDED\n",
    )
    assert live_server.get("/v1/runs/ask-3/blob/decision").json() == {
        "verdict": "approve",
        "ok": True,
    }
    # --json means output everywhere: the earlier `answer --json DOC` is refused, not read as input.
    assert old.returncode == 2
    assert "unexpected extra argument" in old.stderr.lower()
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["run_state"] == "SUCCEEDED"


# --------------------------------------------------------------- the end of a watch, paging


def test_ctrl_c_during_wait_says_the_run_goes_on_and_exits_130(live_server):
    advertise(live_server, "board-1")
    submit_api(live_server, contract("watched-1"), 201)
    watching = Running(live_server, "status", "watched-1", "--wait", "--interval", "0.1")
    watching.line_with("watched-1 RUNNING")

    watching.interrupt()
    code, _, err = watching.finish()

    assert code == 130
    assert err == (
        "mediator: stopped watching; run watched-1 goes on: follow it with "
        "`mediator status watched-1 --wait`, stop it with `mediator cancel watched-1`\n"
    )
    assert run_view(live_server, "watched-1")["state"] == "RUNNING"


def test_wait_timeout_ends_the_watch_with_exit_4_and_the_run_goes_on(tmp_path, live_server):
    advertise(live_server, "board-1")
    path = write(tmp_path, contract("slow-1"))

    result = mediator(live_server, "submit", path, "--wait", "--timeout", "1", "--interval", "0.2")
    as_json = mediator(live_server, "--json", "status", "slow-1", "--wait", "--timeout", "0.5")
    without_wait = mediator(live_server, "status", "slow-1", "--timeout", "5")

    assert result.returncode == 4, result.stderr
    assert result.stdout.splitlines()[-1].endswith("  slow-1 RUNNING on dut=board-1")
    assert result.stderr == (
        "mediator: not finished within 1 s (RUNNING); run slow-1 goes on: follow it with "
        "`mediator status slow-1 --wait`, stop it with `mediator cancel slow-1`\n"
    )
    assert as_json.returncode == 4
    assert json.loads(as_json.stdout)["state"] == "RUNNING"
    assert without_wait.returncode == 2 and "--timeout goes with --wait" in without_wait.stderr
    assert run_view(live_server, "slow-1")["state"] == "RUNNING"


@pytest.mark.parametrize("interval", ["0", "0.01", "3600", "-1"])
def test_an_absurd_interval_is_refused_before_anything_is_sent(interval):
    result = mediator(None, "status", "any-1", "--wait", "--interval", interval)
    logs = mediator(None, "logs", "any-1", "1", "--follow", "--interval", interval)

    for refused in (result, logs):
        assert refused.returncode == 2
        assert "Invalid value for '--interval'" in refused.stderr
        assert "0.1<=x<=60.0" in refused.stderr


def test_runs_follows_the_servers_pages_to_the_limit_or_to_the_end(live_server):
    advertise(live_server, "board-1")
    submit_api(live_server, contract("page-1"), 201)
    for n in range(2, 6):
        submit_api(live_server, contract(f"page-{n}"), 202)
    newest_first = [f"page-{n}" for n in range(5, 0, -1)]

    every = mediator(live_server, "runs", "--all", "--page-size", "2")
    three = mediator(live_server, "runs", "--limit", "3", "--page-size", "2", "--json")
    zero = mediator(live_server, "runs", "--limit", "0")

    assert every.returncode == 0, every.stderr
    assert [line.split()[0] for line in every.stdout.splitlines()[1:]] == newest_first
    doc = json.loads(three.stdout)
    assert [r["run_id"] for r in doc["runs"]] == newest_first[:3]
    rest = live_server.get(f"/v1/runs?before={quote(doc['next'])}").json()
    assert [r["run_id"] for r in rest["runs"]] == newest_first[3:]
    assert zero.returncode == 2 and "Invalid value for '--limit'" in zero.stderr


# ------------------------------------------------------------------------- shell completion


def test_run_ids_complete_from_the_server_and_nothing_when_it_is_not_there(live_server):
    advertise(live_server, "board-1")
    submit_api(live_server, contract("kernel-1"), 201)
    submit_api(live_server, contract("kernel-2"), 202)
    submit_api(live_server, contract("uboot-1"), 202)

    status = complete(live_server, "mediator status kern")
    logs = complete(live_server, "mediator --json logs ")
    nowhere = complete(None, "mediator status kern")

    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines() == ["plain,kernel-2", "plain,kernel-1"]
    assert logs.stdout.splitlines() == ["plain,uboot-1", "plain,kernel-2", "plain,kernel-1"]
    assert (nowhere.returncode, nowhere.stdout.strip(), nowhere.stderr) == (0, "", "")


# ----------------------------------------------------------------- one connection a command


def test_wait_and_logs_follow_poll_over_one_connection(tmp_path, live_server):
    advertise(live_server, "board-1")
    submit_api(live_server, contract("kept-1"), 201)
    proxy = CountingProxy(live_server.url)
    try:
        waiting = Running(
            None, "status", "kept-1", "--wait", "--interval", "0.1", MEDIATOR_CLIENT_URL=proxy.url
        )
        waiting.line_with("kept-1 RUNNING")
        proxy.wait_for_requests(b"GET /v1/runs/kept-1 ", 5)  # the first look and four polls
        claim(live_server, "board-1")
        put_log(live_server, "kept-1", 1, b"one\n")
        following = Running(
            None,
            "logs",
            "kept-1",
            "1",
            "--follow",
            "--interval",
            "0.1",
            MEDIATOR_CLIENT_URL=proxy.url,
        )
        following.line_with("one")
        proxy.wait_for_requests(b"GET /v1/runs/kept-1/steps/1/log?", 4)
        report(live_server, "kept-1", 1, "board-1")
        waited, _, wait_err = waiting.finish()
        followed, lines, follow_err = following.finish()
    finally:
        proxy.close()

    assert (waited, followed) == (0, 0), (wait_err, follow_err)
    assert lines == ["one"]
    assert proxy.requests(b"GET /v1/runs/kept-1 ") >= 5
    assert proxy.connections == 2  # one for the watch, one for the log
