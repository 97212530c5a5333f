"""The advert schema's fast path (``NodeAdvertSchema.fast_load``) against marshmallow's own
``load``: on every body it takes, both give the same result; bodies of the usual shape (what the
agents send) are taken; anything else is left to ``load``."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from marshmallow import ValidationError

from app.api.schemas import NodeAdvertSchema

SCHEMA = NodeAdvertSchema()

# Mostly what an agent sends, each part now and then replaced by something else: text at a
# bound or past it, with what the agents' text has replaced (NUL, a lone surrogate, a format
# character) or a trailing newline (which marshmallow's ``$`` lets through a regular
# expression), a value of another type, an unknown key.
_ODD = st.sampled_from(["\x00", "\ud800", "\u202e", "\n", " ", "é", "A", "-", ":", "."])
_NAMEISH = st.text(alphabet="abcxyzAZ019._-:@", min_size=1, max_size=10)
_BOUNDS = st.sampled_from(["a" * 200, "a" * 201, "a" * 1024, "a" * 1025, "", "Board", "9lives"])
_ODD_TEXT = st.one_of(st.builds(lambda base, odd: base + odd, _NAMEISH, _ODD), _BOUNDS)
_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(0, 1))
_ODD_VALUE = st.one_of(
    _SCALAR,
    _ODD_TEXT,
    st.lists(_SCALAR, max_size=2),
    st.dictionaries(_NAMEISH, _SCALAR, max_size=2),
)


def _mostly(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` nine times in ten, else something odd."""
    return st.one_of(*[good] * 9, _ODD_VALUE)


def _maybe(key: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(st.just({}), values.map(lambda v: {key: v}))


_EXTRA = st.one_of(*[st.just({})] * 9, st.dictionaries(_NAMEISH, _SCALAR, max_size=1))
_ATTRS = st.one_of(
    st.none(),
    st.dictionaries(_mostly(_NAMEISH), _mostly(_NAMEISH), max_size=3),
)
_CAPABILITY = _mostly(
    st.builds(
        lambda name, attrs, extra: {"capability": name, **attrs, **extra},
        _mostly(st.from_regex(r"[a-z][a-z0-9._-]{0,8}", fullmatch=True)),
        _maybe("attrs", _mostly(_ATTRS)),
        _EXTRA,
    )
)
_POLICY = st.one_of(
    st.none(),
    st.builds(
        lambda drain, extra: {**drain, **extra},
        _maybe("drain", _mostly(st.sampled_from(["", "soft", "hard", "weird"]))),
        _EXTRA,
    ),
    _ODD_VALUE,
)
_ADVERT = st.builds(
    lambda node_id, label, instance, caps, policy, extra: {
        **node_id,
        **label,
        **instance,
        **caps,
        **policy,
        **extra,
    },
    st.one_of(_maybe("node_id", _mostly(_NAMEISH)), st.just({"node_id": "n1"})),
    _maybe("label", _mostly(st.one_of(st.none(), st.text(max_size=5)))),
    _maybe("instance", _mostly(st.one_of(st.none(), _NAMEISH))),
    _maybe("capabilities", st.one_of(st.none(), st.lists(_CAPABILITY, max_size=3), _ODD_VALUE)),
    _maybe("policy", _POLICY),
    _EXTRA,
)


# What an agent sends: every part of its type, most within their bounds, text now and then
# with what the schema replaces.
_USUAL = st.builds(
    lambda node_id, label, instance, caps, policy: {
        "node_id": node_id,
        **label,
        **instance,
        **caps,
        **policy,
    },
    st.one_of(_NAMEISH, st.just("a" * 200)),
    _maybe("label", st.one_of(st.none(), st.text(max_size=5), _ODD_TEXT)),
    _maybe("instance", st.one_of(st.none(), _NAMEISH, _ODD_TEXT)),
    _maybe(
        "capabilities",
        st.one_of(
            st.none(),
            st.lists(
                st.builds(
                    lambda name, attrs: {"capability": name, **attrs},
                    st.from_regex(r"[a-z][a-z0-9._-]{0,8}", fullmatch=True),
                    _maybe(
                        "attrs",
                        st.one_of(
                            st.none(),
                            st.dictionaries(
                                st.one_of(_NAMEISH, _BOUNDS), st.one_of(_NAMEISH, _ODD_TEXT)
                            ),
                        ),
                    ),
                ),
                max_size=3,
            ),
        ),
    ),
    _maybe("policy", st.one_of(st.none(), _maybe("drain", st.sampled_from(["", "soft"])))),
)


def _load(body: Any) -> Any:
    try:
        return SCHEMA.load(body)
    except ValidationError as exc:
        return ("refused", exc.messages)


@settings(max_examples=600, deadline=None)
@given(st.one_of(_USUAL, _ADVERT))
def test_what_the_fast_path_takes_it_loads_as_marshmallow_does(body: dict[str, Any]) -> None:
    fast = SCHEMA.fast_load(body)
    if fast is not None:
        assert fast == _load(body)


def test_the_agents_usual_adverts_take_the_fast_path() -> None:
    usual = [
        {"node_id": "n1", "capabilities": [{"capability": "board", "attrs": {"soc": "x"}}]},
        {
            "node_id": "lab-3.rack:7@site",
            "label": "Rack 7, slot 3",
            "instance": "boot-1f3e",
            "capabilities": [
                {"capability": "board", "attrs": {"soc": "imx8", "slot": "s1"}},
                {"capability": "host"},
                {"capability": "power", "attrs": None},
            ],
            "policy": {"drain": ""},
        },
        {"node_id": "n2", "capabilities": None, "policy": None, "label": None},
        {"node_id": "n3", "policy": {}},
        {"node_id": "n4", "policy": {"drain": "soft"}},
    ]
    for body in usual:
        fast = SCHEMA.fast_load(body)
        assert fast is not None, body
        assert fast == SCHEMA.load(body)


def test_bodies_it_does_not_take_are_left_to_the_schema() -> None:
    for body in (
        {"node_id": "n1", "extra": 1},  # an older agent's field: the schema drops it
        {"node_id": "n1\n"},  # marshmallow's $ takes a trailing newline
        {"node_id": "n1", "label": "a\x00b"},  # replaced by U+FFFD, not refused
        {"node_id": "n1", "capabilities": [{"capability": "Board"}]},  # refused, with its reason
        {"node_id": "n1", "policy": {"drain": ["x"]}},
        {"node_id": "n1", "capabilities": [{"capability": "board", "attrs": {"": "x"}}]},
        {"node_id": "n1", "capabilities": [{"capability": "b", "attrs": {"k": "v" * 1025}}]},
        {"capabilities": []},  # node_id is missing
    ):
        assert SCHEMA.fast_load(body) is None, body
