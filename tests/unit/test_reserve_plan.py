"""The reservation step's plan (pure, docs/design.md#priorities-and-reservations): keep and add, a
holder keeping the nodes that still fit, and takeover of lower-priority reservations."""

from __future__ import annotations

from app.contract.types import Role
from app.match import Advert, Capability
from app.reserve import Reserving, plan_reservations


def board(node: str, **attrs: str) -> Advert:
    return Advert(node, (Capability("board", attrs),))


BOARDS = [board(f"b{i}") for i in range(1, 5)]


def run(run_id: str, count: int = 1, priority: int = 0, **attrs: str) -> Reserving:
    return Reserving(run_id, f"{count}:{attrs}", (Role("duts", "board", count, attrs),), priority)


def test_a_holder_whose_node_left_keeps_the_others_and_fills_only_the_vacant_place():
    low = run("low", count=2)
    plan = plan_reservations(
        {"b1": "low", "b2": "low"}, {"low": low}, [low], [BOARDS[0], *BOARDS[2:]], (), 0
    )
    assert plan == {"b1": "low", "b3": "low"}


def test_a_holder_whose_node_drains_keeps_the_other():
    low = run("low", count=2)
    plan = plan_reservations({"b1": "low", "b2": "low"}, {"low": low}, [low], BOARDS, {"b1"}, 0)
    assert plan == {"b2": "low", "b3": "low"}


def test_a_holder_that_cannot_be_filled_even_as_if_all_were_free_releases_all_its_nodes():
    low = run("low", count=2)
    plan = plan_reservations({"b1": "low", "b2": "low"}, {"low": low}, [low], BOARDS[:1], (), 0)
    assert plan == {}


def test_a_higher_priority_run_takes_over_the_reserved_nodes_it_needs():
    low = run("low", count=2)
    top = run("top", count=4, priority=10)
    plan = plan_reservations({"b1": "low", "b2": "low"}, {"low": low}, [top, low], BOARDS, (), 0)
    assert plan == {n: "top" for n in ("b1", "b2", "b3", "b4")}


def test_a_takeover_prefers_unreserved_nodes_and_takes_only_what_it_needs():
    low = run("low", count=2)
    top = run("top", count=3, priority=10)
    plan = plan_reservations({"b1": "low", "b2": "low"}, {"low": low}, [top, low], BOARDS, (), 0)
    assert plan == {"b1": "top", "b2": "low", "b3": "top", "b4": "top"}


def test_among_equal_priorities_the_earlier_reservation_stands():
    first = run("first", count=2, priority=5)
    later = run("later", count=4, priority=5)
    stored = {"b1": "first", "b2": "first"}
    plan = plan_reservations(stored, {"first": first}, [first, later], BOARDS, (), 0)
    assert plan == stored


def test_a_lower_priority_run_never_takes_over():
    top = run("top", count=2, priority=10)
    low = run("low", count=4)
    stored = {"b1": "top", "b2": "top"}
    plan = plan_reservations(stored, {"top": top}, [top, low], BOARDS, (), 0)
    assert plan == stored


def test_a_holder_left_short_by_a_takeover_fills_its_places_again_at_the_next_scan():
    low = run("low", count=2)
    # A takeover left low with b2 only; b3 is free of reservations now.
    plan = plan_reservations(
        {"b1": "top", "b2": "low"},
        {"low": low, "top": run("top", priority=10)},
        [low],
        BOARDS,
        (),
        0,
    )
    assert plan["b2"] == "low" and list(plan.values()).count("low") == 2


def test_under_the_width_cap_a_run_reserves_the_one_node_that_fills_both_its_roles():
    """a(x) and r(x, y), roles x and y, ``lease.max_per_run`` 1: r alone fills both, as a
    promotion would place it (docs/contract.md#requirements-and-how-runs-are-placed)."""
    a = Advert("a", (Capability("x"),))
    r = Advert("r", (Capability("x"), Capability("y")))
    both = Reserving("both", "x+y", (Role("x", "x", 1, {}), Role("y", "y", 1, {})), 0)
    assert plan_reservations({}, {}, [both], [a, r], (), 1) == {"r": "both"}
