"""Retention (docs/retention.md#retention-pruning-old-runs) through the reaper and the prune
function: what goes (sealed runs and rejected submits old enough, with every row and their Record),
what stays (recent, unsealed and unfinished runs), the bound on each transaction and each pass, and
what a pruned run looks like from outside (404, its id refused, the work ledger without it). Real
PostgreSQL, real Records."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.services.reaper import reap_pass
from app.services.retention import prune, prune_expired
from tests.support.actors import cap
from tests.support.agent import advertise
from tests.support.clock import age
from tests.support.contracts import contract, role
from tests.support.rows import no_rows, rows_of, run_row, scalar, tombstone
from tests.support.scenes import finished_run, rejected_run
from tests.support.submitter import submit

pytestmark = pytest.mark.config({"retention.days": 30})


def far_future() -> datetime:
    return datetime.now(UTC) + timedelta(days=3650)


def test_the_reaper_prunes_old_sealed_and_rejected_runs_and_keeps_the_rest(client, ctx, sql):
    finished_run(client, "old-ok", "n1")
    finished_run(client, "recent-ok", "n2")
    rejected_run(client, "old-rejected")
    rejected_run(client, "recent-rejected")
    advertise(client, "n3", cap("board", serial="n3"))
    submit(client, contract("old-running", role("dut", serial="n3")), 201)
    submit(client, contract("old-queued", role("dut", serial="n3")), 202)
    for run_id in ("old-ok", "old-rejected", "old-running", "old-queued"):
        age(sql, run_id, 31)
    age(sql, "recent-ok", 29)
    age(sql, "recent-rejected", 29)
    assert rows_of(sql, "old-ok") == {
        "runs": 1,
        "steps": 1,
        "run_events": 3,
        "blobs": 1,
        "leases": 0,
    }
    assert ctx.records.is_sealed("old-ok")

    report = reap_pass(ctx)

    assert report.pruned == 2
    for gone in ("old-ok", "old-rejected"):
        assert no_rows(sql, gone), (gone, rows_of(sql, gone))
        assert tombstone(sql, gone) == (False,)
        assert not ctx.records.exists(gone)
    assert not ctx.records.path("old-ok").exists()
    for kept in ("recent-ok", "recent-rejected", "old-running", "old-queued"):
        assert rows_of(sql, kept)["runs"] == 1 and tombstone(sql, kept) is None
    assert ctx.records.is_sealed("recent-ok")
    assert run_row(sql, "old-running")["state"] == "RUNNING"
    assert run_row(sql, "old-queued")["state"] == "QUEUED"
    assert ctx.records.exists("old-running") and ctx.records.exists("old-queued")


def test_a_finished_run_not_sealed_yet_is_kept_until_it_is(client, ctx, sql):
    finished_run(client, "unsealed")
    finished_run(client, "sealed", "n2")
    sql.execute("update runs set sealed_at = null where run_id = 'unsealed'")
    before = far_future()

    report = prune(ctx, before)

    assert report.run_ids == ["sealed"]
    assert rows_of(sql, "unsealed")["runs"] == 1 and ctx.records.exists("unsealed")
    assert no_rows(sql, "sealed")


def test_with_retention_off_the_reaper_prunes_nothing(app, client, ctx, sql, monkeypatch):
    finished_run(client, "ancient")
    age(sql, "ancient", 10_000)
    monkeypatch.setattr(ctx, "config", {**ctx.config, "retention.days": 0})

    report = reap_pass(ctx)

    assert report.pruned == 0
    assert rows_of(sql, "ancient")["runs"] == 1 and ctx.records.is_sealed("ancient")


def test_batches_are_bounded_and_a_pass_leaves_the_rest_for_the_next(client, ctx, sql):
    for i in range(7):
        finished_run(client, f"old-{i}", f"n{i}")
        age(sql, f"old-{i}", 40 + i)  # old-6 is the oldest

    first = prune_expired(ctx, batch_size=3, max_batches=2)

    assert first is not None
    assert first.batches == [3, 3] and first.more and first.runs == 6
    assert first.run_ids == [f"old-{i}" for i in (6, 5, 4, 3, 2, 1)]  # oldest first
    assert first.steps == 6 and first.events == 18 and first.blobs == 6 and first.records == 6
    assert scalar(sql, "select count(*) from runs") == 1

    second = prune_expired(ctx, batch_size=3, max_batches=2)

    assert second is not None
    assert second.batches == [1] and not second.more and second.run_ids == ["old-0"]
    assert scalar(sql, "select count(*) from runs") == 0
    assert scalar(sql, "select count(*) from run_tombstones where not record_pending") == 7


def test_a_pruned_run_is_a_404_everywhere_like_one_that_never_was(client, ctx, sql):
    finished_run(client, "gone")
    paths = [
        "/v1/runs/{}",
        "/v1/runs/{}/events",
        "/v1/runs/{}/record",
        "/v1/runs/{}/ledger",
        "/v1/runs/{}/blob/result.json",
        "/v1/runs/{}/steps/1/log",
    ]
    assert [client.get(p.format("gone")).status_code for p in paths] == [200] * len(paths)
    never = [client.get(p.format("never-was")) for p in paths]
    assert {r.status_code for r in never} == {404}

    assert prune(ctx, far_future()).run_ids == ["gone"]

    pruned = [client.get(p.format("gone")) for p in paths]
    assert [r.status_code for r in pruned] == [404] * len(paths)
    assert [r.get_json()["error"]["code"] for r in pruned] == [404] * len(paths)
    assert client.put("/v1/runs/gone/steps/1/log", data=b"x").status_code == 404
    assert all(r["run_id"] != "gone" for r in client.get("/v1/runs").get_json()["runs"])


def test_the_id_of_a_pruned_run_cannot_be_submitted_again(client, ctx, sql):
    finished_run(client, "once")
    rejected_run(client, "once-rejected")
    prune(ctx, far_future())
    advertise(client, "n1", cap("board", serial="n1"))

    placed = submit(client, contract("once", role("dut", serial="n1")), 409)
    rejected = submit(client, contract("once-rejected", role("dut", "no-such-capability")), 409)

    for resp in (placed, rejected):
        assert resp.get_json() == {"error": {"code": 409, "reason": "run id used by a pruned run"}}
    assert scalar(sql, "select count(*) from runs") == 0
    assert not ctx.records.exists("once")
    assert submit(client, contract("fresh", role("dut", serial="n1")), 201)


def test_a_work_ledger_lists_only_unpruned_runs(client, ctx, sql):
    finished_run(client, "work-1", "n1", work="4711")
    finished_run(client, "work-2", "n2", work="4711")
    finished_run(client, "work-3", "n3", work="4711")
    assert [
        e.get("run_id") for e in client.get("/v1/runs/work-3/ledger").get_json()["entries"]
    ] == [
        "work-1",
        "work-2",
        None,
    ]
    age(sql, "work-1", 31)

    assert reap_pass(ctx).pruned == 1

    entries = client.get("/v1/runs/work-3/ledger").get_json()["entries"]
    assert [e.get("run_id") for e in entries] == ["work-2", None]


def test_a_run_still_being_pruned_reads_as_it_was_and_live_requests_do_not_wait(app, ctx, sql):
    """A batch's transaction is held open (its locks taken, its rows deleted, not committed)
    while other requests run: on a live run, on the fleet and on the very run being pruned."""
    import concurrent.futures

    from tests.support.apps import client_of

    client = client_of(app)
    finished_run(client, "old", "n1")
    age(sql, "old", 31)
    advertise(client, "n2", cap("board", serial="n2"))
    submit(
        client,
        contract(
            "live",
            role("dut", serial="n2"),
            steps=[
                {"id": "a", "uses": "dut", "run": ["a"]},
                {"id": "b", "uses": "dut", "run": ["b"]},
            ],
        ),
        201,
    )

    from app.store import retention as retention_store

    def requests_meanwhile() -> list[int]:
        c = client_of(app)
        out = [c.get("/v1/runs/old").status_code]  # the old rows, as committed
        out.append(
            c.post(
                "/v1/nodes", json={"node_id": "n2", "capabilities": [cap("board", serial="n2")]}
            ).status_code
        )
        step = c.post("/v1/nodes/n2/claim?wait=0")
        out.append(step.status_code)
        out.append(c.put("/v1/runs/live/steps/1/log", data=b"a\n").status_code)
        out.append(
            c.post(
                "/v1/runs/live/steps/1/result", json={"node": "n2", "exit_code": 0, "produced": []}
            ).status_code
        )
        out.append(submit(c, contract("new", role("dut", serial="n2"))).status_code)
        out.append(c.post("/v1/runs/new/cancel").status_code)
        return out

    with concurrent.futures.ThreadPoolExecutor(1) as pool, ctx.db.begin() as s:
        cutoff = datetime.now(UTC) - timedelta(days=30)
        ids = retention_store.lock_prunable(s, cutoff, 100)
        deleted = retention_store.delete_runs(s, ids)
        assert deleted.run_ids == ["old"]
        # While this transaction is open, every request answers (a wait would time out here).
        assert pool.submit(requests_meanwhile).result(timeout=20) == [
            200,
            200,
            200,
            200,
            200,
            202,
            200,
        ]
        # A second batch meanwhile skips the locked run rather than waiting for it.
        with ctx.db.begin() as other:
            assert retention_store.lock_prunable(other, cutoff, 100) == []

    assert client.get("/v1/runs/old").status_code == 404
    assert client.get("/v1/runs/live").get_json()["steps"][0]["state"] == "DONE"


@pytest.mark.parametrize("value", ["-1", "soon", "1.5", "true"])
def test_retention_days_must_be_a_whole_number_of_days_not_negative(value):
    from app.config import load_config
    from app.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(env={"MEDIATOR_RETENTION_DAYS": value})
    assert str(err.value).startswith("retention.days") and "\n" not in str(err.value)


def test_retention_is_off_by_default_and_set_in_days():
    from app.config import load_config

    assert load_config(env={})["retention.days"] == 0
    assert load_config(env={"MEDIATOR_RETENTION_DAYS": "90"})["retention.days"] == 90


def test_the_batch_query_finds_old_runs_through_the_retention_index(ctx, sql):
    """The query's predicate is the partial index's, so a pass reads the oldest prunable runs
    without reading the rest of a long history (a pass does not grow with it:
    docs/design.md#targets)."""
    from sqlalchemy import text

    from app.store import retention as retention_store

    # Sixty days of history, a run every four minutes: most sealed, a few rejected, some still running.
    sql.execute(
        "insert into runs (run_id, state, contract, requires, requires_key, created_at,"
        " ended_at, sealed_at, reject)"
        " select 'h-' || g, case when g % 50 = 0 then 'RUNNING' else 'SUCCEEDED' end, '{}', '[]',"
        " 'k', now() - g * interval '4 minutes',"
        " case when g % 50 = 0 then null else now() - g * interval '4 minutes' end,"
        " case when g % 50 = 0 or g % 7 = 0 then null else now() end,"
        " case when g % 7 = 0 then '{\"Code\": 422}'::jsonb end"
        " from generate_series(1, 60 * 24 * 60 / 4) g"
    )
    sql.execute("analyze runs")
    cutoff = datetime.now(UTC) - timedelta(days=30)
    with ctx.db.read() as s:
        compiled = retention_store.prunable_query(cutoff, 100).compile(
            s.get_bind(), compile_kwargs={"literal_binds": True}
        )
        plan = "\n".join(s.execute(text(f"EXPLAIN {compiled}")).scalars())
    assert "Index Scan using ix_runs_prunable on runs" in plan, plan
