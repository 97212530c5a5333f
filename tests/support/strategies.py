"""Hypothesis strategies for what callers send the Mediator: contracts, adverts, results, answers,
query parameters and names — shaped like the real thing (so they reach the code behind the first
check) with hostile values anywhere: NUL and control characters, lone surrogates, numbers past 32
and 64 bits, floats at the edge of a double, wrong types, unknown keys, deep nesting; and which
Hypothesis profile is loaded (``ci`` or ``long``, tests/conftest.py).
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st


def hypothesis_profile() -> str:
    """The loaded Hypothesis profile (``HYPOTHESIS_PROFILE`` or ``--hypothesis-profile``), for a
    test module to read when it is collected, after both have been applied."""
    current = getattr(settings, "get_current_profile_name", None)
    return current() if current else os.environ.get("HYPOTHESIS_PROFILE", "ci")


# ---------------------------------------------------------------- scalars

HOSTILE_TEXT = [
    "",
    ".",
    "..",
    "../..",
    "a/b",
    "a\\b",
    "%2e%2e",
    "%2F",
    "\x00",
    "a\x00b",
    "\n",
    "a\nb",
    "\r\n",
    "\t",
    "\x1b[31m",
    "\x7f",
    "\u0085",
    "\u2028",
    "\ufeff",
    "\ud800",  # a lone surrogate: valid in a JSON string escape, not encodable as UTF-8
    "\udfff",
    "\U0001f600",
    "é",
    "e\u0301",
    " ",
    "x" * 201,
    "x" * 1025,
    "null",
    "true",
    "0",
    "-1",
    "1e309",
    "NaN",
    "'; drop table runs; --",
    "$(rm -rf /)",
    "{}",
    "[]",
]

NUMBERS = [
    0,
    -1,
    1,
    2**31 - 1,
    2**31,
    2**32,
    3221225477,  # 0xC0000005 as Windows reports it
    -(2**31) - 1,
    2**63 - 1,
    2**63,
    -(2**63),
    -(2**63) - 1,
    2**64,
    10**30,
    -(10**30),
    0.5,
    -0.0,
    1e308,
    -1e308,
    5e-324,
]

NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789._:@-"

text = st.one_of(
    st.sampled_from(HOSTILE_TEXT),
    st.text(max_size=30),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=10),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x20), max_size=5),
)
valid_name = st.text(alphabet=NAME_CHARS, min_size=1, max_size=20)
name = st.one_of(valid_name, valid_name, text)
numbers = st.one_of(st.sampled_from(NUMBERS), st.integers(), st.floats(allow_nan=False))
scalar = st.one_of(st.none(), st.booleans(), numbers, text)
json_value = st.recursive(
    scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
    max_leaves=12,
)


def sometimes(value: st.SearchStrategy[Any], p_other: int = 4) -> st.SearchStrategy[Any]:
    """Mostly ``value``; one time in ``p_other`` any JSON value at all (a wrong type)."""
    return st.one_of(*([value] * (p_other - 1)), json_value)


def with_extras(doc: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """The document as built, or with unknown keys added, or with one of its keys dropped."""
    extras = st.dictionaries(text, json_value, min_size=1, max_size=2)

    def vary(d: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
        choices = [st.just(d), st.just(d), extras.map(lambda e: {**e, **d})]
        if d:
            choices.append(
                st.sampled_from(sorted(d)).map(lambda k: {x: v for x, v in d.items() if x != k})
            )
        return st.one_of(choices)

    return doc.flatmap(vary)


# ---------------------------------------------------------------- contracts

CAPABILITIES = ["board", "scope", "agent.reason"]
ROLE_NAMES = ["dut", "host", "probe"]
STEP_IDS = ["a", "b", "c", "d"]
ARTIFACTS = ["out.json", "result.json", "decision", "log.txt", "_private"]
DURATIONS = ["30m", "4h", "1s", "0s", "-1h", "1h30m", "999999999h", "", "soon", "1.5h"]

schema_doc = st.fixed_dictionaries(
    {"type": st.sampled_from(["object", "string", "array", "number", "bogus"])},
    optional={
        "required": st.lists(st.sampled_from(["ok", "verdict", "x"]), max_size=3),
        "properties": st.dictionaries(
            st.sampled_from(["ok", "verdict", "x"]),
            st.fixed_dictionaries(
                {"type": st.sampled_from(["boolean", "string", "integer", "number"])},
                optional={"enum": st.lists(scalar, max_size=3)},
            ),
            max_size=3,
        ),
        "additionalProperties": st.booleans(),
        "pattern": st.just("^a"),
        "$ref": st.just("#/x"),
    },
)

role = st.fixed_dictionaries(
    {
        "as": sometimes(st.sampled_from(ROLE_NAMES) | name),
        "capability": sometimes(st.sampled_from(CAPABILITIES) | name),
    },
    optional={
        "count": sometimes(st.sampled_from([0, 1, 2, 3, -1, 2**31, 2**63])),
        "soc": sometimes(st.sampled_from(["imx8mp", "rk3588"]) | text),
        "attrs": json_value,
    },
)

step_ref = st.sampled_from(STEP_IDS) | name
step_kind = st.one_of(
    st.fixed_dictionaries({"run": sometimes(st.lists(text, min_size=0, max_size=3))}),
    st.fixed_dictionaries(
        {
            "agent": sometimes(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "model": text,
                        "max_turns": numbers,
                        "max_tokens": numbers,
                        "mcp": st.lists(text, max_size=2),
                        "bogus": json_value,
                    },
                )
            )
        }
    ),
    st.fixed_dictionaries(
        {
            "ask": sometimes(
                st.fixed_dictionaries(
                    {"prompt": sometimes(text)},
                    optional={
                        "answerers": st.lists(text, max_size=2),
                        "timeout": st.fixed_dictionaries(
                            {"after": st.sampled_from(DURATIONS) | text},
                            optional={"then": st.sampled_from(["fail", "pass"]) | text},
                        ),
                        "show": st.lists(st.sampled_from(ARTIFACTS), max_size=2),
                    },
                )
            )
        }
    ),
    st.fixed_dictionaries(
        {
            "acquire": sometimes(
                st.fixed_dictionaries({"want": role, "acquired": step_ref, "unavailable": step_ref})
            )
        }
    ),
)
step = st.tuples(
    step_kind,
    st.fixed_dictionaries(
        {"id": sometimes(st.sampled_from(STEP_IDS) | name)},
        optional={
            "uses": sometimes(st.sampled_from(ROLE_NAMES) | name),
            "needs": sometimes(st.lists(step_ref, max_size=3)),
            "out": sometimes(st.lists(st.sampled_from(ARTIFACTS) | name, max_size=3)),
            "schema": sometimes(
                st.dictionaries(st.sampled_from(ARTIFACTS), schema_doc, max_size=2)
            ),
            "in": sometimes(
                st.fixed_dictionaries(
                    {}, optional={"prompt": text, "from": st.lists(st.sampled_from(ARTIFACTS))}
                )
            ),
            "env": sometimes(st.lists(text, max_size=3)),
            "collect": sometimes(st.dictionaries(st.sampled_from(ARTIFACTS), text, max_size=2)),
            "release": sometimes(st.lists(st.sampled_from(ROLE_NAMES), max_size=2)),
            "loop": sometimes(
                st.fixed_dictionaries(
                    {"back_to": step_ref, "max": numbers},
                    optional={"until": st.fixed_dictionaries({}, optional={"exit_code": numbers})},
                )
            ),
            "dispatch": sometimes(
                st.fixed_dictionaries({"from": text, "to": st.lists(step_ref, max_size=3)})
            ),
            "validate_with": sometimes(step_ref),
            "max_attempts": sometimes(numbers),
            "workspace": sometimes(st.fixed_dictionaries({"repo": text, "rev": text})),
        },
    ),
).map(lambda t: {**t[1], **t[0]})

condition = st.one_of(
    st.fixed_dictionaries(
        {"step": step_ref},
        optional={
            "exit_code": sometimes(numbers),
            "produced": sometimes(st.lists(st.sampled_from(ARTIFACTS) | name, max_size=2)),
            "within_attempts": sometimes(st.booleans()),
            "changed": sometimes(st.lists(text, max_size=2)),
        },
    ),
    st.fixed_dictionaries({"fleet_has": role}, optional={"min_count": sometimes(numbers)}),
)

any_contract = with_extras(
    st.fixed_dictionaries(
        {
            "run_id": sometimes(valid_name | name),
            "requires": sometimes(st.lists(role, min_size=1, max_size=3)),
            "steps": sometimes(st.lists(step, min_size=1, max_size=4)),
        },
        optional={
            "success_when": sometimes(st.lists(condition, max_size=2)),
            "work": sometimes(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "id": st.fixed_dictionaries(
                            {}, optional={"system": text, "change_id": text}
                        ),
                        "system": text,
                        "change_id": text,
                        "patchset": numbers,
                        "revs": st.lists(text, max_size=2),
                    },
                )
            ),
            "ledger": sometimes(
                st.fixed_dictionaries({"scope": st.sampled_from(["run", "work"]) | text})
            ),
            "queue": sometimes(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "timeout": st.sampled_from(DURATIONS) | text,
                        "priority": sometimes(numbers),
                    },
                )
            ),
            "lease": json_value,
        },
    )
)

# ---------------------------------------------------------------- adverts

capability_entry = with_extras(
    st.fixed_dictionaries(
        {"capability": sometimes(st.sampled_from(CAPABILITIES) | name)},
        optional={
            "attrs": sometimes(
                st.one_of(
                    st.none(),
                    st.dictionaries(st.sampled_from(["soc", "rev"]) | text, sometimes(text)),
                )
            )
        },
    )
)

any_advert = with_extras(
    st.fixed_dictionaries(
        {"node_id": sometimes(st.sampled_from(["n1", "n2", "hostile-1"]) | name)},
        optional={
            "label": sometimes(text),
            "instance": sometimes(st.sampled_from(["i-1", "i-2"]) | text),
            "capabilities": sometimes(st.one_of(st.none(), st.lists(capability_entry, max_size=4))),
            "policy": sometimes(
                st.one_of(
                    st.none(),
                    st.fixed_dictionaries(
                        {},
                        optional={
                            "drain": st.sampled_from(["", "graceful", "at-boundary"]) | scalar
                        },
                    ),
                )
            ),
        },
    )
)

# ---------------------------------------------------------------- results and answers


def any_result(node: str) -> st.SearchStrategy[dict[str, Any]]:
    """A step result as an agent reports it, mostly from the node that holds the step."""
    return with_extras(
        st.fixed_dictionaries(
            {"node": sometimes(st.just(node) | name, 3)},
            optional={
                "exit_code": sometimes(st.one_of(st.none(), numbers), 3),
                "produced": sometimes(st.lists(st.sampled_from(ARTIFACTS) | name, max_size=3)),
                "error": sometimes(st.one_of(st.none(), text)),
                "harness": json_value,
                "workspace": json_value,
                "changed": json_value,
                "exited_at": sometimes(
                    st.sampled_from(["2026-01-01T00:00:00Z", "yesterday", "9999-99-99"]) | text
                ),
                "diagnostics": json_value,
                "environment": json_value,
                "nonce": sometimes(st.one_of(st.none(), text)),
            },
        )
    )


# The ask's answer schema used by the answer tests: {verdict: approve|reject, note?: string,
# score?: integer}.
ANSWER_SCHEMA = {
    "type": "object",
    "required": ["verdict"],
    "properties": {
        "verdict": {"enum": ["approve", "reject"]},
        "note": {"type": "string"},
        "score": {"type": "integer"},
    },
}

any_answer = with_extras(
    st.fixed_dictionaries(
        {"verdict": sometimes(st.sampled_from(["approve", "reject"]) | text)},
        optional={"note": sometimes(text), "score": sometimes(numbers)},
    )
)

# ---------------------------------------------------------------- queries and headers

TIMESTAMPS = [
    "2026-01-01T00:00:00Z",
    "2026-01-01T00:00:00+00:00",
    "2026-13-01T00:00:00Z",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "10000-01-01T00:00:00Z",
    "2026-01-01",
    "1700000000",
]
STATES = ["QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "queued", "ANY", ""]
query_value = st.one_of(
    st.sampled_from(TIMESTAMPS + STATES),
    st.sampled_from(TIMESTAMPS).map(lambda t: f"{t},run-1"),
    st.sampled_from(TIMESTAMPS).map(lambda t: f"{t},a\x00"),
    st.sampled_from(NUMBERS).map(str),
    text,
)
runs_query = st.dictionaries(
    st.sampled_from(["state", "since", "work", "limit", "before", "x"]), query_value, max_size=4
)
header_value = st.one_of(
    st.sampled_from(["qa@example.com", "", "x" * 201, "a\x00b", "é@example.com"]),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=30),
)


# ---------------------------------------------------------------- valid documents, then one change


def _paths(doc: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document: the keys of its objects and the indexes of its arrays."""
    found = [here]
    if isinstance(doc, dict):
        for k, v in doc.items():
            found += _paths(v, (*here, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            found += _paths(v, (*here, i))
    return found


def _changed(doc: Any, path: tuple[Any, ...], how: str, value: Any) -> Any:
    if not path:
        return value if how != "add" or not isinstance(doc, dict) else {**doc, "extra": value}
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        out = dict(doc)
        if not rest and how == "drop":
            out.pop(head, None)
        else:
            out[head] = _changed(doc[head], rest, how, value)
        return out
    out_list = list(doc)
    if not rest and how == "drop":
        del out_list[head]
    else:
        out_list[head] = _changed(doc[head], rest, how, value)
    return out_list


def _value_at(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


hostile_int = st.one_of(st.sampled_from([n for n in NUMBERS if isinstance(n, int)]), st.integers())


def changed_once(doc: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A document with one place changed: its value replaced by a hostile one of the same type
    (a string by a hostile string, an integer by one past 32 or 64 bits) or of any type, dropped,
    or an unknown key added beside it. Everything else stays valid, so the change is what is
    tested — and a value of the right type gets past the type checks to the code behind them."""

    def change(t: tuple[Any, int, str, Any, str, int]) -> Any:
        d, pick, how, value, as_text, as_int = t
        places = _paths(d)[1:] or [()]  # the root itself only when there is nothing inside
        place = places[pick % len(places)]
        if how == "retype":
            old = _value_at(d, place)
            if isinstance(old, str):
                value = as_text
            elif isinstance(old, int) and not isinstance(old, bool):
                value = as_int
            how = "replace"
        return _changed(d, place, how, value)

    return st.tuples(
        doc,
        st.integers(min_value=0, max_value=10_000),
        st.sampled_from(["retype", "retype", "retype", "replace", "drop", "add"]),
        json_value,
        text,
        hostile_int,
    ).map(change)


def hostile(doc: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Valid, changed once, changed twice: in about equal shares."""
    return st.one_of(doc, changed_once(doc), changed_once(changed_once(doc)))


@st.composite
def valid_contract(draw: st.DrawFn) -> dict[str, Any]:
    """A contract that validation takes (or refuses for a reason deep inside, not its shape)."""
    roles = draw(st.lists(st.sampled_from(ROLE_NAMES), min_size=1, max_size=3, unique=True))
    requires = []
    for r in roles:
        req: dict[str, Any] = {"as": r, "capability": draw(st.sampled_from(CAPABILITIES))}
        if draw(st.booleans()):
            req["soc"] = draw(st.sampled_from(["imx8mp", "rk3588"]))
        if draw(st.integers(0, 4)) == 0:
            req["count"] = draw(st.integers(1, 3))
        requires.append(req)
    steps: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 5))):
        sid = f"s{i + 1}"
        kind = draw(st.sampled_from(["run", "run", "run", "agent", "ask"]))
        s: dict[str, Any] = {"id": sid}
        if kind == "run":
            s["uses"] = draw(st.sampled_from(roles))
            s["run"] = draw(st.lists(st.sampled_from(["make", "check", "-j4", "é"]), min_size=1))
        elif kind == "agent":
            s["uses"] = draw(st.sampled_from(roles))
            s["agent"] = {"model": "m", "max_turns": draw(st.integers(1, 50))}
            s["in"] = {"prompt": "do it"}
        else:
            s["ask"] = {"prompt": "ok?", "timeout": {"after": "4h", "then": "fail"}}
            s["out"] = ["decision"]
            s["schema"] = {"decision": ANSWER_SCHEMA}
        if kind != "ask" and draw(st.booleans()):
            s["out"] = draw(st.lists(st.sampled_from(["out.json", "log.txt"]), unique=True))
        if i and draw(st.booleans()):
            s["needs"] = draw(
                st.lists(st.sampled_from([f"s{j + 1}" for j in range(i)]), unique=True)
            )
        steps.append(s)
    doc: dict[str, Any] = {
        "run_id": draw(valid_name),
        "requires": requires,
        "steps": steps,
    }
    if draw(st.booleans()):
        doc["success_when"] = [{"step": steps[-1]["id"]}]
    if draw(st.booleans()):
        doc["work"] = {"id": {"system": "gerrit", "change_id": draw(valid_name)}}
    if draw(st.integers(0, 3)) == 0:
        doc["queue"] = {"timeout": draw(st.sampled_from(["30m", "4h", "1s"]))}
    return doc


def valid_advert(node_ids: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    entry = st.fixed_dictionaries(
        {
            "capability": st.sampled_from(CAPABILITIES),
            "attrs": st.dictionaries(
                st.sampled_from(["soc", "rev"]), st.sampled_from(["imx8mp", "rk3588", "2"])
            ),
        }
    )
    return st.fixed_dictionaries(
        {"node_id": st.sampled_from(node_ids), "capabilities": st.lists(entry, max_size=3)},
        optional={
            "label": st.sampled_from(["lab rack 3", ""]),
            "instance": st.sampled_from(["i-1", "i-2"]),
            "policy": st.fixed_dictionaries(
                {"drain": st.sampled_from(["", "graceful", "at-boundary"])}
            ),
        },
    )


def valid_result(node: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"node": st.just(node), "exit_code": st.one_of(st.integers(-5, 5), hostile_int)},
        optional={
            "produced": st.lists(st.sampled_from(["out.json", "log.txt"]), unique=True),
            "error": st.one_of(st.sampled_from(["", "segfault"]), text),
            "exited_at": st.just("2026-01-01T00:00:00Z"),
        },
    )


valid_answer = st.fixed_dictionaries(
    {"verdict": st.sampled_from(["approve", "reject"])},
    optional={"note": st.sampled_from(["fine", ""]), "score": st.integers(0, 10)},
)


# ---------------------------------------------------------------- what the tests draw from

contract = st.one_of(hostile(valid_contract()), any_contract)
advert = st.one_of(hostile(valid_advert(["n1", "n2", "hostile-1"])), any_advert)


def result(node: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(hostile(valid_result(node)), any_result(node))


answer_body = st.one_of(
    st.one_of(hostile(valid_answer), any_answer, json_value).map(lambda d: ("json", d)),
    st.binary(max_size=40).map(lambda b: ("raw", b)),
)
