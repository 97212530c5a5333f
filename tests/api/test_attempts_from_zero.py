"""Attempts count from 0 (docs/contract.md#loop): a first attempt is 0 and left out of the claim and
the run view, a reset makes it 1, 2, …, and ``loop.max`` / ``max_attempts`` N allows attempts 0 …
N−1. Runs created before the migration that changed the numbering keep theirs: their rows are not
renumbered and they are allowed as many attempts as before."""

from __future__ import annotations

import psycopg
from alembic import command

from app.config import to_libpq_url
from app.migrate import alembic_config
from tests.support.actors import cap
from tests.support.agent import advertise, claimed, done, nothing_to_claim
from tests.support.contracts import build_then_test
from tests.support.rows import attempts, one
from tests.support.submitter import state_of, submit


def test_a_first_attempt_is_0_and_left_out_of_the_claim_and_the_run_view(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, build_then_test("r1"), 201)

    step = claimed(client, "n1")

    assert "attempt" not in step
    view = client.get("/v1/runs/r1").get_json()
    assert all("attempt" not in st for st in view["steps"])
    assert attempts(sql, "r1") == {"build": ("CLAIMED", 0), "test": ("PENDING", 0)}


def test_a_loop_of_max_3_runs_attempts_0_1_2_and_then_stops(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, build_then_test("r1"), 201)
    seen = []
    for _ in range(3):
        build = claimed(client, "n1")
        done(client, "r1", build["seq"], "n1")
        test = claimed(client, "n1")
        seen.append(test.get("attempt", 0))
        done(client, "r1", test["seq"], "n1", exit_code=1)

    assert seen == [0, 1, 2]
    assert nothing_to_claim(client, "n1")  # attempt 2 was the last of 3
    assert state_of(client, "r1") == "SUCCEEDED"  # no success_when: nothing FAILED


def test_a_run_from_before_the_renumbering_keeps_its_attempts_and_its_limit(client, sql):
    """A run created before the migration counts from 1 (``attempt_base`` 1): it still gets its
    three attempts of a ``loop.max`` of 3, numbered 1, 2, 3."""
    advertise(client, "n1", cap("board"))
    submit(client, build_then_test("r1"), 201)
    sql.execute("UPDATE runs SET attempt_base = 1 WHERE run_id = 'r1'")
    sql.execute("UPDATE steps SET attempt = 1 WHERE run_id = 'r1'")
    seen = []
    for _ in range(3):
        build = claimed(client, "n1")
        done(client, "r1", build["seq"], "n1")
        test = claimed(client, "n1")
        seen.append(test.get("attempt", 0))
        done(client, "r1", test["seq"], "n1", exit_code=1)

    assert seen == [1, 2, 3]
    assert nothing_to_claim(client, "n1")
    assert attempts(sql, "r1") == {"build": ("DONE", 3), "test": ("DONE", 3)}


def test_the_migration_keeps_the_numbering_of_existing_runs_and_counts_new_ones_from_0(
    fresh_db_url,
):
    cfg = alembic_config(fresh_db_url)
    command.downgrade(cfg, "0001")
    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (run_id, state, contract, requires, requires_key)"
            " VALUES ('old', 'RUNNING', '{}', '[]', 'k')"
        )
        conn.execute(
            "INSERT INTO steps (run_id, seq, step_id, kind, spec) VALUES ('old', 1, 's', 'run', '{}')"
        )
    command.upgrade(cfg, "head")
    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (run_id, state, contract, requires, requires_key)"
            " VALUES ('new', 'RUNNING', '{}', '[]', 'k')"
        )
        conn.execute(
            "INSERT INTO steps (run_id, seq, step_id, kind, spec) VALUES ('new', 1, 's', 'run', '{}')"
        )
        got = {
            run_id: tuple(
                one(
                    conn,
                    "SELECT attempt_base, attempt FROM runs JOIN steps USING (run_id)"
                    " WHERE run_id = %s",
                    run_id,
                ).values()
            )
            for run_id in ("old", "new")
        }
    assert got == {"old": (1, 1), "new": (0, 0)}
