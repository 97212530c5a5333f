"""Unit tests of the matcher and the width cap (docs/design.md#matcher-and-width-cap; the roles of
docs/contract.md#requirements-and-how-runs-are-placed).

``app.match`` is pure: these tests build plain data and assert exact outputs.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from app.contract.types import Role
from app.match import (
    FIT_TRIES,
    NEVER,
    NOT_NOW,
    Advert,
    Assignment,
    Capability,
    Firsts,
    Reject,
    adverts_from_rows,
    candidate_order,
    describe,
    fit_within_cap,
    match,
    match_firsts,
    match_within_cap,
    satisfies,
    width_exceeded,
)

# --------------------------------------------------------------------------------------------------
# helpers


def adv(node_id: str, *caps: tuple[str, dict[str, str]], label: str | None = None) -> Advert:
    return Advert(node_id, tuple(Capability(name, dict(attrs)) for name, attrs in caps), label)


def board(node_id: str, **attrs: str) -> Advert:
    return adv(node_id, ("board", attrs))


def role(name: str, capability: str = "board", count: int = 1, **attrs: str) -> Role:
    return Role(name, capability, count, dict(attrs))


def ids(adverts: list[Advert]) -> list[str]:
    return [a.node_id for a in adverts]


# --------------------------------------------------------------------------------------------------
# candidate order


def test_attr_count_sums_attributes_over_all_capability_entries() -> None:
    a = adv("n", ("board", {"soc": "x", "rev": "b"}), ("gpu", {"vram": "8"}), ("host", {}))
    assert a.attr_count == 3


def test_attr_count_of_advert_without_capabilities_is_zero() -> None:
    assert Advert("n").attr_count == 0


def test_candidate_order_puts_fewer_attributes_first() -> None:
    two = board("a", soc="x", rev="b")
    zero = board("b")
    one = board("c", soc="x")
    assert ids(candidate_order([two, zero, one])) == ["b", "c", "a"]


def test_candidate_order_counts_attributes_summed_over_entries_not_per_entry() -> None:
    # "a": entries with 1 + 2 = 3 attributes; "b": one entry with 2. Per-entry max would tie them
    # (and node_id would put "a" first); the sum puts "b" first.
    a = adv("a", ("board", {"soc": "x"}), ("gpu", {"vram": "8", "arch": "sm80"}))
    b = adv("b", ("board", {"soc": "x", "rev": "b"}))
    assert ids(candidate_order([a, b])) == ["b", "a"]


def test_candidate_order_does_not_count_capability_entries_only_attributes() -> None:
    many_bare_entries = adv("a", ("board", {}), ("gpu", {}), ("host", {}))
    one_attr = adv("b", ("board", {"soc": "x"}))
    assert ids(candidate_order([one_attr, many_bare_entries])) == ["a", "b"]


def test_candidate_order_breaks_attribute_ties_by_node_id() -> None:
    adverts = [board("n3", soc="x"), board("n1", soc="y"), board("n2", soc="z")]
    assert ids(candidate_order(adverts)) == ["n1", "n2", "n3"]


def test_candidate_order_compares_node_ids_as_strings() -> None:
    adverts = [board("n10"), board("n9"), board("n1")]
    assert ids(candidate_order(adverts)) == ["n1", "n10", "n9"]


def test_candidate_order_returns_a_new_list_and_leaves_input_untouched() -> None:
    adverts = [board("b"), board("a")]
    out = candidate_order(adverts)
    assert ids(out) == ["a", "b"]
    assert ids(adverts) == ["b", "a"]


def test_match_picks_plain_node_and_keeps_specialised_node_free() -> None:
    special = board("a-special", soc="imx8mp", gpu="yes", ram="8g")
    plain = board("z-plain", soc="imx8mp")
    result = match([role("dut", soc="imx8mp")], [special, plain], set())
    assert result == Assignment((("dut", ("z-plain",)),))


def test_match_uses_specialised_node_when_the_plain_one_is_unavailable() -> None:
    special = board("a-special", soc="imx8mp", gpu="yes")
    plain = board("z-plain", soc="imx8mp")
    result = match([role("dut", soc="imx8mp")], [special, plain], {"z-plain"})
    assert result == Assignment((("dut", ("a-special",)),))


def test_match_with_equal_attribute_counts_picks_lowest_node_id() -> None:
    result = match([role("dut")], [board("n2", soc="x"), board("n1", soc="y")], set())
    assert result == Assignment((("dut", ("n1",)),))


def test_match_plain_preference_counts_attributes_of_other_capability_entries() -> None:
    # Both satisfy "board"; "a" also carries a gpu entry with attributes, so it is more specialised.
    a = adv("a", ("board", {}), ("gpu", {"vram": "8"}))
    b = adv("b", ("board", {}))
    assert match([role("dut")], [a, b], set()) == Assignment((("dut", ("b",)),))


def test_match_ordered_true_takes_the_adverts_in_the_given_order() -> None:
    # The caller promises candidate order; the matcher does not re-sort.
    adverts = [board("z", soc="x", rev="b"), board("a")]
    assert match([role("dut")], adverts, set(), ordered=True) == Assignment((("dut", ("z",)),))


def test_match_ordered_false_sorts_the_adverts_itself() -> None:
    adverts = [board("z", soc="x", rev="b"), board("a")]
    assert match([role("dut")], adverts, set()) == Assignment((("dut", ("a",)),))


# --------------------------------------------------------------------------------------------------
# satisfies


def test_satisfies_when_capability_name_matches_and_no_attrs_requested() -> None:
    assert satisfies(board("n", soc="x"), role("dut")) is True


def test_satisfies_rejects_a_different_capability_name() -> None:
    assert satisfies(adv("n", ("gpu", {})), role("dut", "board")) is False


def test_satisfies_capability_name_is_compared_exactly() -> None:
    assert satisfies(adv("n", ("board-v2", {})), role("dut", "board")) is False
    assert satisfies(adv("n", ("boar", {})), role("dut", "board")) is False


def test_satisfies_when_every_requested_attr_is_equal() -> None:
    assert satisfies(board("n", soc="imx8mp", rev="b"), role("dut", soc="imx8mp", rev="b")) is True


def test_satisfies_rejects_an_unequal_attr_value() -> None:
    assert satisfies(board("n", soc="imx8mq"), role("dut", soc="imx8mp")) is False


def test_satisfies_rejects_when_one_of_several_requested_attrs_differs() -> None:
    assert satisfies(board("n", soc="imx8mp", rev="a"), role("dut", soc="imx8mp", rev="b")) is False


def test_satisfies_rejects_a_requested_attr_missing_from_the_node() -> None:
    assert satisfies(board("n"), role("dut", soc="imx8mp")) is False


def test_satisfies_requested_empty_string_needs_the_attr_present_and_empty() -> None:
    assert satisfies(board("n"), role("dut", soc="")) is False
    assert satisfies(board("n", soc=""), role("dut", soc="")) is True


def test_satisfies_compares_attr_values_as_exact_strings() -> None:
    assert satisfies(board("n", ram="08"), role("dut", ram="8")) is False
    assert satisfies(board("n", soc="IMX8MP"), role("dut", soc="imx8mp")) is False
    assert satisfies(board("n", soc="imx8mp "), role("dut", soc="imx8mp")) is False


def test_satisfies_accepts_extra_node_attrs() -> None:
    assert satisfies(board("n", soc="imx8mp", rev="b", ram="8g"), role("dut", soc="imx8mp")) is True


def test_satisfies_ignores_attr_on_another_entry_with_the_same_capability_name() -> None:
    node = adv("n", ("board", {"soc": "imx8mp"}), ("board", {"rev": "b"}))
    assert satisfies(node, role("dut", soc="imx8mp", rev="b")) is False


def test_satisfies_ignores_attr_on_an_entry_of_another_capability() -> None:
    node = adv("n", ("board", {}), ("gpu", {"soc": "imx8mp"}))
    assert satisfies(node, role("dut", "board", soc="imx8mp")) is False


def test_satisfies_when_any_one_entry_matches_fully() -> None:
    node = adv("n", ("board", {"soc": "imx8mq"}), ("gpu", {}), ("board", {"soc": "imx8mp"}))
    assert satisfies(node, role("dut", soc="imx8mp")) is True


def test_satisfies_nothing_for_an_advert_without_capabilities() -> None:
    assert satisfies(Advert("n"), role("dut")) is False


def test_match_never_assigns_a_node_whose_attr_sits_on_another_entry() -> None:
    split = adv("a", ("board", {"soc": "imx8mp"}), ("board", {"rev": "b"}))
    result = match([role("dut", soc="imx8mp", rev="b")], [split], set())
    assert result == Reject(NEVER, "dut", "need 1, fleet has 0 - board rev=b soc=imx8mp")


# --------------------------------------------------------------------------------------------------
# describe (the requirement as it appears in reasons)


def test_describe_without_attrs_is_the_capability_alone() -> None:
    assert describe(role("dut", "gpu")) == "gpu"


def test_describe_lists_attrs_as_key_equals_value() -> None:
    assert describe(role("dut", soc="imx8mp")) == "board soc=imx8mp"


def test_describe_sorts_attrs_by_key() -> None:
    r = Role("dut", "board", 1, {"soc": "imx8mp", "arch": "arm64", "rev": "b"})
    assert describe(r) == "board arch=arm64 rev=b soc=imx8mp"


def test_describe_does_not_mention_count() -> None:
    assert describe(role("dut", count=3, soc="x")) == "board soc=x"


# --------------------------------------------------------------------------------------------------
# pass 1: 422, the whole live fleet cannot satisfy a role


def test_pass_one_rejects_422_when_fleet_has_no_satisfying_node() -> None:
    result = match([role("dut", soc="imx8mp")], [board("n1", soc="imx8mq")], set())
    assert result == Reject(NEVER, "dut", "need 1, fleet has 0 - board soc=imx8mp")


def test_pass_one_rejects_422_on_an_empty_fleet() -> None:
    assert match([role("dut", "gpu")], [], set()) == Reject(
        NEVER, "dut", "need 1, fleet has 0 - gpu"
    )


def test_pass_one_rejects_422_when_fleet_has_fewer_than_count() -> None:
    adverts = [board("n1", soc="imx8mp"), board("n2", soc="imx8mp"), board("n3", soc="other")]
    result = match([role("dut", count=3, soc="imx8mp")], adverts, set())
    assert result == Reject(NEVER, "dut", "need 3, fleet has 2 - board soc=imx8mp")


def test_pass_one_reason_lists_attrs_sorted_by_key() -> None:
    r = Role("dut", "board", 1, {"soc": "imx8mp", "arch": "arm64"})
    assert match([r], [], set()) == Reject(
        NEVER, "dut", "need 1, fleet has 0 - board arch=arm64 soc=imx8mp"
    )


def test_pass_one_counts_unavailable_nodes_as_part_of_the_fleet() -> None:
    adverts = [board("n1"), board("n2")]
    result = match([role("dut", count=3)], adverts, {"n1", "n2"})
    assert result == Reject(NEVER, "dut", "need 3, fleet has 2 - board")


def test_pass_one_rejects_422_before_any_role_is_checked_for_busy_nodes() -> None:
    # Role 1 is satisfiable by the fleet but all its nodes are busy; role 2 is impossible.
    adverts = [board("b1"), board("b2")]
    requires = [role("dut"), role("gpu", "gpu")]
    result = match(requires, adverts, {"b1", "b2"})
    assert result == Reject(NEVER, "gpu", "need 1, fleet has 0 - gpu")


def test_pass_one_reports_the_first_impossible_role_in_contract_order() -> None:
    requires = [role("ok"), role("first", "gpu"), role("second", "host")]
    result = match(requires, [board("b1")], set())
    assert result == Reject(NEVER, "first", "need 1, fleet has 0 - gpu")


def test_one_node_does_not_count_twice_within_a_role() -> None:
    # A node with two matching entries is still one node.
    double = adv("n1", ("board", {"soc": "x"}), ("board", {"soc": "x", "rev": "b"}))
    result = match([role("dut", count=2, soc="x")], [double], set())
    assert result == Reject(NEVER, "dut", "need 2, fleet has 1 - board soc=x")


# --------------------------------------------------------------------------------------------------
# pass 2: 409, not enough satisfying nodes free right now


def test_pass_two_rejects_409_when_every_candidate_is_unavailable() -> None:
    result = match([role("dut", soc="imx8mp")], [board("n1", soc="imx8mp")], {"n1"})
    assert result == Reject(NOT_NOW, "dut", "need 1, currently 0 - board soc=imx8mp")


def test_pass_two_rejects_409_when_fewer_than_count_are_free() -> None:
    adverts = [board("n1", soc="x"), board("n2", soc="x"), board("n3", soc="x")]
    result = match([role("dut", count=3, soc="x")], adverts, {"n2"})
    assert result == Reject(NOT_NOW, "dut", "need 3, currently 2 - board soc=x")


def test_pass_two_reason_lists_attrs_sorted_by_key() -> None:
    r = Role("dut", "board", 2, {"soc": "imx8mp", "arch": "arm64"})
    adverts = [board("n1", soc="imx8mp", arch="arm64"), board("n2", arch="arm64", soc="imx8mp")]
    result = match([r], adverts, {"n1"})
    assert result == Reject(NOT_NOW, "dut", "need 2, currently 1 - board arch=arm64 soc=imx8mp")


def test_pass_two_counts_only_satisfying_free_nodes() -> None:
    # A free node that does not satisfy the role does not help.
    adverts = [board("n1", soc="imx8mp"), board("n2", soc="other")]
    result = match([role("dut", soc="imx8mp")], adverts, {"n1"})
    assert result == Reject(NOT_NOW, "dut", "need 1, currently 0 - board soc=imx8mp")


def test_pass_two_reports_the_first_short_role_in_contract_order() -> None:
    adverts = [board("b1"), adv("g1", ("gpu", {})), adv("h1", ("host", {}))]
    requires = [role("dut"), role("gpu", "gpu"), role("host", "host")]
    result = match(requires, adverts, {"g1", "h1"})
    assert result == Reject(NOT_NOW, "gpu", "need 1, currently 0 - gpu")


def test_pass_two_rejects_a_later_role_after_earlier_roles_fit() -> None:
    adverts = [board("b1"), adv("g1", ("gpu", {}))]
    result = match([role("dut"), role("gpu", "gpu")], adverts, {"g1"})
    assert result == Reject(NOT_NOW, "gpu", "need 1, currently 0 - gpu")


def test_unknown_ids_in_unavailable_are_harmless() -> None:
    result = match([role("dut")], [board("n1")], {"ghost", "other"})
    assert result == Assignment((("dut", ("n1",)),))


def test_unavailable_may_be_any_collection() -> None:
    adverts = [board("n1"), board("n2")]
    for unavailable in (["n1"], ("n1",), frozenset({"n1"}), {"n1": True}):
        assert match([role("dut")], adverts, unavailable) == Assignment((("dut", ("n2",)),))


# --------------------------------------------------------------------------------------------------
# assignments


def test_match_assigns_roles_in_contract_order() -> None:
    adverts = [adv("h1", ("host", {})), board("b1")]
    result = match([role("host", "host"), role("dut")], adverts, set())
    assert result == Assignment((("host", ("h1",)), ("dut", ("b1",))))


def test_match_with_no_roles_is_an_empty_assignment() -> None:
    result = match([], [board("n1")], set())
    assert result == Assignment(())
    assert isinstance(result, Assignment) and result.nodes() == []


def test_one_node_may_fill_several_roles() -> None:
    node = adv("n1", ("board", {"soc": "x"}), ("host", {}))
    result = match([role("dut", soc="x"), role("host", "host")], [node], set())
    assert result == Assignment((("dut", ("n1",)), ("host", ("n1",))))


def test_a_node_filling_several_roles_appears_once_in_nodes() -> None:
    node = adv("n1", ("board", {"soc": "x"}), ("host", {}))
    result = match([role("dut", soc="x"), role("host", "host")], [node], set())
    assert isinstance(result, Assignment)
    assert result.nodes() == ["n1"]


def test_roles_with_the_same_requirement_share_the_first_candidate() -> None:
    # Sharing is allowed, so each role takes the first free candidate independently.
    result = match([role("a"), role("b")], [board("n1"), board("n2")], set())
    assert result == Assignment((("a", ("n1",)), ("b", ("n1",))))


def test_count_greater_than_one_takes_the_first_count_candidates_in_order() -> None:
    adverts = [board("n4", soc="x", rev="b"), board("n3"), board("n2", soc="x"), board("n1")]
    result = match([role("dut", count=3)], adverts, set())
    assert result == Assignment((("dut", ("n1", "n3", "n2")),))


def test_count_greater_than_one_skips_unavailable_candidates_keeping_order() -> None:
    adverts = [board("n1"), board("n2"), board("n3"), board("n4")]
    result = match([role("dut", count=2)], adverts, {"n1", "n3"})
    assert result == Assignment((("dut", ("n2", "n4")),))


def test_nodes_within_one_role_are_distinct() -> None:
    result = match([role("dut", count=2)], [board("n1"), board("n2")], set())
    assert result == Assignment((("dut", ("n1", "n2")),))


def test_match_exactly_count_free_nodes_takes_them_all() -> None:
    adverts = [board("n1"), board("n2"), board("n3")]
    result = match([role("dut", count=2)], adverts, {"n2"})
    assert result == Assignment((("dut", ("n1", "n3")),))


def test_nodes_lists_distinct_nodes_in_order_of_first_appearance() -> None:
    a = Assignment((("x", ("n3", "n1")), ("y", ("n1", "n2")), ("z", ("n3",))))
    assert a.nodes() == ["n3", "n1", "n2"]


def test_by_role_maps_role_names_to_their_nodes() -> None:
    a = Assignment((("dut", ("n1", "n2")), ("host", ("n1",))))
    assert a.by_role() == {"dut": ("n1", "n2"), "host": ("n1",)}


def test_match_mixed_roles_full_example() -> None:
    adverts = [
        adv("rig", ("board", {"soc": "imx8mp"}), ("host", {"os": "linux"})),
        board("b-plain", soc="imx8mp"),
        board("b-rev", soc="imx8mp", rev="b"),
        adv("h-bare", ("host", {})),
    ]
    requires = [role("dut", count=2, soc="imx8mp"), role("host", "host", os="linux")]
    result = match(requires, adverts, {"b-plain"})
    # dut candidates in order: b-plain(1, busy), b-rev(2), rig(2) -> b-rev, rig
    assert result == Assignment((("dut", ("b-rev", "rig")), ("host", ("rig",))))
    assert isinstance(result, Assignment) and result.nodes() == ["b-rev", "rig"]


# --------------------------------------------------------------------------------------------------
# width cap


def test_width_zero_means_no_cap() -> None:
    a = Assignment((("dut", tuple(f"n{i}" for i in range(50))),))
    assert width_exceeded(a, 0) is None


def test_width_exactly_at_the_cap_is_allowed() -> None:
    a = Assignment((("dut", ("n1", "n2")),))
    assert width_exceeded(a, 2) is None


def test_width_under_the_cap_is_allowed() -> None:
    assert width_exceeded(Assignment((("dut", ("n1",)),)), 2) is None


def test_width_over_the_cap_gives_the_exact_reason() -> None:
    a = Assignment((("dut", ("n1", "n2")), ("host", ("n3",))))
    assert width_exceeded(a, 2) == "requires exceeds the width limit: 3 nodes, limit 2"


def test_width_counts_a_shared_node_once() -> None:
    # Three role slots, two distinct nodes: within a cap of 2.
    a = Assignment((("dut", ("n1", "n2")), ("host", ("n1",))))
    assert width_exceeded(a, 2) is None


def test_width_reason_reports_distinct_nodes_when_shared() -> None:
    a = Assignment((("dut", ("n1", "n2")), ("host", ("n1",)), ("gpu", ("n2",))))
    assert width_exceeded(a, 1) == "requires exceeds the width limit: 2 nodes, limit 1"


def test_width_of_a_matched_shared_node_folds_to_one() -> None:
    node = adv("n1", ("board", {}), ("host", {}))
    result = match([role("dut"), role("host", "host")], [node], set())
    assert isinstance(result, Assignment)
    assert width_exceeded(result, 1) is None


def test_width_of_an_empty_assignment_is_never_exceeded() -> None:
    assert width_exceeded(Assignment(()), 1) is None


# --------------------------------------------------------------------------------------------------
# width cap: one node filling several roles, found by a bounded search


def caps(node_id: str, *names: str) -> Advert:
    return adv(node_id, *((n, {}) for n in names))


def test_under_the_cap_a_node_filling_both_roles_is_found_when_the_first_choice_is_too_wide() -> (
    None
):
    fleet = [caps("a", "x"), caps("r", "x", "y")]
    requires = [role("x", "x"), role("y", "y")]
    # The matcher alone takes "a" for x (candidate order), then "r" for y: two nodes.
    assert match(requires, fleet, set()) == Assignment((("x", ("a",)), ("y", ("r",))))

    folded = match_within_cap(requires, fleet, set(), 1)

    assert folded == Assignment((("x", ("r",)), ("y", ("r",))))
    assert width_exceeded(folded, 1) is None


def test_when_no_reuse_fits_the_cap_the_answer_is_the_matchers_and_its_width_reason() -> None:
    fleet = [caps("a", "x"), caps("b", "y")]
    requires = [role("x", "x"), role("y", "y")]

    outcome = match_within_cap(requires, fleet, set(), 1)

    assert outcome == match(requires, fleet, set())
    assert width_exceeded(outcome, 1) == "requires exceeds the width limit: 2 nodes, limit 1"
    assert fit_within_cap(requires, fleet, set(), 1) is None


def test_within_the_cap_the_answer_is_the_matchers_even_where_a_narrower_one_exists() -> None:
    fleet = [caps("a", "x"), caps("r", "x", "y")]
    requires = [role("x", "x"), role("y", "y")]
    assert match_within_cap(requires, fleet, set(), 2) == Assignment((("x", ("a",)), ("y", ("r",))))
    assert match_within_cap(requires, fleet, set(), 0) == match(requires, fleet, set())


def test_a_reject_of_the_matcher_is_the_answer_under_a_cap_too() -> None:
    requires = [role("x", "x"), role("y", "y")]
    assert match_within_cap(requires, [caps("a", "x")], set(), 1) == Reject(
        NEVER, "y", "need 1, fleet has 0 - y"
    )
    assert match_within_cap(requires, [caps("r", "x", "y")], {"r"}, 1) == Reject(
        NOT_NOW, "x", "need 1, currently 0 - x"
    )


def test_folding_never_takes_an_unavailable_node() -> None:
    fleet = [caps("a", "x"), caps("r1", "x", "y"), caps("r2", "x", "y")]
    requires = [role("x", "x"), role("y", "y")]
    assert match_within_cap(requires, fleet, {"r1"}, 1) == Assignment(
        (("x", ("r2",)), ("y", ("r2",)))
    )
    assert fit_within_cap(requires, fleet, {"r1", "r2"}, 1) is None


def test_a_role_with_a_count_gets_count_distinct_nodes_when_folded() -> None:
    # x and y each need two nodes: "a" and "b" fill only x, "r1" and "r2" fill both.
    fleet = [caps("a", "x"), caps("b", "x"), caps("r1", "x", "y"), caps("r2", "x", "y")]
    requires = [role("x", "x", count=2), role("y", "y", count=2)]
    assert width_exceeded(match(requires, fleet, set()), 2) is not None

    assert match_within_cap(requires, fleet, set(), 2) == Assignment(
        (("x", ("r1", "r2")), ("y", ("r1", "r2")))
    )
    # With room for three the search still adds as few nodes as it can.
    assert match_within_cap(requires, fleet, set(), 3) == match_within_cap(
        requires, fleet, set(), 2
    )


def test_a_role_whose_count_is_over_the_cap_can_never_fit() -> None:
    fleet = [caps("a", "x"), caps("b", "x"), caps("c", "x")]
    assert fit_within_cap([role("x", "x", count=3)], fleet, set(), 2) is None


def test_a_folded_role_lists_its_nodes_in_candidate_order() -> None:
    # "r2" has fewer attributes than "r1": it comes first, and a role's steps bind to it.
    r1 = adv("r1", ("x", {"k": "v"}), ("y", {}))
    r2 = adv("r2", ("x", {}), ("y", {}))
    fleet = [caps("a", "x"), r1, r2]
    requires = [role("y", "y", count=2), role("x", "x", count=2)]
    assert match_within_cap(requires, fleet, set(), 2) == Assignment(
        (("y", ("r2", "r1")), ("x", ("r2", "r1")))
    )


def test_the_search_prefers_a_node_the_run_already_has_over_a_new_one() -> None:
    # y is decided first (one free node); x then keeps "r" rather than take "a" beside it.
    fleet = [caps("a", "x"), caps("r", "x", "y")]
    requires = [role("x", "x"), role("y", "y")]
    assert fit_within_cap(requires, fleet, set(), 2) == Assignment((("x", ("r",)), ("y", ("r",))))


def test_many_alike_nodes_cost_one_choice_not_one_each() -> None:
    # 2,000 plain x nodes ahead of "r": the search takes "r" for y, then keeps it for x.
    fleet = [caps(f"a{i:04d}", "x") for i in range(2000)] + [caps("r", "x", "y")]
    requires = [role("x", "x"), role("y", "y")]
    assert fit_within_cap(requires, fleet, set(), 1, tries=2) == Assignment(
        (("x", ("r",)), ("y", ("r",)))
    )


def test_the_search_gives_up_after_its_bound_with_the_matchers_answer() -> None:
    # The fit above takes two choices (y takes "r", x keeps it): one is not enough.
    fleet = [caps("a", "x"), caps("r", "x", "y")]
    requires = [role("x", "x"), role("y", "y")]
    assert fit_within_cap(requires, fleet, set(), 1, tries=1) is None
    assert match_within_cap(requires, fleet, set(), 1, tries=1) == match(requires, fleet, set())
    assert fit_within_cap(requires, fleet, set(), 1, tries=2) is not None


# --------------------------------------------------------------------------------------------------
# adverts_from_rows


def test_adverts_from_rows_builds_adverts_from_well_formed_rows() -> None:
    rows = [
        (
            "n1",
            [
                {"capability": "board", "attrs": {"soc": "imx8mp"}},
                {"capability": "host", "attrs": {}},
            ],
            "lab",
        ),
        ("n2", [], None),
    ]
    assert adverts_from_rows(rows) == [
        Advert("n1", (Capability("board", {"soc": "imx8mp"}), Capability("host", {})), "lab"),
        Advert("n2", (), None),
    ]


def test_adverts_from_rows_keeps_row_order() -> None:
    rows = [("z", [], None), ("a", [], None), ("m", [], None)]
    assert ids(adverts_from_rows(rows)) == ["z", "a", "m"]


def test_adverts_from_rows_treats_non_list_capabilities_as_none() -> None:
    rows = [
        ("n1", None, None),
        ("n2", {"capability": "board"}, None),
        ("n3", "board", None),
        ("n4", 7, "x"),
    ]
    assert adverts_from_rows(rows) == [
        Advert("n1", (), None),
        Advert("n2", (), None),
        Advert("n3", (), None),
        Advert("n4", (), "x"),
    ]


def test_adverts_from_rows_ignores_entries_that_are_not_objects() -> None:
    rows = [("n1", ["board", 3, None, ["board"], {"capability": "board"}], None)]
    assert adverts_from_rows(rows) == [Advert("n1", (Capability("board", {}),), None)]


def test_adverts_from_rows_ignores_entries_without_a_string_capability() -> None:
    caps = [
        {"attrs": {"soc": "x"}},
        {"capability": None},
        {"capability": 5, "attrs": {}},
        {"capability": ["board"]},
        {"capability": "host"},
    ]
    assert adverts_from_rows([("n1", caps, None)]) == [
        Advert("n1", (Capability("host", {}),), None)
    ]


def test_adverts_from_rows_missing_attrs_means_no_attrs() -> None:
    assert adverts_from_rows([("n1", [{"capability": "board"}], None)]) == [
        Advert("n1", (Capability("board", {}),), None)
    ]


def test_adverts_from_rows_non_object_attrs_mean_no_attrs() -> None:
    caps = [
        {"capability": "a", "attrs": None},
        {"capability": "b", "attrs": ["soc"]},
        {"capability": "c", "attrs": "soc=x"},
    ]
    assert adverts_from_rows([("n1", caps, None)]) == [
        Advert("n1", (Capability("a", {}), Capability("b", {}), Capability("c", {})), None)
    ]


def test_adverts_from_rows_ignores_extra_keys_of_an_entry() -> None:
    caps = [{"capability": "board", "attrs": {"soc": "x"}, "note": "ignored"}]
    assert adverts_from_rows([("n1", caps, None)]) == [
        Advert("n1", (Capability("board", {"soc": "x"}),), None)
    ]


def test_adverts_from_rows_malformed_entry_does_not_hide_the_good_ones() -> None:
    caps = [{"capability": "board", "attrs": {"soc": "imx8mp"}}, "junk", {"nope": 1}]
    adverts = adverts_from_rows([("n1", caps, None)])
    assert match([role("dut", soc="imx8mp")], adverts, set()) == Assignment((("dut", ("n1",)),))


def test_adverts_from_rows_counts_attrs_for_candidate_order() -> None:
    rows = [
        ("a", [{"capability": "board", "attrs": {"soc": "x", "rev": "b"}}], None),
        ("b", [{"capability": "board", "attrs": {"soc": "x"}}, "junk"], None),
    ]
    assert ids(candidate_order(adverts_from_rows(rows))) == ["b", "a"]


# --------------------------------------------------------------------------------------------------
# properties

NAMES = ["board", "gpu", "host"]
KEYS = ["soc", "rev"]
VALUES = ["a", "b"]

attrs_st = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2)
cap_st = st.builds(Capability, st.sampled_from(NAMES), attrs_st)


@st.composite
def fleets(draw: st.DrawFn) -> list[Advert]:
    node_ids = draw(st.lists(st.sampled_from([f"n{i}" for i in range(8)]), unique=True, max_size=6))
    return [Advert(n, tuple(draw(st.lists(cap_st, max_size=3)))) for n in node_ids]


@st.composite
def roles_st(draw: st.DrawFn) -> list[Role]:
    names = draw(st.lists(st.sampled_from(["r1", "r2", "r3", "r4"]), unique=True, max_size=3))
    return [
        Role(n, draw(st.sampled_from(NAMES)), draw(st.integers(1, 3)), draw(attrs_st))
        for n in names
    ]


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[Role], list[Advert], set[str]]:
    fleet = draw(fleets())
    requires = draw(roles_st())
    unavailable = draw(st.sets(st.sampled_from([a.node_id for a in fleet] or ["ghost"])))
    return requires, fleet, unavailable


PROPS = settings(max_examples=300, deadline=None)


@PROPS
@given(cases())
def test_property_assignment_never_uses_an_unavailable_node(case) -> None:
    requires, fleet, unavailable = case
    result = match(requires, fleet, unavailable)
    if isinstance(result, Assignment):
        assert not set(result.nodes()) & unavailable


@PROPS
@given(cases())
def test_property_every_chosen_node_satisfies_its_role(case) -> None:
    requires, fleet, unavailable = case
    result = match(requires, fleet, unavailable)
    if isinstance(result, Assignment):
        by_id = {a.node_id: a for a in fleet}
        for r, (name, nodes) in zip(requires, result.roles):
            assert name == r.name
            for n in nodes:
                assert satisfies(by_id[n], r)


@PROPS
@given(cases())
def test_property_no_role_repeats_a_node(case) -> None:
    requires, fleet, unavailable = case
    result = match(requires, fleet, unavailable)
    if isinstance(result, Assignment):
        for _, nodes in result.roles:
            assert len(set(nodes)) == len(nodes)


@PROPS
@given(cases())
def test_property_each_role_gets_exactly_count_nodes_in_contract_order(case) -> None:
    requires, fleet, unavailable = case
    result = match(requires, fleet, unavailable)
    if isinstance(result, Assignment):
        assert [(name, len(nodes)) for name, nodes in result.roles] == [
            (r.name, r.count) for r in requires
        ]


@PROPS
@given(cases())
def test_property_each_role_takes_the_first_free_satisfying_candidates(case) -> None:
    requires, fleet, unavailable = case
    result = match(requires, fleet, unavailable)
    if isinstance(result, Assignment):
        ordered = candidate_order(fleet)
        for r, (_, nodes) in zip(requires, result.roles):
            free = [a.node_id for a in ordered if satisfies(a, r) and a.node_id not in unavailable]
            assert nodes == tuple(free[: r.count])


@PROPS
@given(cases())
def test_property_outcome_follows_the_two_passes(case) -> None:
    requires, fleet, unavailable = case
    result = match(requires, fleet, unavailable)
    in_fleet = [sum(satisfies(a, r) for a in fleet) for r in requires]
    free = [sum(satisfies(a, r) and a.node_id not in unavailable for a in fleet) for r in requires]
    impossible = [i for i, r in enumerate(requires) if in_fleet[i] < r.count]
    short = [i for i, r in enumerate(requires) if free[i] < r.count]
    if impossible:
        i = impossible[0]
        r = requires[i]
        assert result == Reject(
            NEVER, r.name, f"need {r.count}, fleet has {in_fleet[i]} - {describe(r)}"
        )
    elif short:
        i = short[0]
        r = requires[i]
        assert result == Reject(
            NOT_NOW, r.name, f"need {r.count}, currently {free[i]} - {describe(r)}"
        )
    else:
        assert isinstance(result, Assignment)


@PROPS
@given(cases())
def test_property_match_is_deterministic(case) -> None:
    requires, fleet, unavailable = case
    assert match(requires, fleet, unavailable) == match(requires, list(fleet), set(unavailable))


@PROPS
@given(cases(), st.randoms(use_true_random=False))
def test_property_match_is_independent_of_advert_input_order(case, rnd) -> None:
    requires, fleet, unavailable = case
    shuffled = list(fleet)
    rnd.shuffle(shuffled)
    assert match(requires, shuffled, unavailable) == match(requires, fleet, unavailable)


@PROPS
@given(cases())
def test_property_ordered_flag_on_presorted_fleet_gives_the_same_result(case) -> None:
    requires, fleet, unavailable = case
    presorted = candidate_order(fleet)
    assert match(requires, presorted, unavailable, ordered=True) == match(
        requires, fleet, unavailable
    )


@PROPS
@given(cases(), st.integers(0, 6))
def test_property_width_cap_agrees_with_distinct_node_count(case, cap) -> None:
    requires, fleet, unavailable = case
    result = match(requires, fleet, unavailable)
    if isinstance(result, Assignment):
        width = len(set(n for _, nodes in result.roles for n in nodes))
        expected = (
            f"requires exceeds the width limit: {width} nodes, limit {cap}"
            if cap and width > cap
            else None
        )
        assert width_exceeded(result, cap) == expected


def bounded_read(requires, fleet, unavailable) -> list[Firsts]:
    """What ``first_candidates`` reads, computed in Python: per role, the satisfying nodes, free
    ones first, each part in candidate order, cut at the largest count of the roles with the same
    requirement."""
    out = []
    for r in requires:
        limit = max(o.count for o in requires if (o.capability, o.attrs) == (r.capability, r.attrs))
        ordered = sorted(
            (a for a in fleet if satisfies(a, r)),
            key=lambda a: (a.node_id in unavailable, a.attr_count, a.node_id),
        )[:limit]
        free = tuple(a.node_id for a in ordered if a.node_id not in unavailable)
        out.append(Firsts(free, len(ordered), limit))
    return out


@PROPS
@given(cases())
def test_property_match_on_a_bounded_read_decides_as_match_on_the_whole_fleet(case) -> None:
    requires, fleet, unavailable = case
    assert match_firsts(requires, bounded_read(requires, fleet, unavailable)) == match(
        requires, fleet, unavailable
    )


def test_match_firsts_names_the_exact_fleet_and_free_counts_below_the_limit() -> None:
    need_two = [role("dut", count=2, soc="a")]
    assert match_firsts(need_two, [Firsts(("n1",), 1, 2)]) == Reject(
        NEVER, "dut", "need 2, fleet has 1 - board soc=a"
    )
    assert match_firsts(need_two, [Firsts(("n1",), 2, 2)]) == Reject(
        NOT_NOW, "dut", "need 2, currently 1 - board soc=a"
    )
    assert match_firsts(need_two, [Firsts(("n1", "n2"), 2, 2)]) == Assignment(
        (("dut", ("n1", "n2")),)
    )


# Small enough that the search never reaches its bound: a choice at the l-th role decided is the
# nodes that role adds, so each choice is one way to spread the n free nodes over "added by
# role 1..l" or "not used", at most (l + 1) ** n; with 5 nodes and 3 roles, 32 + 243 + 1024.
SMALL_NODES = 5
SMALL_ROLES = 3


def most_choices(nodes: int, roles: int) -> int:
    return sum((level + 1) ** nodes for level in range(1, roles + 1))


@st.composite
def small_cases(draw: st.DrawFn) -> tuple[list[Role], list[Advert], set[str], int]:
    node_ids = draw(st.lists(st.sampled_from([f"n{i}" for i in range(8)]), unique=True, max_size=5))
    fleet = [Advert(n, tuple(draw(st.lists(cap_st, max_size=3)))) for n in node_ids]
    names = draw(st.lists(st.sampled_from(["r1", "r2", "r3"]), unique=True, min_size=1))
    requires = [
        Role(n, draw(st.sampled_from(NAMES)), draw(st.integers(1, 3)), draw(attrs_st))
        for n in names
    ]
    unavailable = draw(st.sets(st.sampled_from(node_ids or ["ghost"])))
    return requires, fleet, unavailable, draw(st.integers(1, 5))


def fits_by_brute_force(requires, fleet, unavailable, cap) -> bool:
    """Whether any assignment (every role: count distinct free nodes that fill it) has at most
    ``cap`` distinct nodes, trying them all."""
    free = [
        [a.node_id for a in fleet if satisfies(a, r) and a.node_id not in unavailable]
        for r in requires
    ]
    choices = [itertools.combinations(nodes, r.count) for r, nodes in zip(requires, free)]
    return any(len(set().union(*picked)) <= cap for picked in itertools.product(*choices))


def test_small_cases_never_reach_the_bound() -> None:
    assert most_choices(SMALL_NODES, SMALL_ROLES) <= FIT_TRIES


@PROPS
@given(small_cases())
def test_property_a_fit_within_the_cap_is_found_exactly_when_one_exists(case) -> None:
    requires, fleet, unavailable, cap = case
    found = fit_within_cap(requires, fleet, unavailable, cap)
    assert (found is not None) == fits_by_brute_force(requires, fleet, unavailable, cap)
    if found is None:
        return
    by_id = {a.node_id: a for a in fleet}
    assert [name for name, _ in found.roles] == [r.name for r in requires]
    for r, (_, nodes) in zip(requires, found.roles):
        assert len(nodes) == len(set(nodes)) == r.count
        assert all(satisfies(by_id[n], r) for n in nodes)
        assert nodes == tuple(a.node_id for a in candidate_order(fleet) if a.node_id in nodes)
    assert not set(found.nodes()) & unavailable
    assert len(found.nodes()) <= cap


@PROPS
@given(small_cases(), st.randoms(use_true_random=False))
def test_property_match_within_cap_is_the_matchers_answer_unless_that_is_too_wide(
    case, rnd
) -> None:
    requires, fleet, unavailable, cap = case
    shuffled = list(fleet)
    rnd.shuffle(shuffled)
    plain = match(requires, fleet, unavailable)
    outcome = match_within_cap(requires, shuffled, unavailable, cap)
    if isinstance(plain, Reject) or width_exceeded(plain, cap) is None:
        assert outcome == plain
    elif fits_by_brute_force(requires, fleet, unavailable, cap):
        assert outcome == fit_within_cap(requires, fleet, unavailable, cap)
        assert width_exceeded(outcome, cap) is None
    else:
        assert outcome == plain
