"""The expected start of a QUEUED run, the pure simulation (docs/queue.md, "What a QUEUED run's
view explains"): holders' remaining time, runs ahead taking nodes first, and each basis; with
teams (docs/teams.md), the order moving as teams take nodes and other teams asking again."""

from __future__ import annotations

from app.estimate import (
    HISTORY,
    NO_HISTORY,
    NOW,
    TOO_FAR_BACK,
    UNAVAILABLE,
    WAITS_FOR_PERSON,
    Ahead,
    Expected,
    FairShare,
    Need,
    PlannedStep,
    Span,
    TeamShare,
    expected_start,
    expected_start_shared,
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


# ------------------------------------------------------------------ with teams

BOARDS = frozenset({"b1", "b2"})


def fair(**teams):
    """Teams by name -> (share, usage, held); h = 10 s, usage's half-life long enough not to
    matter within these few minutes."""
    return FairShare(
        {n: TeamShare(share, usage, held) for n, (share, usage, held) in teams.items()},
        running_charge=10.0,
        half_life=1e9,
    )


def one_board(team, takes, priority=0):
    return Ahead((Need(1, BOARDS),), Span(takes), team, priority)


def shared(team, free, held_by, ahead, typical, teams, priority=0):
    return expected_start_shared(
        [Need(1, BOARDS)], team, priority, free, held_by, ahead, typical, teams, max_placed=100
    )


def test_with_one_team_the_shared_estimate_is_the_plain_one():
    free = {"b1": Span(30), "b2": Span(50)}
    ahead = [one_board("kernel", 100), one_board("kernel", 100)]
    teams = fair(kernel=(1.0, 0.0, 2))
    held_by = {"b1": "kernel", "b2": "kernel"}
    plain = expected_start([Need(1, BOARDS)], free, ahead)
    assert shared("kernel", free, held_by, ahead, {}, teams) == plain == Expected(130, HISTORY)


def test_another_team_using_its_share_asks_again_and_takes_a_board_first_while_ranked_first():
    # kernel's b1 frees at 30, qa's b2 at 50; b3's holder has no recorded duration. Without qa
    # asking again, this kernel run takes b1 at 30. qa asks again for a run like the one it holds
    # (up to its share of the three boards, two): at 30 it ranks first (factor 0.5 / (70 + 1·10)
    # against kernel's 0.5 / 90) and takes b1; at 50, charged for holding two boards, it ranks
    # after kernel, whose run takes b2.
    free = {"b1": Span(30), "b2": Span(50), "b3": Span(None, NO_HISTORY)}
    held_by = {"b1": "kernel", "b2": "qa", "b3": "release"}
    teams = fair(kernel=(0.5, 60.0, 1), qa=(0.5, 40.0, 1))
    mine = [Need(1, frozenset(free))]
    got = expected_start_shared(mine, "kernel", 0, free, held_by, [], {}, teams, max_placed=100)
    assert got == Expected(30, HISTORY)
    typical = {"qa": Ahead((Need(1, frozenset(free)),), Span(100), "qa")}
    got = expected_start_shared(
        mine, "kernel", 0, free, held_by, [], typical, teams, max_placed=100
    )
    assert got == Expected(50, HISTORY)


def test_a_team_asks_again_only_up_to_its_share_of_the_nodes():
    # The same, with two boards: qa's share of them is one, which it holds until 50; b1 is
    # kernel's run's at 30.
    free = {"b1": Span(30), "b2": Span(50)}
    held_by = {"b1": "kernel", "b2": "qa"}
    teams = fair(kernel=(0.5, 60.0, 1), qa=(0.5, 40.0, 1))
    typical = {"qa": one_board("qa", 100)}
    assert shared("kernel", free, held_by, [], typical, teams) == Expected(30, HISTORY)


def test_a_team_that_takes_boards_drops_in_the_order_as_the_scan_places():
    # release ranks first now (nothing spent) with two runs ahead of this one. Its first takes
    # b1 at 0 and, charged R·h, release ranks after kernel: kernel's run takes b2 when it frees
    # at 40, before release's second run.
    free = {"b1": NOW, "b2": Span(40)}
    held_by = {"b2": "kernel"}
    ahead = [one_board("release", 100), one_board("release", 100)]
    teams = fair(kernel=(0.5, 0.0, 1), release=(0.4, 0.0, 0))
    plain = expected_start([Need(1, BOARDS)], free, ahead)
    assert plain == Expected(100, HISTORY)  # queue order only: both release runs first
    assert shared("kernel", free, held_by, ahead, {}, teams) == Expected(40, HISTORY)


def test_higher_priority_runs_come_before_any_teams_share():
    free = {"b1": Span(10), "b2": Span(20)}
    held_by = {"b1": "qa", "b2": "qa"}
    ahead = [one_board("qa", 100, priority=5), one_board("qa", 100, priority=5)]
    teams = fair(kernel=(0.5, 0.0, 0), qa=(0.5, 9999.0, 2))
    assert shared("kernel", free, held_by, ahead, {}, teams) == Expected(110, HISTORY)


def test_a_team_asking_again_without_a_recorded_duration_is_left_out():
    free = {"b1": NOW, "b2": Span(50)}
    held_by = {"b2": "qa"}
    ahead = [one_board("kernel", 100)]
    teams = fair(kernel=(0.5, 1000.0, 0), qa=(0.5, 10.0, 1))
    typical = {"qa": Ahead((Need(1, BOARDS),), Span(None, NO_HISTORY), "qa")}
    assert shared("kernel", free, held_by, ahead, typical, teams) == Expected(50, HISTORY)


def test_boards_that_never_free_by_history_leave_the_shared_estimate_unknown_with_their_reason():
    free = {"b1": Span(None, WAITS_FOR_PERSON), "b2": Span(None, NO_HISTORY)}
    held_by = {"b1": "qa", "b2": "qa"}
    teams = fair(kernel=(0.5, 0.0, 0), qa=(0.5, 0.0, 2))
    assert shared("kernel", free, held_by, [], {}, teams) == Expected(None, WAITS_FOR_PERSON)
    assert shared("kernel", {}, {}, [], {}, teams) == Expected(None, UNAVAILABLE)


def test_more_placements_than_the_bound_before_this_run_is_too_far_back():
    # qa is far below its share and keeps asking for one-second runs: kernel's run would wait
    # for more placements than the bound allows.
    free = {"b1": NOW}
    teams = fair(kernel=(0.1, 1e9, 0), qa=(0.9, 0.0, 0))
    typical = {"qa": Ahead((Need(1, frozenset({"b1"})),), Span(1), "qa")}
    got = expected_start_shared(
        [Need(1, frozenset({"b1"}))], "kernel", 0, free, {}, [], typical, teams, max_placed=20
    )
    assert got == Expected(None, TOO_FAR_BACK)
