"""``mediator prune --before DATE [--dry-run]`` run as a real process on the test's database and
Record store: what it prints, what it deletes, bad dates, and a crash between the commit of a batch
and the deletion of its Records (``MEDIATOR_FAULT=prune.after_commit``), which the next pass of the
reaper cleans up."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from app.services.reaper import reap_pass
from tests.support.apps import clean_env, mediator_cli
from tests.support.rows import no_rows, rows_of, scalar, tombstone
from tests.support.scenes import finished_run, rejected_run


def mediator(ctx: Any, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = clean_env(
        MEDIATOR_DATABASE_URL=ctx.config["database.url"],
        MEDIATOR_RECORDS_ROOT=ctx.config["records.root"],
        MEDIATOR_LOG_FORMAT="console",
        MEDIATOR_LOG_LEVEL="error",
        **env,
    )
    return mediator_cli(*args, env=clean)


@pytest.fixture
def history(client: Any, sql: Any) -> None:
    """old-1 and old-2 ended in 2020 (old-2 a rejected submit), new-1 today."""
    finished_run(client, "old-1", "n1")
    rejected_run(client, "old-2")
    finished_run(client, "new-1", "n2")
    for run_id in ("old-1", "old-2"):
        sql.execute(
            "update runs set created_at = '2020-06-01T12:00:00Z', ended_at = '2020-06-01T12:00:00Z'"
            " where run_id = %s",
            (run_id,),
        )


def test_a_dry_run_lists_what_would_go_and_deletes_nothing(ctx, sql, history):
    before = {r: rows_of(sql, r) for r in ("old-1", "old-2", "new-1")}

    proc = mediator(ctx, "prune", "--before", "2021-01-01", "--dry-run")

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "would prune 2 runs that ended before 2021-01-01T00:00:00Z: 1 steps, 4 events, 1 blobs,"
        " 0 leases, 1 Records",
        "old-1",
        "old-2",
    ]
    assert {r: rows_of(sql, r) for r in before} == before
    assert ctx.records.is_sealed("old-1")
    assert scalar(sql, "select count(*) from run_tombstones") == 0


def test_prune_deletes_what_ended_before_the_date_and_says_how_much(ctx, sql, history):
    proc = mediator(ctx, "prune", "--before", "2020-06-01T12:00:01Z")

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "pruned 2 runs that ended before 2020-06-01T12:00:01Z: 1 steps, 4 events, 1 blobs,"
        " 0 leases, 1 Records"
    ]
    assert no_rows(sql, "old-1") and no_rows(sql, "old-2")
    assert tombstone(sql, "old-1") == (False,) and tombstone(sql, "old-2") == (False,)
    assert not ctx.records.exists("old-1")
    assert rows_of(sql, "new-1")["runs"] == 1 and ctx.records.is_sealed("new-1")


def test_prune_with_v_lists_the_runs_and_a_time_before_everything_prunes_nothing(ctx, sql, history):
    nothing = mediator(ctx, "prune", "--before", "2020-06-01T12:00:00+00:00", "-v")
    assert nothing.returncode == 0, nothing.stderr
    assert nothing.stdout.startswith("pruned 0 runs that ended before 2020-06-01T12:00:00Z")
    assert scalar(sql, "select count(*) from runs") == 3

    proc = mediator(ctx, "prune", "--before", "2020-06-02T00:00:00+02:00", "-v")

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1:] == ["old-1", "old-2"]
    assert scalar(sql, "select count(*) from runs") == 1


@pytest.mark.parametrize(
    "bad", ["yesterday", "2021-13-01", "2021-01-01T00:00:00", "", "2021-02-30", "01/02/2021"]
)
def test_a_bad_date_is_one_line_and_exit_2_and_deletes_nothing(ctx, sql, history, bad):
    proc = mediator(ctx, "prune", "--before", bad)

    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "mediator prune: --before must be an RFC 3339 time or a date YYYY-MM-DD, got " + repr(bad)
    ]
    assert scalar(sql, "select count(*) from runs") == 3


def test_a_crash_after_the_commit_leaves_records_the_next_pass_deletes(ctx, sql, history):
    proc = mediator(ctx, "prune", "--before", "2021-01-01", MEDIATOR_FAULT="prune.after_commit")

    assert proc.returncode == -9  # killed between the commit and the Records' deletion
    assert no_rows(sql, "old-1") and no_rows(sql, "old-2")
    assert tombstone(sql, "old-1") == (True,)  # its Record is still to be deleted
    assert ctx.records.is_sealed("old-1")  # unreachable meanwhile: every route says 404

    reap_pass(ctx)  # retention is off: the pass only sweeps what a prune left

    assert not ctx.records.exists("old-1")
    assert tombstone(sql, "old-1") == (False,) and tombstone(sql, "old-2") == (False,)
    assert rows_of(sql, "new-1")["runs"] == 1 and ctx.records.is_sealed("new-1")


def test_a_crash_before_the_commit_deletes_nothing(ctx, sql, history):
    proc = mediator(ctx, "prune", "--before", "2021-01-01", MEDIATOR_FAULT="prune.before_commit")

    assert proc.returncode == -9
    assert rows_of(sql, "old-1")["runs"] == 1 and ctx.records.is_sealed("old-1")
    assert scalar(sql, "select count(*) from run_tombstones") == 0
