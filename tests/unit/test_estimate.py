"""The expected start of a QUEUED run, the pure simulation (docs/queue.md, "What a QUEUED run's
view explains"): holders' remaining time, runs ahead taking nodes first, and each basis."""

from __future__ import annotations

from app.estimate import (
    HISTORY,
    NO_HISTORY,
    NOW,
    UNAVAILABLE,
    WAITS_FOR_PERSON,
    Ahead,
    Expected,
    Need,
    PlannedStep,
    Span,
    expected_start,
    remaining,
)

MEDIANS = {"flash": 60.0, "boot": 100.0}


def step(seq, key="flash", *, kind="run", state="PENDING", ran=0.0, needs=(), uses="dut"):
    return PlannedStep(seq, kind, key, tuple(needs), uses, state, ran)


def test_a_holder_remains_for_its_claimed_steps_median_less_what_it_ran_plus_the_rest():
    steps = [step(1, "flash", state="CLAIMED", ran=20), step(2, "boot", needs=[1])]
    assert remaining(steps, MEDIANS) == Span(40 + 100)


def test_a_step_past_its_median_counts_as_ending_now():
    steps = [step(1, "flash", state="CLAIMED", ran=500), step(2, "boot", needs=[1])]
    assert remaining(steps, MEDIANS) == Span(100)


def test_steps_done_or_skipped_count_nothing_and_acquire_steps_take_no_time():
    steps = [
        step(1, "boot", state="DONE"),
        step(2, "boot", state="SKIPPED"),
        step(3, None, kind="acquire", uses=None),
        step(4, "flash", needs=[3]),
    ]
    assert remaining(steps, MEDIANS) == Span(60)


def test_steps_on_two_nodes_without_needs_run_side_by_side():
    steps = [step(1, "flash", uses="a"), step(2, "boot", uses="b")]
    assert remaining(steps, MEDIANS) == Span(100)


def test_an_ask_step_makes_it_wait_for_a_person_and_a_step_without_history_no_history():
    assert remaining([step(1, None, kind="ask", uses=None)], MEDIANS).basis == WAITS_FOR_PERSON
    assert remaining([step(1, "never-ran")], MEDIANS) == Span(None, NO_HISTORY)
    both = [step(1, "never-ran"), step(2, None, kind="ask", uses=None)]
    assert remaining(both, MEDIANS) == Span(None, WAITS_FOR_PERSON)


def test_the_run_starts_when_its_earliest_free_candidate_frees():
    need = [Need(1, frozenset({"n1", "n2"}))]
    free = {"n1": Span(300), "n2": Span(120)}
    assert expected_start(need, free, []) == Expected(120, HISTORY)


def test_a_free_candidate_means_now():
    assert expected_start([Need(1, frozenset({"n1"}))], {"n1": NOW}, []) == Expected(0, HISTORY)


def test_a_role_of_two_waits_for_the_second_node():
    need = [Need(2, frozenset({"n1", "n2", "n3"}))]
    free = {"n1": Span(300), "n2": Span(120), "n3": Span(500)}
    assert expected_start(need, free, []) == Expected(300, HISTORY)


def test_runs_ahead_take_the_earliest_free_nodes_first_for_their_duration():
    need = [Need(1, frozenset({"n1", "n2"}))]
    free = {"n1": Span(100), "n2": Span(200)}
    ahead = [Ahead((Need(1, frozenset({"n1", "n2"})),), Span(500))]
    # The run ahead takes n1 at 100 until 600; this run gets n2 at 200.
    assert expected_start(need, free, ahead) == Expected(200, HISTORY)
    two_ahead = ahead * 2
    # The second takes n2 at 200 until 700; this run waits for n1 at 600.
    assert expected_start(need, free, two_ahead) == Expected(600, HISTORY)


def test_a_run_ahead_that_shares_no_node_it_fits_takes_nothing_from_it():
    need = [Need(1, frozenset({"n1"}))]
    ahead = [Ahead((Need(1, frozenset({"n2"})),), Span(500))]
    assert expected_start(need, {"n1": Span(50), "n2": NOW}, ahead) == Expected(50, HISTORY)


def test_an_unknown_node_time_is_the_basis_only_when_the_run_needs_that_node():
    need = [Need(1, frozenset({"n1", "n2"}))]
    free = {"n1": Span(None, WAITS_FOR_PERSON), "n2": Span(30)}
    assert expected_start(need, free, []) == Expected(30, HISTORY)
    free = {"n1": Span(None, WAITS_FOR_PERSON), "n2": Span(None, NO_HISTORY)}
    assert expected_start(need, free, []) == Expected(None, WAITS_FOR_PERSON)
    ahead = [Ahead((Need(1, frozenset({"n1"})),), Span(None, NO_HISTORY))]
    assert expected_start([Need(1, frozenset({"n1"}))], {"n1": NOW}, ahead) == Expected(
        None, NO_HISTORY
    )


def test_a_role_whose_candidates_are_all_drained_is_unavailable():
    # Drained nodes are left out of ``free``: they will never be given out.
    need = [Need(1, frozenset({"n1"})), Need(1, frozenset({"n2"}))]
    assert expected_start(need, {"n1": NOW}, []) == Expected(None, UNAVAILABLE)
