"""Every request the original node agent (internal/enode) sends, against a real Mediator
(docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl): adverts, claims,
logs, progress chunks, blobs, blob reads for ``in.from``, results and the exit report, each built as
the Go code builds it and each answer read as its Go types read it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import requests

from tests.compat.clients import EnodeClient, RunctlClient
from tests.compat.gowire import (
    ADVERT_RESPONSE,
    FAIL,
    LEDGER,
    LEDGER_ENTRY,
    LEDGER_ENTRY_KEYS,
    LEDGER_ENTRY_REQUIRED,
    VERDICT,
    WORKSPACE_SPEC,
    Slice,
    decode,
    decode_value,
)
from tests.compat.mediator import LONG_POLL_SECONDS, SUBMITTER, Mediator
from tests.compat.scenario import (
    NODE,
    advert,
    capability,
    claimed,
    command_result,
    contract_file,
    node_up,
    now_go,
    one_step,
    record_files,
    reported,
    result,
    submitted,
    view,
)
from tests.support.apps import TOKEN

MAX_ERROR = 64 * 1024


def two_steps(run_id: str, first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """A two-step contract on one agent.reason worker; ``second`` needs ``first``."""
    return {
        "run_id": run_id,
        "requires": [{"as": "worker", "capability": "agent.reason"}],
        "steps": [{"uses": "worker", **first}, {"uses": "worker", **second}],
    }


def loop_contract(run_id: str = "loop-1") -> dict[str, Any]:
    """draft (an agent step) then check, which loops back to draft until it exits 0."""
    return two_steps(
        run_id,
        {
            "id": "draft",
            "agent": {"max_turns": 5},
            "in": {"prompt": "Fix the build."},
            "out": ["patch.diff"],
        },
        {
            "id": "check",
            "run": ["make", "check"],
            "loop": {"back_to": "draft", "max": 3, "until": {"exit_code": 0}},
        },
    )


def retried_draft(
    enode: EnodeClient, runctl: RunctlClient, *, first_attempt: bytes | None = None
) -> dict[str, Any]:
    """The loop contract run until draft is claimed again in attempt 1, as the agent drives it:
    draft (streaming ``first_attempt`` as a progress chunk of attempt 0), its result, the check
    failing, the claim of draft's next attempt. Returns that claimed step."""
    node_up(enode)
    submitted(runctl, loop_contract())
    _, draft = claimed(enode)
    if first_attempt is not None:
        chunk = enode.put_log_chunk("loop-1", 1, "draft", 0, first_attempt)
        assert chunk.status_code == 200, chunk.text
    reported(enode, draft, exit_code=None, produced=[])
    _, check = claimed(enode)
    assert enode.report("loop-1", check["seq"], command_result(exit_code=1)).status_code == 200
    _, again = claimed(enode)
    assert (again["name"], again["attempt"]) == ("draft", 1)
    return again


def step_document(files: dict[str, bytes], seq: int, step_id: str) -> dict[str, Any]:
    return json.loads(files[f"steps/{seq:02d}-{step_id}.json"])


def in_document(doc: dict[str, Any], key: str) -> Any:
    """A result field kept in the step's document: at its top level or under ``result``."""
    if key in doc:
        return doc[key]
    return (doc.get("result") or {}).get(key)


# ------------------------------------------------------------------------------- adverts


def test_advert_as_the_agent_sends_it_is_200_with_an_empty_lease_list(enode: EnodeClient) -> None:
    """mirrors internal/enode/advertise.go (Client.Advertise, Advertiser.Run): the body is
    contract.Advert with no policy key when no drain is set; the reply decodes as
    AdvertResponse, whose renew_seconds the agent adopts as its advert period when > 0."""
    resp = enode.advertise(advert(NODE, [capability(os="linux", arch="arm64")]))
    assert resp.status_code == 200, resp.text
    reply = decode(ADVERT_RESPONSE, resp.content)
    assert reply["leases"] in ([], None)
    assert reply["renew_seconds"] > 0
    assert reply["drain"] == ""


def test_advert_reply_lists_the_lease_of_a_placed_run_in_the_original_lease_shape(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/advertise.go (Client.Advertise -> Advertiser.OnLeases): each lease
    decodes as enode.Lease; a lease missing from the list stops the agent's work for that run, so
    the placed run's lease must be there with a future not_after and its nonce."""
    node_up(enode)
    submitted(runctl, one_step())
    reply = decode(ADVERT_RESPONSE, enode.advertise(advert(NODE, [capability()])).content)
    assert [lease["run_id"] for lease in reply["leases"]] == ["example-command"]
    lease = reply["leases"][0]
    assert lease["node"] == NODE
    assert lease["capability"] == "agent.reason"
    assert lease["nonce"]
    assert lease["not_after"] > datetime.now(UTC)


def test_advert_with_capabilities_null_is_taken_and_the_node_gets_no_work(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/advertise.go (Advertiser.Run): a node that detects nothing marshals
    a nil slice, "capabilities": null (docs/api.md#post-v1nodes--advertise-the-heartbeat). The
    advert must be taken (a 4xx drops the node from the fleet) and the node offers nothing: a run
    needing agent.reason has no candidate."""
    resp = enode.advertise(advert(NODE, None))
    assert resp.status_code == 200, resp.text
    assert decode(ADVERT_RESPONSE, resp.content)["leases"] in ([], None)
    nodes = runctl.nodes().json()["nodes"]
    assert [(n["node_id"], n["capabilities"]) for n in nodes] == [(NODE, [])]
    assert runctl.submit(contract_file(one_step())).status_code == 422


def test_advert_with_attrs_null_reads_as_no_attributes(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/contract/advert.go (Capability with a nil Attrs map, "attrs": null) as
    internal/enode/advertise.go sends it: taken as {}
    (docs/api.md#post-v1nodes--advertise-the-heartbeat), so a requirement without attributes is
    satisfied and the run is placed."""
    resp = enode.advertise(
        advert(NODE, [{"capability": "agent.reason", "attrs": None}]),
    )
    assert resp.status_code == 200, resp.text
    run = submitted(runctl, one_step())
    assert run["state"] == "RUNNING"
    assert run["assigned"][0]["nodes"][0]["node"] == NODE


def test_advert_with_a_nul_in_the_label_is_taken_as_u_fffd(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/advertise.go (Client.Advertise): the label is derived from the
    machine, never checked by the agent; an advert is never refused for its text and a NUL
    becomes U+FFFD
    (docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl)."""
    resp = enode.advertise(advert(NODE, [capability()], label="bench\x007"))
    assert resp.status_code == 200, resp.text
    nodes = runctl.nodes().json()["nodes"]
    assert [n["label"] for n in nodes] == ["bench\ufffd7"]


def test_advert_policy_drain_is_acknowledged_in_the_reply(enode: EnodeClient) -> None:
    """mirrors internal/enode/advertise.go (Advertiser.Run -> Held.SetDrain): the agent stops
    claiming on the drain the reply echoes, not on its own file; "policy" is sent only when a
    drain is set (omitzero)."""
    reply = decode(
        ADVERT_RESPONSE, enode.advertise(advert(NODE, [capability()], drain="at-boundary")).content
    )
    assert reply["drain"] == "at-boundary"
    reply = decode(ADVERT_RESPONSE, enode.advertise(advert(NODE, [capability()])).content)
    assert reply["drain"] == ""


def test_an_operators_hold_is_not_echoed_and_the_agent_keeps_claiming_its_run(
    enode: EnodeClient, runctl: RunctlClient, mediator: Mediator
) -> None:
    """mirrors internal/enode/advertise.go (Held.SetDrain from the reply): an operator's drain of
    the node (docs/operators.md) is never in the heartbeat reply, or the agent would stop
    claiming for good between two steps of the run it holds; it keeps claiming that run's
    steps."""
    node_up(enode)
    submitted(runctl, one_step())
    hold = requests.post(
        mediator.url + f"/v1/nodes/{NODE}/drain",
        json={"mode": "graceful", "reason": "new firmware"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert hold.status_code == 200, hold.text
    reply = decode(ADVERT_RESPONSE, enode.advertise(advert(NODE, [capability()])).content)
    assert reply["drain"] == ""
    assert [lease["run_id"] for lease in reply["leases"]] == ["example-command"]
    _, step = claimed(enode)
    assert step["run_id"] == "example-command"


def test_advert_from_a_new_instance_fails_the_step_the_old_instance_claimed(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/advertise.go (Advert.Instance, a new random value per process
    start): the step claimed by the previous life cannot be trusted and fails, and its run
    with it (docs/operators.md#why-the-heartbeat-reply-does-not-carry-the-hold)."""
    node_up(enode)
    submitted(runctl, one_step())
    claimed(enode)
    assert enode.advertise(advert(NODE, [capability()], instance="life-2")).status_code == 200
    run = view(runctl, "example-command")
    assert run["state"] == "FAILED"
    assert run["steps"][0]["state"] == "FAILED"


# -------------------------------------------------------------------------------- claims


def test_claim_hands_out_the_step_in_the_original_step_shape(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Client.Claim: POST /v1/nodes/{id}/claim, no body, no
    query, X-Enode-Instance): the body decodes as enode.Step and carries what Worker.execute
    runs (run, out, schema, in) and the lease it checks before it starts."""
    node_up(enode)
    submitted(runctl, one_step())
    _, step = claimed(enode)
    assert step["step_id"] == "example-command#01"
    assert (step["run_id"], step["seq"], step["name"]) == ("example-command", 1, "greet")
    assert (step["uses"], step["kind"]) == ("worker", "run")
    assert step["run"] == ["sh", "-c", "echo hello > $OUT/greeting.txt"]
    assert step["out"] == ["greeting.txt"]
    assert step["requester"] == SUBMITTER
    lease = step["lease"]
    assert (lease["run_id"], lease["node"]) == ("example-command", NODE)
    assert lease["nonce"]
    assert lease["not_after"] > datetime.now(UTC)


def test_claim_of_a_first_attempt_has_attempt_0_and_leaves_it_out(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Step.Attempt, omitempty, 0-based): on attempt > 0 the
    agent feeds the previous attempt's _cannot back to the harness and tags its progress chunks
    with the attempt, so a first try must read 0 (docs/contract.md#loop), and 0 is left out."""
    node_up(enode)
    submitted(runctl, one_step())
    raw, step = claimed(enode)
    assert step["attempt"] == 0
    assert "attempt" not in raw


def test_claim_leaves_workspace_out_when_the_step_has_none(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/workspace.go (parseWorkspace): only an absent workspace
    (len(raw) == 0) means "no workspace"; "workspace": null parses as a WorkspaceSpec with no
    repo and the agent runs in an unprepared workspace
    (docs/api.md#post-v1nodesnode_idclaim--the-next-step-for-a-node)."""
    node_up(enode)
    submitted(runctl, one_step())
    raw, step = claimed(enode)
    assert "workspace" not in raw
    assert step["workspace"] == ""


def test_claim_carries_the_workspace_the_step_declares(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/workspace.go (parseWorkspace -> Worker.Prepare): the raw
    workspace decodes as WorkspaceSpec and its repo is compared with the node's checkout."""
    node_up(enode)
    repo = "gerrit.lab.test/kernel/linux"
    submitted(runctl, one_step(workspace={"repo": repo, "rev": "4711abc"}))
    _, step = claimed(enode)
    assert decode(WORKSPACE_SPEC, step["workspace"])["repo"] == repo


def test_claim_with_nothing_to_do_is_204_after_the_long_poll_window(enode: EnodeClient) -> None:
    """mirrors internal/enode/claim.go (Client.Claim: 204 is errNoWork, and Worker.Run claims
    again at once): no ?wait= is sent, so the server's window applies, and a 204 has no body."""
    node_up(enode)
    started = datetime.now(UTC)
    resp = enode.claim(NODE)
    assert resp.status_code == 204
    assert resp.content == b""
    assert (datetime.now(UTC) - started).total_seconds() >= LONG_POLL_SECONDS * 0.9


def test_claim_from_the_same_instance_redelivers_the_step_it_holds(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Client.Claim with X-Enode-Instance): a claim whose answer
    was lost is asked again by the same life and gets the same step back."""
    node_up(enode)
    submitted(runctl, one_step())
    _, first = claimed(enode)
    _, again = claimed(enode)
    assert again["step_id"] == first["step_id"]
    assert again["lease"]["nonce"] == first["lease"]["nonce"]


def test_claim_does_not_redeliver_under_an_expired_lease(
    enode: EnodeClient, runctl: RunctlClient, mediator: Mediator
) -> None:
    """mirrors internal/enode/claim.go (Client.Claim; Worker.execute does not run a step under a
    lapsed lease) against internal/store/claim.go (redeliver joins the lease with
    not_after > now()): no redelivery under an expired lease
    (docs/api.md#post-v1nodesnode_idclaim--the-next-step-for-a-node)."""
    node_up(enode)
    submitted(runctl, one_step())
    claimed(enode)
    mediator.sql("update leases set not_after = now() - interval '1 minute'")
    assert enode.claim(NODE).status_code == 204


def test_claim_carries_feedback_and_check_changed_when_the_contract_sets_them(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Step.Feedback: blobs fetched into the prompt on every
    attempt; Step.CheckChanged: the paths the node checks after the step) as the original
    server filled them from the step's feedback and success_when[].changed
    (docs/api.md#post-v1nodesnode_idclaim--the-next-step-for-a-node,
    docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl)."""
    node_up(enode)
    doc = two_steps(
        "fix-1",
        {"id": "review", "run": ["review"], "out": ["review.txt"]},
        {
            "id": "fix",
            "agent": {"max_turns": 5},
            "in": {"prompt": "Address the review."},
            "feedback": ["review.txt"],
            "workspace": {"repo": "gerrit.lab.test/kernel/linux", "rev": "4711abc"},
        },
    )
    doc["success_when"] = [{"step": "fix", "changed": ["drivers/gpio/gpio-mxc.c"]}]
    submitted(runctl, doc)
    _, first = claimed(enode)
    assert enode.put_blob("fix-1", 1, "review.txt", b"rename the flag\n").status_code // 100 == 2
    reported(enode, first, command_result("review.txt"))
    _, step = claimed(enode)
    assert step["name"] == "fix"
    assert step["feedback"] == ["review.txt"]
    assert step["check_changed"] == ["drivers/gpio/gpio-mxc.c"]


def test_claim_carries_the_ledger_listing_only_for_see_ledger_list(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Step.Ledger, written verbatim to $IN/_ledger.json): sent
    only for see.ledger "list", as a list of entries in the original's shape
    (docs/api.md#post-v1nodesnode_idclaim--the-next-step-for-a-node)."""
    node_up(enode)
    submitted(
        runctl,
        two_steps(
            "seen-1",
            {"id": "make", "run": ["make"], "out": ["lines.txt"]},
            {
                "id": "count",
                "run": ["wc"],
                "in": {"from": ["lines.txt"]},
                "see": {"ledger": "list"},
            },
        ),
    )
    _, first = claimed(enode)
    assert enode.put_blob("seen-1", 1, "lines.txt", b"one\ntwo\n").status_code // 100 == 2
    reported(enode, first, command_result("lines.txt"))
    raw, step = claimed(enode)
    assert isinstance(raw.get("ledger"), list), raw.get("ledger")
    entries = decode(Slice(LEDGER_ENTRY), step["ledger"])
    for entry in raw["ledger"]:
        assert LEDGER_ENTRY_REQUIRED <= set(entry) <= LEDGER_ENTRY_KEYS, entry
    assert [(e["seq"], e["attempt"], e["name"], e["bytes"]) for e in entries] == [
        (1, 0, "lines.txt", 8)
    ]


def test_claim_leaves_the_ledger_out_when_the_step_does_not_ask_for_it(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Worker.execute writes $IN/_ledger.json whenever
    len(step.Ledger) > 0): a step with in.from but no see.ledger "list" gets no ledger key."""
    node_up(enode)
    submitted(
        runctl,
        two_steps(
            "seen-2",
            {"id": "make", "run": ["make"], "out": ["lines.txt"]},
            {"id": "count", "run": ["wc"], "in": {"from": ["lines.txt"]}},
        ),
    )
    _, first = claimed(enode)
    assert enode.put_blob("seen-2", 1, "lines.txt", b"one\ntwo\n").status_code // 100 == 2
    reported(enode, first, command_result("lines.txt"))
    raw, step = claimed(enode)
    assert step["name"] == "count"
    assert "ledger" not in raw


def test_claim_after_a_loop_reset_carries_attempt_1(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Step.Attempt > 0 marks a retry): after the first reset
    the reset steps are handed out with attempt 1 (docs/contract.md#loop)."""
    node_up(enode)
    submitted(runctl, loop_contract())
    _, draft = claimed(enode)
    reported(enode, draft, exit_code=None, produced=[])
    _, check = claimed(enode)
    resp = enode.report("loop-1", check["seq"], command_result(exit_code=1))
    assert resp.status_code == 200, resp.text
    assert resp.json().get("rolled_back") is True
    raw, again = claimed(enode)
    assert again["name"] == "draft"
    assert again["attempt"] == 1
    assert raw["attempt"] == 1


# ---------------------------------------------------------------------------------- logs


def test_upload_log_appends_and_answers_the_total_length(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/upload.go (Client.UploadLog: PUT …/log?name=<step name>,
    text/plain; charset=utf-8): any 2xx is success; X-Enode-Log-Bytes is the file's total."""
    node_up(enode)
    submitted(runctl, one_step())
    claimed(enode)
    first = enode.upload_log("example-command", 1, "greet", b"hello\n")
    assert first.status_code // 100 == 2
    assert first.headers["X-Enode-Log-Bytes"] == "6"
    second = enode.upload_log("example-command", 1, "greet", b"world\n")
    assert second.headers["X-Enode-Log-Bytes"] == "12"


def test_progress_chunk_answers_its_attempt_and_total_and_stays_apart_from_the_log(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/upload.go (Client.PutLogChunk: ?name=&progress=1&attempt=, and the
    uploader reads X-Enode-Log-Bytes, X-Enode-Log-Attempt, X-Enode-Log-Capped): a chunk goes to
    the progress file, not the final log, and a reader sees it before the seal
    (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log)."""
    node_up(enode)
    submitted(runctl, one_step())
    claimed(enode)
    chunk = enode.put_log_chunk("example-command", 1, "greet", 0, b"compiling 1/3\n")
    assert chunk.status_code // 100 == 2, chunk.text
    assert chunk.headers["X-Enode-Log-Bytes"] == "14"
    assert chunk.headers["X-Enode-Log-Attempt"] == "0"
    assert chunk.headers.get("X-Enode-Log-Capped") != "1"
    final = enode.upload_log("example-command", 1, "greet", b"done\n")
    assert final.headers["X-Enode-Log-Bytes"] == "5"
    live = runctl.step_log("example-command", 1, "greet")
    assert live.status_code == 200
    assert live.headers["X-Enode-Log-Source"] == "progress"
    assert live.content == b"compiling 1/3\n"


def test_progress_is_dropped_at_seal_and_never_in_the_sealed_log(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/upload.go (uploader flushes its tail before Client.UploadLog
    sends the curated final log): the sealed Record holds the final log only
    (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log)."""
    node_up(enode)
    submitted(runctl, one_step())
    _, step = claimed(enode)
    enode.put_log_chunk("example-command", 1, "greet", 0, b"RAW TRANSCRIPT\n")
    enode.upload_log("example-command", 1, "greet", b"final log\n")
    enode.put_blob("example-command", 1, "greeting.txt", b"hello\n")
    reported(enode, step, command_result("greeting.txt"))
    sealed = runctl.step_log("example-command", 1, "greet")
    assert sealed.status_code == 200
    assert sealed.headers["X-Enode-Log-Source"] == "sealed"
    assert sealed.content == b"final log\n"
    files = record_files(runctl, "example-command")
    assert files["logs/01-greet.log"] == b"final log\n"
    assert not [path for path, data in files.items() if b"RAW TRANSCRIPT" in data]


def test_progress_chunk_of_a_lower_attempt_is_discarded_with_the_current_headers(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/upload.go (uploader.run: when X-Enode-Log-Attempt is above its
    own attempt the uploader is stale and stops): a late chunk of an earlier attempt is 200,
    stores nothing, and says which attempt the progress belongs to
    (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log)."""
    retried_draft(enode, runctl)
    enode.put_log_chunk("loop-1", 1, "draft", 1, b"new\n")
    late = enode.put_log_chunk("loop-1", 1, "draft", 0, b"old old\n")
    assert late.status_code == 200, late.text
    assert late.headers["X-Enode-Log-Attempt"] == "1"
    assert late.headers["X-Enode-Log-Bytes"] == "4"
    assert runctl.step_log("loop-1", 1, "draft").content == b"new\n"


def test_progress_chunk_of_a_higher_attempt_replaces_the_progress(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/upload.go (one uploader per step attempt, each counting from 0):
    the first chunk of a newer attempt starts the progress file afresh
    (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log)."""
    retried_draft(enode, runctl, first_attempt=b"attempt zero\n")
    newer = enode.put_log_chunk("loop-1", 1, "draft", 1, b"one\n")
    assert newer.status_code // 100 == 2, newer.text
    assert newer.headers["X-Enode-Log-Attempt"] == "1"
    assert newer.headers["X-Enode-Log-Bytes"] == "4"
    assert runctl.step_log("loop-1", 1, "draft").content == b"one\n"


def test_progress_chunk_with_a_negative_attempt_is_400(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/upload.go (Client.PutLogChunk formats the attempt with %d): the
    attempt is a number >= 0, anything else is 400 ``invalid attempt``
    (docs/api.md#put-v1runsrun_idstepsseqlog--append-to-a-steps-log)."""
    node_up(enode)
    submitted(runctl, one_step())
    claimed(enode)
    resp = enode.put_log_chunk("example-command", 1, "greet", -1, b"x\n")
    assert resp.status_code == 400
    assert "invalid attempt" in decode(FAIL, resp.content)["error"]["reason"]


def test_log_of_a_finished_run_is_410(enode: EnodeClient, runctl: RunctlClient) -> None:
    """mirrors internal/enode/upload.go (Client.put: a 4xx is BlobRejected, final, not
    retried): a log for a run that already ended is 410."""
    node_up(enode)
    submitted(runctl, one_step())
    _, step = claimed(enode)
    reported(enode, step, command_result())
    assert enode.upload_log("example-command", 1, "greet", b"late\n").status_code == 410


# --------------------------------------------------------------------------------- blobs


def test_blob_of_a_declared_name_is_stored_and_read_back_by_name(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/upload.go (Client.PutBlob: application/octet-stream,
    Content-Length = file size) and internal/enode/claim.go (Client.GetBlob: 2xx is the
    body)."""
    node_up(enode)
    submitted(runctl, one_step())
    claimed(enode)
    put = enode.put_blob("example-command", 1, "greeting.txt", b"hello\n")
    assert put.status_code // 100 == 2, put.text
    got = enode.get_blob("example-command", "greeting.txt")
    assert got.status_code == 200
    assert got.content == b"hello\n"


def test_empty_blob_sent_without_a_body_is_stored_empty(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/upload.go (Client.PutBlob: size 0 sends http.NoBody with
    Content-Length 0): an empty file is an artifact like any other."""
    node_up(enode)
    submitted(runctl, one_step())
    claimed(enode)
    put = enode.put_blob("example-command", 1, "greeting.txt", b"")
    assert put.status_code // 100 == 2, put.text
    got = enode.get_blob("example-command", "greeting.txt")
    assert (got.status_code, got.content) == (200, b"")


def test_blob_of_an_undeclared_name_is_stored_and_readable(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/upload.go (Worker.upload puts every name in $OUT, declared or
    not): an undeclared name is stored
    (docs/api.md#put-v1runsrun_idstepsseqblobname--upload-an-artifact); a 4xx would be final for the
    agent."""
    node_up(enode)
    submitted(runctl, one_step())
    claimed(enode)
    put = enode.put_blob("example-command", 1, "build-notes.txt", b"warnings: 3\n")
    assert put.status_code // 100 == 2, put.text
    got = enode.get_blob("example-command", "build-notes.txt")
    assert (got.status_code, got.content) == (200, b"warnings: 3\n")


def test_cannot_left_by_a_failed_attempt_is_read_by_the_next_attempt(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (runAgentStep: on Attempt > 0 the agent fetches _cannot
    with Client.GetBlob and puts it in the prompt) and upload.go (the harness's _cannot is
    uploaded with the rest of $OUT):
    docs/api.md#put-v1runsrun_idstepsseqblobname--upload-an-artifact."""
    node_up(enode)
    submitted(runctl, loop_contract())
    _, draft = claimed(enode)
    put = enode.put_blob("loop-1", 1, "_cannot", b"the header is generated; cannot edit it\n")
    assert put.status_code // 100 == 2, put.text
    reported(enode, draft, exit_code=None, produced=["_cannot"])
    _, check = claimed(enode)
    assert enode.report("loop-1", check["seq"], command_result(exit_code=1)).status_code == 200
    _, again = claimed(enode)
    assert (again["name"], again["attempt"]) == ("draft", 1)
    got = enode.get_blob("loop-1", "_cannot")
    assert (got.status_code, got.content) == (200, b"the header is generated; cannot edit it\n")


def test_blob_violating_the_schema_is_422_and_not_stored(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/upload.go (Client.PutBlob: 422 is a schema violation, the name is
    not listed in produced): nothing is stored."""
    node_up(enode)
    schema = {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}
    doc = one_step(out=["result.json"], schema={"result.json": schema})
    doc["success_when"] = [{"step": "greet", "produced": ["result.json"]}]
    submitted(runctl, doc)
    claimed(enode)
    assert enode.put_blob("example-command", 1, "result.json", b'{"ok": "yes"}').status_code == 422
    assert enode.get_blob("example-command", "result.json").status_code == 404


def test_in_from_resolves_a_declared_name_among_the_steps_that_declare_it(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Worker.execute fetches each in.from name with
    Client.GetBlob): a name some step declares resolves only among that step's blobs, not a
    newer stray upload of the same name by another step
    (docs/api.md#put-v1runsrun_idstepsseqblobname--upload-an-artifact)."""
    node_up(enode)
    submitted(
        runctl,
        two_steps(
            "res-1",
            {"id": "make", "run": ["make"], "out": ["report.json"]},
            {"id": "scan", "run": ["scan"], "out": ["scan.txt"]},
        ),
    )
    _, first = claimed(enode)
    enode.put_blob("res-1", 1, "report.json", b'{"v": 1}')
    reported(enode, first, command_result("report.json"))
    claimed(enode)
    stray = enode.put_blob("res-1", 2, "report.json", b'{"v": 2}')
    assert stray.status_code // 100 == 2, stray.text
    assert enode.get_blob("res-1", "report.json").content == b'{"v": 1}'


def test_in_from_resolves_an_undeclared_name_newest_first(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Client.GetBlob: "by name the newest comes"): a name no
    step declares resolves among all blobs of the run, newest (attempt, seq) first
    (docs/api.md#put-v1runsrun_idstepsseqblobname--upload-an-artifact)."""
    node_up(enode)
    submitted(
        runctl,
        two_steps(
            "res-2",
            {"id": "make", "run": ["make"], "out": ["a.txt"]},
            {"id": "scan", "run": ["scan"], "out": ["b.txt"]},
        ),
    )
    _, first = claimed(enode)
    enode.put_blob("res-2", 1, "notes.txt", b"from make\n")
    reported(enode, first, command_result("notes.txt"))
    claimed(enode)
    enode.put_blob("res-2", 2, "notes.txt", b"from scan\n")
    got = enode.get_blob("res-2", "notes.txt")
    assert (got.status_code, got.content) == (200, b"from scan\n")


def test_get_blob_of_a_name_nobody_uploaded_is_404(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Client.GetBlob: 404 is ErrNoBlob, recorded as a missing
    input; any other non-2xx fails the step)."""
    node_up(enode)
    submitted(runctl, one_step())
    claimed(enode)
    assert enode.get_blob("example-command", "greeting.txt").status_code == 404


def test_ledger_lists_blobs_in_the_original_entry_shape_with_0_based_attempts(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/store/observe.go (LedgerEntry: seq, attempt, name, by, at, bytes,
    schema_ok?; Store.Ledger), the original server's ledger that the fleet's readers decode and
    internal/enode/claim.go writes to $IN/_ledger.json: a first attempt's blob is attempt 0
    (docs/contract.md#loop)."""
    node_up(enode)
    submitted(runctl, one_step())
    claimed(enode)
    enode.put_blob("example-command", 1, "greeting.txt", b"hello\n")
    resp = runctl.ledger("example-command")
    assert resp.status_code == 200
    entries = decode(LEDGER, resp.content)["entries"]
    assert [(e["seq"], e["attempt"], e["name"], e["bytes"]) for e in entries] == [
        (1, 0, "greeting.txt", 6)
    ]


def test_blob_files_in_the_record_carry_the_0_based_attempt(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/store/claim.go (stampLedger names blobs "%02d.%d-%s" of seq, 0-based
    attempt and name, as the original's Record lays them out): the first attempt's file is
    blobs/01.0-greeting.txt (docs/contract.md#loop)."""
    node_up(enode)
    submitted(runctl, one_step())
    _, step = claimed(enode)
    enode.put_blob("example-command", 1, "greeting.txt", b"hello\n")
    reported(enode, step, command_result("greeting.txt"))
    files = record_files(runctl, "example-command")
    assert files.get("blobs/01.0-greeting.txt") == b"hello\n", sorted(files)


# ------------------------------------------------------------------------------- results


def test_result_as_the_agent_sends_it_is_exactly_200_and_only_declared_names_count(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Client.Report: only 200 is delivered, another 2xx is
    retried, a 4xx is final) with produced = every name Worker.upload put, undeclared ones
    included (docs/api.md#put-v1runsrun_idstepsseqblobname--upload-an-artifact): the run is judged
    on the declared name."""
    node_up(enode)
    submitted(runctl, one_step())
    _, step = claimed(enode)
    for name, data in (("greeting.txt", b"hello\n"), ("_cannot", b""), ("trace.txt", b"t\n")):
        enode.put_blob("example-command", 1, name, data)
    resp = enode.report(
        "example-command", 1, command_result("_cannot", "greeting.txt", "trace.txt")
    )
    assert resp.status_code == 200, resp.text
    run = view(runctl, "example-command")
    assert run["state"] == "SUCCEEDED"
    checks = decode_value(VERDICT, run["verdict"])["checks"]
    assert all(c["ok"] for c in checks), checks


def test_result_error_of_100_kib_is_taken_and_stored_cut_with_a_note(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Result.Error carries a harness's message or a runtime
    error of any length; a 4xx on a result is final and redelivery would rerun the step): taken
    and stored up to 64 KiB with a truncation note
    (docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl)."""
    node_up(enode)
    submitted(runctl, one_step())
    _, step = claimed(enode)
    error = "harness: crash " + "stack frame\n" * 9000
    resp = enode.report("example-command", 1, result(exit_code=None, error=error))
    assert resp.status_code == 200, resp.text
    assert view(runctl, "example-command")["steps"][0]["state"] == "FAILED"
    stored = step_document(record_files(runctl, "example-command"), 1, "greet")["error"]
    assert 60 * 1024 < len(stored.encode()) <= MAX_ERROR + 256
    assert error.startswith(stored[: 60 * 1024])
    assert "trunc" in stored[-256:].lower()


def test_result_newer_fields_are_kept_verbatim_in_the_step_document(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Result: exited_at, diagnostics, environment, workspace,
    changed, set by Worker.execute and afterExit): kept verbatim in the step's document in the
    Record (docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl)."""
    node_up(enode)
    submitted(runctl, one_step(workspace={"repo": "gerrit.lab.test/kernel/linux", "rev": "a1"}))
    _, step = claimed(enode)
    enode.put_blob("example-command", 1, "greeting.txt", b"hello\n")
    newer: dict[str, Any] = {
        "exited_at": "2026-12-02T10:15:30.123456789Z",
        "diagnostics": {"missing": ["coverage.xml"], "changes": "measured", "effect": "build"},
        "environment": {"runtime": "runc-overlay", "image": "sha256:5d1a"},
        "workspace": "clean",
        "changed": ["drivers/gpio/gpio-mxc.c"],
    }
    reported(enode, step, result(exit_code=0, produced=["greeting.txt"], **newer))
    doc = step_document(record_files(runctl, "example-command"), 1, "greet")
    assert {k: in_document(doc, k) for k in newer} == newer


def test_result_with_malformed_newer_fields_is_still_200(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Client.Report: a 4xx is final, the step is not
    reported again): newer fields of an unexpected shape are dropped, never a 400
    (docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl)."""
    node_up(enode)
    submitted(runctl, one_step())
    claimed(enode)
    body = result(exit_code=0)
    body.update(exited_at="yesterday", diagnostics="none", environment=[1, 2], workspace={"x": 1})
    body["changed"] = "drivers/gpio/gpio-mxc.c"
    resp = enode.report("example-command", 1, body)
    assert resp.status_code == 200, resp.text
    assert view(runctl, "example-command")["steps"][0]["state"] == "DONE"


def test_result_with_a_nul_in_its_error_is_taken_as_u_fffd(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Result.Error = runErr.Error(), text from the operating
    system or the harness): a NUL becomes U+FFFD, the result is never refused for its text
    (docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl)."""
    node_up(enode)
    submitted(runctl, one_step())
    claimed(enode)
    resp = enode.report("example-command", 1, result(exit_code=None, error="fork\x00failed"))
    assert resp.status_code == 200, resp.text
    stored = step_document(record_files(runctl, "example-command"), 1, "greet")["error"]
    assert "fork\ufffdfailed" in stored


def test_result_with_a_string_exit_code_stays_400(enode: EnodeClient, runctl: RunctlClient) -> None:
    """mirrors internal/enode/claim.go (Result.ExitCode *int: the agent always sends a number):
    a wrong type of a field the Mediator decides on stays a 400
    (docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl)."""
    node_up(enode)
    submitted(runctl, one_step())
    claimed(enode)
    body = result(exit_code=None)
    body["exit_code"] = "0"
    resp = enode.report("example-command", 1, body)
    assert resp.status_code == 400
    assert "exit_code" in decode(FAIL, resp.content)["error"]["reason"]
    assert view(runctl, "example-command")["steps"][0]["state"] == "CLAIMED"


def test_second_result_for_the_step_is_409_and_changes_nothing(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Worker.report retries until an answer; a 4xx is
    ReportRejected, final): a duplicate of an accepted result is 409."""
    node_up(enode)
    submitted(runctl, one_step())
    _, step = claimed(enode)
    enode.put_blob("example-command", 1, "greeting.txt", b"hello\n")
    reported(enode, step, command_result("greeting.txt"))
    again = enode.report("example-command", 1, command_result("greeting.txt", exit_code=3))
    assert again.status_code == 409
    assert decode(FAIL, again.content)["error"]["code"] == 409
    assert view(runctl, "example-command")["state"] == "SUCCEEDED"


def test_exited_is_404_and_leaves_the_step_claimed(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Client.Exited: POST …/exited with contract.Exited; a
    404 means an older server and exitedStop stops sending it): not served
    (docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl), the step stays
    CLAIMED and its result is still taken."""
    node_up(enode)
    submitted(runctl, one_step())
    _, step = claimed(enode)
    exited = {
        "node": NODE,
        "instance": "life-1",
        "attempt": step["attempt"],
        "outcome": {"kind": "exit", "code": 0},
        "exited_at": now_go(),
    }
    resp = enode.exited("example-command", 1, exited)
    assert resp.status_code == 404
    assert decode(FAIL, resp.content)["error"]["code"] == 404
    assert view(runctl, "example-command")["steps"][0]["state"] == "CLAIMED"
    assert enode.report("example-command", 1, command_result()).status_code == 200


# ---------------------------------------------------------------------------------- flow


def test_the_agent_runs_example_multi_to_a_sealed_record(
    enode: EnodeClient, runctl: RunctlClient
) -> None:
    """mirrors internal/enode/claim.go (Worker.Run -> execute: claim, fetch in.from with
    GetBlob, run, Worker.upload the log then $OUT, report) on the original's
    internal/contract/examples/multi.json, to a SUCCEEDED run and a sealed Record."""
    node_up(enode)
    doc = {
        "run_id": "example-multi",
        "work": {"id": {"system": "manual", "change_id": "example-multi"}, "system": "manual"},
        "requires": [{"as": "worker", "capability": "agent.reason"}],
        "steps": [
            {
                "id": "make",
                "uses": "worker",
                "run": ["sh", "-c", "printf 'one\\ntwo\\n' > $OUT/lines.txt"],
                "out": ["lines.txt"],
            },
            {
                "id": "count",
                "uses": "worker",
                "needs": ["make"],
                "in": {"from": ["lines.txt"]},
                "run": ["sh", "-c", "wc -l < $IN/lines.txt > $OUT/count.txt"],
                "out": ["count.txt"],
            },
        ],
        "success_when": [
            {"step": "make", "exit_code": 0, "produced": ["lines.txt"]},
            {"step": "count", "exit_code": 0, "produced": ["count.txt"]},
        ],
    }
    submitted(runctl, doc)
    _, make = claimed(enode)
    assert make["name"] == "make"
    assert enode.upload_log("example-multi", 1, "make", b"").status_code // 100 == 2
    assert enode.put_blob("example-multi", 1, "lines.txt", b"one\ntwo\n").status_code // 100 == 2
    reported(enode, make, command_result("lines.txt"))
    _, count = claimed(enode)
    assert count["in"]["from"] == ["lines.txt"]
    fetched = enode.get_blob("example-multi", "lines.txt")
    assert (fetched.status_code, fetched.content) == (200, b"one\ntwo\n")
    enode.upload_log("example-multi", 2, "count", b"")
    enode.put_blob("example-multi", 2, "count.txt", b"2\n")
    last = reported(enode, count, command_result("count.txt"))
    assert last.json()["run_state"] == "SUCCEEDED"
    files = record_files(runctl, "example-multi")
    assert json.loads(files["manifest.json"])["run_id"] == "example-multi"
