"""Step durations (docs/queue.md, "What a QUEUED run's view explains"): a run or agent step that
ends with a result leaves one row in ``step_durations``, claim to result, under its key; nothing
else does, and no row is ever updated."""

from __future__ import annotations

from app.estimate import duration_key
from tests.support.actors import Answerer, cap
from tests.support.agent import advertise, claimed, done, report
from tests.support.contracts import ask_contract, two_steps
from tests.support.submitter import submit

one_app_per_module = True

BOARD = {"capability": "board", "attrs": {}}


def durations(sql):
    return sql.execute("select key, seconds from step_durations order by id").fetchall()


def test_a_step_ending_with_a_result_records_its_time_since_its_claim_once(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, two_steps("r1"), 201)
    claimed(client, "n1")
    # The claim was 90 s ago: move the database's timestamp rather than wait.
    sql.execute("update steps set started_at = now() - interval '90 s' where run_id = 'r1'")

    done(client, "r1", 1, "n1")

    ((key, seconds),) = durations(sql)
    assert key == duration_key("flash", "run", {"run": ["flash"]}, BOARD)
    assert 90 <= seconds < 100
    # A duplicate of the accepted result is refused and records nothing more.
    assert report(client, "r1", 1, "n1").status_code == 409
    assert len(durations(sql)) == 1


def test_a_failed_step_is_recorded_and_an_answered_ask_is_not(client, sql):
    advertise(client, "n1", cap("board"))
    submit(client, ask_contract("r1"), 201)
    answer = Answerer(client).answer("r1", 1, {"verdict": "approve"})
    assert answer.status_code == 200, answer.get_json()
    assert durations(sql) == []
    claimed(client, "n1")

    done(client, "r1", 2, "n1", error="board did not boot")

    assert [k for k, _ in durations(sql)] == [
        duration_key("flash", "run", {"run": ["flash-image"]}, BOARD)
    ]


def test_the_key_names_the_argv_and_the_role_attributes_not_the_role_name():
    a = duration_key("t", "run", {"run": ["make"]}, {"capability": "board", "attrs": {"soc": "x"}})
    assert a == duration_key(
        "t", "run", {"run": ["make"]}, {"as": "other", "capability": "board", "attrs": {"soc": "x"}}
    )
    assert a != duration_key(
        "t", "run", {"run": ["make", "-j"]}, {"capability": "board", "attrs": {"soc": "x"}}
    )
    assert a != duration_key(
        "t", "run", {"run": ["make"]}, {"capability": "board", "attrs": {"soc": "y"}}
    )
    assert duration_key("t", "agent", {"agent": {"model": "m1"}}, None) != duration_key(
        "t", "agent", {"agent": {"model": "m2"}}, None
    )
