"""The process's list of queued shapes (app/services/expected.py, docs/queue.md, "What a QUEUED
run's view explains"): the shapes it finds for a run's candidates are exactly those with a role one
of the candidates fits, as app.match.satisfies decides it, however the list was built."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.contract.types import role_from_wire
from app.match import Advert, Capability, satisfies
from app.services.expected import _Listed

NAMES = st.sampled_from(["board", "scope", "psu"])
ATTRS = st.dictionaries(st.sampled_from(["soc", "rev", "lab"]), st.sampled_from(["a", "b"]))


def wire_role(name: str, capability: str, attrs: dict[str, str]) -> dict[str, Any]:
    return {"as": name, "capability": capability, "attrs": attrs}


SHAPES = st.dictionaries(
    st.text("abcdef", min_size=1, max_size=4),
    st.lists(
        st.builds(wire_role, st.sampled_from(["dut", "aux"]), NAMES, ATTRS),
        min_size=1,
        max_size=3,
    ),
    max_size=12,
)
ADVERTS = st.lists(
    st.builds(
        lambda i, caps: Advert(f"n{i}", tuple(Capability(c, a) for c, a in caps)),
        st.integers(0, 99),
        st.lists(st.tuples(NAMES, ATTRS), max_size=3),
    ),
    max_size=6,
)


def brute_force(shapes: dict[str, Any], adverts: list[Advert]) -> set[str]:
    return {
        key
        for key, doc in shapes.items()
        if any(satisfies(a, role_from_wire(w)) for w in doc for a in adverts)
    }


@settings(max_examples=300, deadline=None)
@given(SHAPES, ADVERTS)
def test_the_shapes_found_are_those_a_candidate_fits(shapes, adverts):
    listed = _Listed.of(shapes)

    assert set(listed.fitting(adverts)) == brute_force(shapes, adverts)
    assert all(listed.fitting(adverts)[k] is shapes[k] for k in listed.fitting(adverts))


@settings(max_examples=200, deadline=None)
@given(SHAPES, ADVERTS)
def test_a_list_grown_one_shape_at_a_time_finds_the_same_shapes(shapes, adverts):
    grown = _Listed.of({})
    for key, doc in shapes.items():
        grown = grown.with_shape(key, doc)

    assert set(grown.fitting(adverts)) == brute_force(shapes, adverts)


def test_a_shape_whose_requires_do_not_decode_is_never_found():
    listed = _Listed.of({"bad": [{"nope": 1}], "good": [wire_role("dut", "board", {})]})

    assert set(listed.fitting([Advert("n1", (Capability("board", {}),))])) == {"good"}
