"""Every request the original submitter CLI (internal/runctl, cmd/runctl) sends, against a real
Mediator (docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl): submit and
dry-run of the contracts its examples ship, status, the run list, cancel, capabilities, the asks
inbox, answers and the Record download, each answer decoded as the Go types decode it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.compat.clients import EnodeClient, RunctlClient
from tests.compat.gowire import ASKS, CAPABILITIES, FAIL, RUN, RUNS, VERDICT, decode, decode_value
from tests.compat.mediator import SUBMITTER, Mediator
from tests.compat.scenario import (
    LABEL,
    NODE,
    claimed,
    command_result,
    contract_file,
    node_up,
    one_step,
    record_files,
    reported,
    submitted,
    view,
)
from tests.support.apps import TOKEN

DECISION = {
    "type": "object",
    "required": ["verdict"],
    "properties": {"verdict": {"enum": ["approve", "reject"]}},
}

EXAMPLE_AGENT = b"""{
  "run_id": "example-agent",
  "work": {
    "id": { "system": "manual", "change_id": "example-agent" },
    "system": "manual"
  },
  "requires": [
    { "as": "brain", "capability": "agent.reason", "harness": "claude" }
  ],
  "steps": [
    {
      "id": "summarize",
      "uses": "brain",
      "agent": { "max_turns": 5, "ask": "never" },
      "in": { "prompt": "Write a one-line summary of this workspace into $OUT/summary.json as {\\"summary\\": \\"...\\"}." },
      "out": ["summary.json"],
      "schema": {
        "summary.json": {
          "type": "object",
          "required": ["summary"],
          "properties": { "summary": { "type": "string" } }
        }
      }
    }
  ],
  "success_when": [
    { "step": "summarize", "produced": ["summary.json"] }
  ]
}
"""

EXAMPLE_MULTI = b"""{
  "run_id": "example-multi",
  "work": {
    "id": { "system": "manual", "change_id": "example-multi" },
    "system": "manual"
  },
  "requires": [
    { "as": "worker", "capability": "agent.reason" }
  ],
  "steps": [
    {
      "id": "make",
      "uses": "worker",
      "run": ["sh", "-c", "printf 'one\\\\ntwo\\\\n' > $OUT/lines.txt"],
      "out": ["lines.txt"]
    },
    {
      "id": "count",
      "uses": "worker",
      "needs": ["make"],
      "in": { "from": ["lines.txt"] },
      "run": ["sh", "-c", "wc -l < $IN/lines.txt > $OUT/count.txt"],
      "out": ["count.txt"]
    }
  ],
  "success_when": [
    { "step": "make", "exit_code": 0, "produced": ["lines.txt"] },
    { "step": "count", "exit_code": 0, "produced": ["count.txt"] }
  ]
}
"""


def sign_off(run_id: str = "boot-1", shown: str = "report.json") -> dict[str, Any]:
    """A build step that produces ``shown``, then an ask that shows it to the submitter."""
    return {
        "run_id": run_id,
        "requires": [{"as": "worker", "capability": "agent.reason"}],
        "steps": [
            {"id": "build", "uses": "worker", "run": ["make"], "out": [shown]},
            {
                "id": "sign-off",
                "ask": {
                    "prompt": "Boot log looks right?",
                    "answerers": [SUBMITTER],
                    "timeout": {"after": "4h", "then": "fail"},
                    "show": [shown],
                },
                "out": ["decision"],
                "schema": {"decision": DECISION},
            },
        ],
    }


def asked(enode: EnodeClient, runctl: RunctlClient, shown: str, data: bytes) -> None:
    """Run the build step of :func:`sign_off` with ``data`` as its artifact; the ask is then
    open."""
    node_up(enode)
    submitted(runctl, sign_off(shown=shown))
    _, step = claimed(enode)
    assert enode.put_blob("boot-1", 1, shown, data).status_code // 100 == 2
    reported(enode, step, command_result(shown))


def the_fail(resp: Any) -> dict[str, Any]:
    """internal/runctl/client.go (Client.do): a non-2xx becomes Fail{Code, Reason} from the
    error body."""
    return decode(FAIL, resp.content)["error"]


# ------------------------------------------------------------------------ submit, dry-run


def test_submit_of_example_command_is_201_and_decodes_as_a_run(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/runctl/client.go (Client.Submit: POST /v1/runs with the file's bytes,
    Content-Type application/json) and cmd/runctl/main.go (printRun: assigned, steps,
    warnings): the placed run decodes as runctl.Run."""
    node_up(enode)
    run = submitted(runctl, one_step())
    assert (run["run_id"], run["state"]) == ("example-command", "RUNNING")
    assert run["assigned"] == [{"as": "worker", "nodes": [{"node": NODE, "label": LABEL}]}]
    [step] = run["steps"]
    assert (step["seq"], step["id"], step["state"]) == (1, "greet", "PENDING")
    assert (step["uses"], step["node"], step["needs"]) == ("worker", NODE, [])
    assert step["chosen"] is False


def test_run_view_of_a_first_attempt_has_attempt_0_and_leaves_it_out(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors cmd/runctl/main.go (printRun shows "(attempt N+1)" whenever Attempt > 0):
    attempts are 0-based and 0 is left out of the run view (docs/contract.md#loop), or every first
    try reads as a retry."""
    node_up(enode)
    submitted(runctl, one_step())
    resp = runctl.status("example-command")
    raw_step = resp.json()["steps"][0]
    assert decode(RUN, resp.content)["steps"][0]["attempt"] == 0
    assert "attempt" not in raw_step


def test_submit_of_example_agent_is_201(enode: EnodeClient, runctl: RunctlClient) -> None:
    """mirrors internal/runctl/client.go (Client.Submit) with the original's
    internal/contract/examples/agent.json, byte for byte."""
    node_up(enode, harness="claude")
    resp = runctl.submit(EXAMPLE_AGENT)
    assert resp.status_code == 201, resp.text
    assert decode(RUN, resp.content)["state"] == "RUNNING"


def test_submit_of_example_multi_is_201_with_its_needs(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/runctl/client.go (Client.Submit) with the original's
    internal/contract/examples/multi.json, byte for byte; printRun shows what a step waits on."""
    node_up(enode)
    resp = runctl.submit(EXAMPLE_MULTI)
    assert resp.status_code == 201, resp.text
    steps = decode(RUN, resp.content)["steps"]
    assert [(s["id"], s["needs"]) for s in steps] == [("make", []), ("count", ["make"])]


def test_submit_of_a_known_run_id_is_200_with_its_current_view(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/runctl/client.go (Client.Submit: any 2xx is a Run): resubmitting is
    idempotent by run_id."""
    node_up(enode)
    submitted(runctl, one_step())
    again = runctl.submit(contract_file(one_step()))
    assert again.status_code == 200
    assert decode(RUN, again.content)["state"] == "RUNNING"


def test_submit_with_no_candidate_is_422_and_the_fail_carries_the_reason(
    runctl: RunctlClient,
) -> None:
    """mirrors internal/runctl/client.go (Client.do -> Fail{Code, Reason}) and cmd/runctl
    (report: a 4xx is exit code 2, nextStep reads the reason)."""
    resp = runctl.submit(contract_file(one_step()))
    assert resp.status_code == 422
    fail = the_fail(resp)
    assert fail["code"] == 422
    assert fail["reason"]


def test_dry_run_is_200_with_the_assignment_and_stores_nothing(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/runctl/client.go (Client.Submit with dry: POST /v1/runs/dry-run)."""
    node_up(enode)
    resp = runctl.submit(contract_file(one_step()), dry=True)
    assert resp.status_code == 200, resp.text
    run = decode(RUN, resp.content)
    assert run["state"] == "DRY_RUN"
    assert run["assigned"][0]["nodes"][0]["node"] == NODE
    assert runctl.status("example-command").status_code == 404


# --------------------------------------------------------------------------------- status


def test_status_after_a_claim_shows_the_step_started_on_its_node(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/runctl/client.go (Client.Status: Step.StartedAt *time.Time, decoded as
    RFC 3339) and cmd/runctl/main.go (printRun prints state and node per step)."""
    node_up(enode)
    submitted(runctl, one_step())
    claimed(enode)
    run = decode(RUN, runctl.status("example-command").content)
    [step] = run["steps"]
    assert (step["state"], step["node"]) == ("CLAIMED", NODE)
    assert step["started_at"] is not None
    assert step["started_at"] <= datetime.now(UTC) + timedelta(seconds=5)


def test_status_of_an_unknown_run_is_404_and_the_fail_decodes(runctl: RunctlClient) -> None:
    """mirrors internal/runctl/client.go (Client.Status -> Fail)."""
    resp = runctl.status("no-such-run")
    assert resp.status_code == 404
    assert the_fail(resp)["code"] == 404


def test_status_of_a_finished_run_carries_the_verdict_printrun_reads(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors cmd/runctl/main.go (printRun decodes verdict.checks[] {step, what, ok, note} and
    verdictCode maps the state to the exit code)."""
    node_up(enode)
    submitted(runctl, one_step())
    _, step = claimed(enode)
    enode.put_blob("example-command", 1, "greeting.txt", b"hello\n")
    reported(enode, step, command_result("greeting.txt"))
    run = decode(RUN, runctl.status("example-command").content)
    assert run["state"] == "SUCCEEDED"
    verdict = decode(VERDICT, run["verdict"])
    assert verdict["checks"] and all(c["ok"] and c["step"] == "greet" for c in verdict["checks"])


# ------------------------------------------------------------------------------ run list


def test_runs_with_the_zero_query_sends_no_query_string_and_lists_newest_first(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/runctl/client.go (Client.Runs with RunsQuery{}: GET /v1/runs, no "?"):
    the raw body is passed on verbatim, so it must be the list as its readers decode it."""
    node_up(enode)
    submitted(runctl, one_step("first"))
    submitted(runctl, one_step("second"), status=202)
    resp = runctl.runs()
    assert resp.status_code == 200, resp.text
    runs = decode(RUNS, resp.content)["runs"]
    assert [r["run_id"] for r in runs] == ["second", "first"]


def test_runs_with_all_four_filters(enode: EnodeClient, runctl: RunctlClient) -> None:
    """mirrors internal/runctl/client.go (RunsQuery.query: state, since as time.RFC3339, work,
    limit, in url.Values.Encode order)."""
    node_up(enode)
    submitted(runctl, one_step())
    since = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    resp = runctl.runs(state="RUNNING", since=since, work="manual:example-command", limit=50)
    assert resp.status_code == 200, resp.text
    assert [r["run_id"] for r in decode(RUNS, resp.content)["runs"]] == ["example-command"]


@pytest.mark.parametrize("state", ["CANCELLED", "EXPIRED", "RESOLVING"])
def test_runs_with_a_state_no_run_can_have_is_200_with_no_runs(
    enode: EnodeClient, runctl: RunctlClient, state: str
) -> None:
    """mirrors internal/runctl/client.go (RunsQuery{State: ...}: the client does not validate,
    the states are the original's vocabulary): a state no run can have lists no runs, 200
    (docs/api.md#get-v1runs--list-runs)."""
    node_up(enode)
    submitted(runctl, one_step())
    resp = runctl.runs(state=state)
    assert resp.status_code == 200, resp.text
    assert decode(RUNS, resp.content)["runs"] in ([], None)


# --------------------------------------------------------------------------------- cancel


def test_cancel_is_200_with_the_state_and_is_idempotent(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/runctl/client.go (Client.Cancel: POST …/cancel with no body and no
    Content-Type) and cmd/runctl (printRun of the answer, exit code 0)."""
    node_up(enode)
    submitted(runctl, one_step())
    first = runctl.cancel("example-command")
    assert first.status_code == 200, first.text
    assert decode(RUN, first.content)["state"] == "FAILED"
    again = runctl.cancel("example-command")
    assert (again.status_code, decode(RUN, again.content)["state"]) == (200, "FAILED")
    checks = decode_value(VERDICT, view(runctl, "example-command")["verdict"])["checks"]
    assert [c["note"] for c in checks] == [f"cancelled by: {SUBMITTER}"]


def test_cancel_of_an_unknown_run_is_404(runctl: RunctlClient) -> None:
    """mirrors internal/runctl/client.go (Client.Cancel -> Fail)."""
    resp = runctl.cancel("no-such-run")
    assert resp.status_code == 404
    assert the_fail(resp)["code"] == 404


# --------------------------------------------------------------------------- capabilities


def test_capabilities_decode_with_node_counts_and_attribute_values(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/runctl/client.go (Client.Capabilities: {capabilities: [{capability,
    nodes, attrs: {k: [values]}}]})."""
    node_up(enode, os="linux", harness="claude")
    resp = runctl.capabilities()
    assert resp.status_code == 200
    caps = decode(CAPABILITIES, resp.content)["capabilities"]
    assert caps == [
        {
            "capability": "agent.reason",
            "nodes": 1,
            "attrs": {"harness": ["claude"], "os": ["linux"]},
        }
    ]


# ---------------------------------------------------------------------------------- asks


def test_asks_inbox_decodes_and_says_who_can_answer(
    enode: EnodeClient, runctl: RunctlClient, mediator: Mediator
) -> None:
    """mirrors internal/runctl/client.go (Client.Asks: AskItem, Deadline *time.Time) and
    cmd/runctl/main.go (runctl asks: marks what the caller can answer, renders the schema's
    properties as the form)."""
    asked(enode, runctl, "report.txt", b"boot ok\n")
    items = decode(ASKS, runctl.asks().content)["asks"]
    assert [(a["run_id"], a["seq"], a["step"]) for a in items] == [("boot-1", 2, "sign-off")]
    item = items[0]
    assert item["prompt"] == "Boot log looks right?"
    assert item["can_answer"] is True
    assert item["answerers"] == [SUBMITTER]
    assert item["deadline"] is not None
    assert json.loads(item["schema"]) == DECISION
    other = RunctlClient(mediator.url, TOKEN, "someone@lab.test")
    try:
        assert decode(ASKS, other.asks().content)["asks"][0]["can_answer"] is False
    finally:
        other.close()


def test_asks_shown_json_artifact_is_the_json_value(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/runctl/client.go (ShownArtifact.Content json.RawMessage, printed as is
    by runctl asks): a JSON artifact is inlined as the JSON value itself, not a string holding
    it (docs/api.md#get-v1asks--the-open-asks)."""
    report = {"boot": "ok", "dmesg_errors": 0}
    asked(enode, runctl, "report.json", json.dumps(report).encode())
    [shown] = decode(ASKS, runctl.asks().content)["asks"][0]["shown"]
    assert shown["name"] == "report.json"
    assert json.loads(shown["content"]) == report
    assert shown["truncated"] is False


def test_asks_shown_text_artifact_stays_a_string(enode: EnodeClient, runctl: RunctlClient) -> None:
    """mirrors internal/runctl/client.go (ShownArtifact): text that is not JSON goes as a JSON
    string (docs/api.md#get-v1asks--the-open-asks)."""
    asked(enode, runctl, "report.txt", b"boot ok\n")
    [shown] = decode(ASKS, runctl.asks().content)["asks"][0]["shown"]
    assert json.loads(shown["content"]) == "boot ok\n"


def test_asks_shown_json_over_32_kib_goes_as_a_string_marked_truncated(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors cmd/runctl/main.go (runctl asks prints "(truncated; see record/blob for the
    full text)" when Truncated): a JSON artifact over 32 KiB goes cut, as a string
    (docs/compatibility.md#differences-from-the-original-server)."""
    big = json.dumps({"lines": ["x" * 64] * 1000}).encode()
    asked(enode, runctl, "report.json", big)
    [shown] = decode(ASKS, runctl.asks().content)["asks"][0]["shown"]
    content = json.loads(shown["content"])
    assert isinstance(content, str)
    assert shown["truncated"] is True
    assert big.decode().startswith(content)


def test_answer_with_set_fields_is_200_and_the_run_goes_on(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/runctl/client.go (Client.Answer: POST …/answer, the body is the
    answer) with the body cmd/runctl builds from --set verdict=approve."""
    asked(enode, runctl, "report.txt", b"boot ok\n")
    resp = runctl.answer("boot-1", 2, {"verdict": "approve"})
    assert resp.status_code == 200, resp.text
    decode(RUN, resp.content)
    assert view(runctl, "boot-1")["state"] == "SUCCEEDED"
    assert decode(ASKS, runctl.asks().content)["asks"] in ([], None)


def test_answer_that_violates_the_schema_is_422_and_the_ask_stays_open(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/runctl/client.go (Client.Answer -> Fail; runctl exits 2): nothing is
    stored and the same question can be answered again."""
    asked(enode, runctl, "report.txt", b"boot ok\n")
    resp = runctl.answer("boot-1", 2, {"verdict": "maybe"})
    assert resp.status_code == 422
    assert the_fail(resp)["code"] == 422
    assert [a["step"] for a in decode(ASKS, runctl.asks().content)["asks"]] == ["sign-off"]


# -------------------------------------------------------------------------------- record


def test_record_before_the_seal_is_409(enode: EnodeClient, runctl: RunctlClient) -> None:
    """mirrors internal/runctl/client.go (Client.Record -> Fail; runctl record exits 2)."""
    node_up(enode)
    submitted(runctl, one_step())
    resp = runctl.record("example-command")
    assert resp.status_code == 409
    assert the_fail(resp)["code"] == 409


def test_record_of_a_finished_run_is_the_sealed_tar(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/runctl/client.go (Client.Record: the body copied to the -o file as it
    comes): a tar of the run's sealed Record."""
    node_up(enode)
    submitted(runctl, one_step())
    _, step = claimed(enode)
    enode.upload_log("example-command", 1, "greet", b"hello\n")
    enode.put_blob("example-command", 1, "greeting.txt", b"hello\n")
    reported(enode, step, command_result("greeting.txt"))
    files = record_files(runctl, "example-command")
    assert json.loads(files["manifest.json"])["run_id"] == "example-command"
    assert json.loads(files["verdict.json"])["state"] == "SUCCEEDED"
    assert files["logs/01-greet.log"] == b"hello\n"
    assert "SHA256SUMS" in files
