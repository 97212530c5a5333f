"""The reaper's pass (docs/queue.md#the-reaper), called directly. Time passes only in the database:
leases, deadlines, queue ages and the last pass are moved back with SQL."""

from __future__ import annotations

from app.services.reaper import reap_pass
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.clock import LEASE_EXPIRED, expire_leases
from tests.support.contracts import ask_contract, contract, role
from tests.support.rows import count_events, leases, run_row, scalar, step_outcomes
from tests.support.scenes import running_on_n1_and_one_queued
from tests.support.submitter import submit


def sealed(ctx, sql, run_id: str) -> bool:
    return (
        run_row(sql, run_id)["sealed_at"] is not None
        and (ctx.records.path(run_id) / "SHA256SUMS").is_file()
        and ctx.records.is_sealed(run_id)
    )


# ---------------------------------------------------------------- 2. expired leases


def test_an_expired_lease_fails_its_run_frees_the_node_and_promotes_the_queued_run(
    client, ctx, sql
):
    running_on_n1_and_one_queued(client)
    expire_leases(sql, "run-a")

    report = reap_pass(ctx)

    assert not report.skipped and report.lease_expired == ["run-a"] and report.woke
    a = run_row(sql, "run-a")
    assert a["state"] == "FAILED" and a["ended_at"] is not None
    assert a["reject"] == {"Code": 410, "Reason": LEASE_EXPIRED}
    assert step_outcomes(sql, "run-a") == [(1, "FAILED", LEASE_EXPIRED)]
    assert count_events(sql, "run-a", "lease expired") == 1
    assert run_row(sql, "run-b")["state"] == "RUNNING"
    assert leases(sql) == [("n1", "run-b")]
    assert sealed(ctx, sql, "run-a")


def test_a_lease_not_yet_expired_is_left_alone(client, ctx, sql):
    running_on_n1_and_one_queued(client)

    report = reap_pass(ctx)

    assert report.lease_expired == [] and not report.freed and not report.woke
    assert run_row(sql, "run-a")["state"] == "RUNNING"
    assert run_row(sql, "run-b")["state"] == "QUEUED"
    assert leases(sql) == [("n1", "run-a")]


def test_a_run_with_an_asked_step_keeps_its_expired_lease(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    submit(client, ask_contract("run-a"), 201)
    assert step_outcomes(sql, "run-a") == [(1, "ASKED", None), (2, "PENDING", None)]
    expire_leases(sql, "run-a", "1 hour")

    report = reap_pass(ctx)

    assert report.lease_expired == [] and not report.woke
    assert run_row(sql, "run-a")["state"] == "RUNNING"
    assert step_outcomes(sql, "run-a") == [(1, "ASKED", None), (2, "PENDING", None)]
    assert leases(sql) == [("n1", "run-a")]
    assert count_events(sql, "run-a", "lease expired") == 0


# ---------------------------------------------------------------- 1. ask deadlines


def test_an_ask_past_its_deadline_fails_settles_its_run_and_wakes_the_queue(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    submit(client, ask_contract("run-a", timeout={"after": "4h", "then": "fail"}), 201)
    submit(client, contract("run-b"), 202)
    assert scalar(
        sql,
        "select ask_deadline > now() + interval '3 h' from steps where run_id = 'run-a' and seq = 1",
    )
    sql.execute("update steps set ask_deadline = now() - interval '1 s' where run_id = 'run-a'")

    report = reap_pass(ctx)

    assert report.asks_expired == 1 and report.woke
    a = run_row(sql, "run-a")
    assert a["state"] == "FAILED" and a["ended_at"] is not None
    assert step_outcomes(sql, "run-a")[0] == (1, "FAILED", "ask deadline passed")
    assert [s[1] for s in step_outcomes(sql, "run-a")] == ["FAILED", "FAILED"]
    assert run_row(sql, "run-b")["state"] == "RUNNING"
    assert leases(sql) == [("n1", "run-b")]
    assert sealed(ctx, sql, "run-a")


def test_an_ask_before_its_deadline_stays_open(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    submit(client, ask_contract("run-a", timeout={"after": "4h", "then": "fail"}), 201)

    report = reap_pass(ctx)

    assert report.asks_expired == 0
    assert step_outcomes(sql, "run-a")[0] == (1, "ASKED", None)
    assert run_row(sql, "run-a")["state"] == "RUNNING"


# ---------------------------------------------------------------- 3, 4. leftovers of finished runs


def test_open_steps_of_a_finished_run_become_failed(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("run-a"), 201)
    # A run that ended without its steps following (a crash between two statements).
    sql.execute("delete from leases where run_id = 'run-a'")
    sql.execute("update runs set state = 'FAILED', ended_at = now() where run_id = 'run-a'")
    assert step_outcomes(sql, "run-a") == [(1, "PENDING", None)]

    report = reap_pass(ctx)

    assert report.steps_failed == 1
    assert step_outcomes(sql, "run-a") == [(1, "FAILED", "run already FAILED")]
    assert scalar(sql, "select ended_at is not null from steps where run_id = 'run-a'")
    assert run_row(sql, "run-a")["state"] == "FAILED"


def test_a_lease_of_a_finished_run_is_deleted_and_frees_a_queued_run(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("run-a"), 201)
    assert client.post("/v1/runs/run-a/cancel").status_code == 200
    # The run ended while the Mediator was down: its lease is still there.
    sql.execute(
        "insert into leases (node_id, run_id, role, capability, not_after, nonce)"
        " values ('n1', 'run-a', 'dut', 'board', now() + interval '1 hour', repeat('0', 32))"
    )
    assert submit(client, contract("run-b"), 202).get_json()["state"] == "QUEUED"

    report = reap_pass(ctx)

    assert report.leases_deleted == 1 and report.woke
    assert report.lease_expired == []
    assert run_row(sql, "run-b")["state"] == "RUNNING"
    assert leases(sql) == [("n1", "run-b")]


# ---------------------------------------------------------------- 5. verdicts, queue timeout, seal


def _left_in_verifying(client, sql, exit_code: int) -> None:
    advertise(client, "n1", cap("board"))
    doc = contract("run-a", success_when=[{"step": "use-dut", "exit_code": 0}])
    submit(client, doc, 201)
    # A crash after VERIFYING committed and before the verdict
    # (docs/design.md#settle-and-the-verdict).
    sql.execute(
        "update steps set state = 'DONE', exit_code = %s, started_at = now(), ended_at = now()"
        " where run_id = 'run-a'",
        (exit_code,),
    )
    sql.execute("update runs set state = 'VERIFYING' where run_id = 'run-a'")


def test_a_run_left_in_verifying_is_settled_succeeded_and_sealed(client, ctx, sql):
    _left_in_verifying(client, sql, exit_code=0)
    submit(client, contract("run-b"), 202)

    report = reap_pass(ctx)

    assert report.verdicts == 1
    a = run_row(sql, "run-a")
    assert a["state"] == "SUCCEEDED" and a["ended_at"] is not None
    assert a["verdict"]["state"] == "SUCCEEDED"
    assert [(c["what"], c["ok"]) for c in a["verdict"]["checks"]] == [("exit_code", True)]
    assert sealed(ctx, sql, "run-a")
    # Its lease went with the verdict, and the queue was woken for it.
    assert report.woke
    assert run_row(sql, "run-b")["state"] == "RUNNING"
    assert leases(sql) == [("n1", "run-b")]


def test_a_run_left_in_verifying_is_settled_failed_by_its_verdict(client, ctx, sql):
    _left_in_verifying(client, sql, exit_code=3)

    report = reap_pass(ctx)

    assert report.verdicts == 1
    a = run_row(sql, "run-a")
    assert a["state"] == "FAILED"
    assert [(c["what"], c["got"], c["ok"]) for c in a["verdict"]["checks"]] == [
        ("exit_code", 3, False)
    ]
    assert leases(sql) == []
    assert sealed(ctx, sql, "run-a")


def test_a_queued_run_past_its_queue_timeout_fails_and_one_without_never_expires(client, ctx, sql):
    running_on_n1_and_one_queued(client, queued=contract("run-b", queue={"timeout": "30m"}))
    submit(client, contract("run-c"), 202)
    sql.execute("update runs set created_at = now() - interval '31 min' where run_id = 'run-b'")
    sql.execute("update runs set created_at = now() - interval '30 days' where run_id = 'run-c'")

    report = reap_pass(ctx)

    assert report.queue_timeouts == ["run-b"]
    b = run_row(sql, "run-b")
    assert b["state"] == "FAILED" and b["ended_at"] is not None
    assert [c["note"] for c in b["verdict"]["checks"]] == ["queue timeout"]
    assert step_outcomes(sql, "run-b") == [(1, "FAILED", "queue timeout")]
    assert sealed(ctx, sql, "run-b")
    assert run_row(sql, "run-c")["state"] == "QUEUED"
    assert run_row(sql, "run-a")["state"] == "RUNNING"


def test_a_queued_run_within_its_queue_timeout_stays_queued(client, ctx, sql):
    running_on_n1_and_one_queued(client, queued=contract("run-b", queue={"timeout": "30m"}))
    sql.execute("update runs set created_at = now() - interval '29 min' where run_id = 'run-b'")

    report = reap_pass(ctx)

    assert report.queue_timeouts == []
    assert run_row(sql, "run-b")["state"] == "QUEUED"


def test_a_finished_run_whose_record_was_never_sealed_is_sealed_by_the_pass(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("run-a"), 201)
    # The final commit happened, then the process died before sealing (docs/design.md#records).
    sql.execute("delete from leases where run_id = 'run-a'")
    sql.execute("update steps set state = 'DONE', exit_code = 0, ended_at = now()")
    sql.execute("update runs set state = 'SUCCEEDED', ended_at = now() where run_id = 'run-a'")
    assert not (ctx.records.path("run-a") / "SHA256SUMS").exists()
    assert client.get("/v1/runs/run-a/record").status_code == 409

    report = reap_pass(ctx)

    assert report.sealed == 1
    assert sealed(ctx, sql, "run-a")
    assert client.get("/v1/runs/run-a/record").status_code == 200
    assert reap_pass(ctx).sealed == 0  # sealing is done once


def test_a_rejected_submit_is_never_sealed(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("run-x", role("dut", soc="nope")), 422)

    report = reap_pass(ctx)

    assert report.sealed == 0
    assert run_row(sql, "run-x")["sealed_at"] is None


# ---------------------------------------------------------------- outage grace


def test_after_an_outage_leases_are_extended_and_a_node_that_re_advertises_loses_nothing(
    client, ctx, sql
):
    advertise(client, "n1", cap("board"))
    submit(client, contract("run-a"), 201)
    # The Mediator was down for an hour (window: 60 s x 3); the lease expired meanwhile.
    sql.execute("insert into reaper_state (id, last_pass_at) values (1, now() - interval '1 hour')")
    expire_leases(sql, "run-a", "10 min")

    first = reap_pass(ctx)

    assert first.extended == 1 and first.lease_expired == [] and not first.woke
    assert run_row(sql, "run-a")["state"] == "RUNNING"
    assert scalar(sql, "select not_after > now() from leases where run_id = 'run-a'")
    assert scalar(sql, "select last_pass_at > now() - interval '1 min' from reaper_state")

    reply = advertise(client, "n1", cap("board"))  # the node is back and renews
    assert [lease["run_id"] for lease in reply["leases"]] == ["run-a"]
    second = reap_pass(ctx)

    assert second.extended == 0 and second.lease_expired == []
    assert run_row(sql, "run-a")["state"] == "RUNNING"
    assert step_outcomes(sql, "run-a") == [(1, "PENDING", None)]
    assert count_events(sql, "run-a", "lease expired") == 0


def test_without_an_outage_the_same_expired_lease_fails_the_run(client, ctx, sql):
    advertise(client, "n1", cap("board"))
    submit(client, contract("run-a"), 201)
    sql.execute("insert into reaper_state (id, last_pass_at) values (1, now() - interval '10 s')")
    expire_leases(sql, "run-a", "10 min")

    report = reap_pass(ctx)

    assert report.extended == 0 and report.lease_expired == ["run-a"]
    assert run_row(sql, "run-a")["reject"] == {"Code": 410, "Reason": LEASE_EXPIRED}
