"""Contract validation and needs normalisation (docs/contract.md#validation-errors). Pure: no
database, no fixtures."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.contract import Contract, Role, StepDef, parse_duration, validate_contract
from app.contract.fields import check_field, check_json_depth, parse_requirement, requires_key
from app.errors import BadRequest

# ------------------------------------------------------------------------------------- helpers


def spec_example() -> dict[str, Any]:
    """A contract like that of docs/contract.md#a-first-contract: two roles, a run, an ask."""
    return {
        "run_id": "kernel-4711-boot",
        "work": {"id": {"system": "gerrit", "change_id": "4711"}},
        "requires": [
            {"as": "dut", "capability": "board", "soc": "imx8mp"},
            {"as": "host", "capability": "agent.reason"},
        ],
        "steps": [
            {
                "id": "flash",
                "uses": "host",
                "run": ["flash-image", "--soc", "imx8mp"],
                "out": ["flash.log"],
            },
            {
                "id": "boot",
                "uses": "dut",
                "run": ["boot-test"],
                "out": ["result.json"],
                "schema": {
                    "result.json": {
                        "type": "object",
                        "required": ["ok"],
                        "properties": {"ok": {"type": "boolean"}},
                    }
                },
            },
            {
                "id": "sign-off",
                "ask": {
                    "prompt": "Boot log looks right?",
                    "answerers": ["qa@example.com"],
                    "timeout": {"after": "4h", "then": "fail"},
                },
                "out": ["decision"],
                "schema": {
                    "decision": {
                        "type": "object",
                        "required": ["verdict"],
                        "properties": {"verdict": {"enum": ["approve", "reject"]}},
                    }
                },
            },
        ],
        "success_when": [{"step": "boot", "exit_code": 0, "produced": ["result.json"]}],
    }


def contract(steps: list[dict[str, Any]] | None = None, **top: Any) -> dict[str, Any]:
    """A small valid contract: roles "dut" and "host", one run step per role unless given."""
    doc: dict[str, Any] = {
        "run_id": "r1",
        "requires": [{"as": "dut", "capability": "board"}, {"as": "host", "capability": "host"}],
        "steps": steps
        if steps is not None
        else [
            {"id": "a", "uses": "dut", "run": ["x"], "out": ["a.out"]},
            {"id": "b", "uses": "host", "run": ["y"], "out": ["b.out"]},
        ],
    }
    doc.update(top)
    return doc


def run(sid: str, uses: str = "dut", **fields: Any) -> dict[str, Any]:
    return {"id": sid, "uses": uses, "run": ["cmd"], **fields}


def agent(sid: str, uses: str = "host", **fields: Any) -> dict[str, Any]:
    return {"id": sid, "uses": uses, "agent": {"model": "m"}, **fields}


def ask(sid: str, **fields: Any) -> dict[str, Any]:
    return {"id": sid, "ask": {"prompt": "ok?"}, "out": ["decision"], **fields}


def acquire(sid: str, role: str, acquired: str, unavailable: str) -> dict[str, Any]:
    return {
        "id": sid,
        "acquire": {
            "want": {"as": role, "capability": "board"},
            "acquired": acquired,
            "unavailable": unavailable,
        },
    }


def reason(doc: object, **kwargs: Any) -> str:
    with pytest.raises(BadRequest) as caught:
        validate_contract(doc, **kwargs)
    assert caught.value.status == 400
    return caught.value.reason


def with_step(index: int, **fields: Any) -> dict[str, Any]:
    """The default contract with fields set on one of its steps."""
    doc = contract()
    doc["steps"][index].update(fields)
    return doc


def needs_of(doc: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    return {s.id: s.needs for s in validate_contract(doc).steps}


# ------------------------------------------------------------------------ the happy path, output


def test_spec_example_is_valid_and_normalised():
    c = validate_contract(spec_example(), capabilities=["board", "agent.reason"])
    assert isinstance(c, Contract)
    assert c.run_id == "kernel-4711-boot"
    assert c.work_id == "gerrit:4711"
    assert c.requires == (
        Role("dut", "board", 1, {"soc": "imx8mp"}),
        Role("host", "agent.reason", 1, {}),
    )
    assert [(s.seq, s.id, s.kind, s.uses, s.needs) for s in c.steps] == [
        (1, "flash", "run", "host", ()),
        (2, "boot", "run", "dut", (1,)),
        (3, "sign-off", "ask", None, (2,)),
    ]
    assert all(isinstance(s, StepDef) for s in c.steps)
    assert c.success_when == ({"step": "boot", "exit_code": 0, "produced": ["result.json"]},)
    assert c.ledger_scope == "run"
    assert c.queue_timeout_seconds is None
    assert c.warnings == ()
    assert c.document == spec_example()
    assert c.requires_key == requires_key(c.requires)


def test_step_spec_is_the_step_as_submitted():
    c = validate_contract(spec_example())
    assert c.steps[1].spec == spec_example()["steps"][1]


def test_seq_is_the_one_based_position():
    steps = [run(f"s{i}") for i in range(7)]
    assert [s.seq for s in validate_contract(contract(steps)).steps] == list(range(1, 8))


def test_document_is_a_copy_the_caller_cannot_change():
    doc = contract()
    c = validate_contract(doc)
    doc["steps"][0]["run"].append("later")
    doc["run_id"] = "other"
    assert c.document["steps"][0]["run"] == ["x"]
    assert c.document["run_id"] == "r1"


def test_lease_block_is_ignored_dropped_from_document_and_warned_about():
    doc = contract(lease={"ttl_seconds": 1, "whatever": [1, 2]})
    c = validate_contract(doc)
    assert "lease" not in c.document
    assert c.warnings == ("the contract's lease block is ignored: lease times are the server's",)


def test_lease_block_of_any_shape_is_ignored():
    assert validate_contract(contract(lease="nonsense")).run_id == "r1"


def test_role_count_defaults_to_1_and_attributes_are_collected():
    doc = contract()
    doc["requires"][0] = {"as": "dut", "capability": "board", "count": 3, "soc": "x", "rev": "2"}
    role = validate_contract(doc).requires[0]
    assert role == Role("dut", "board", 3, {"soc": "x", "rev": "2"})
    assert validate_contract(contract()).requires[1].count == 1


def test_ask_and_acquire_steps_have_no_uses():
    steps = [
        run("a"),
        acquire("grab", "extra", "use-it", "skip"),
        run("use-it", uses="extra"),
        ask("skip"),
        run("b", uses="host"),
    ]
    kinds = {s.id: (s.kind, s.uses) for s in validate_contract(contract(steps)).steps}
    assert kinds == {
        "a": ("run", "dut"),
        "grab": ("acquire", None),
        "use-it": ("run", "extra"),
        "skip": ("ask", None),
        "b": ("run", "host"),
    }


def test_agent_step_is_valid_with_every_agent_field():
    body = {
        "model": "m",
        "max_turns": 3,
        "max_tokens": 1000,
        "ask": True,
        "harness": "h",
        "mcp": ["fs"],
        "pack": {"any": "thing"},
    }
    steps = [{"id": "think", "uses": "host", "agent": body, "in": {"prompt": "do it"}}, run("b")]
    assert validate_contract(contract(steps)).steps[0].kind == "agent"


def test_queue_timeout_is_parsed_to_seconds():
    assert validate_contract(contract(queue={"timeout": "30m"})).queue_timeout_seconds == 1800
    assert validate_contract(contract(queue={"timeout": "1h30m"})).queue_timeout_seconds == 5400


@pytest.mark.parametrize(
    ("timeout", "seconds"),
    [("1.5h", 5400), ("90s", 90), ("2h45m30.5s", 9931), ("250ms", 1), ("1ns", 1)],
)
def test_a_go_queue_timeout_is_kept_in_whole_seconds_rounded_up(timeout, seconds):
    c = validate_contract(contract(queue={"timeout": timeout}))
    assert c.queue_timeout_seconds == seconds


def test_queue_without_timeout_means_none():
    assert validate_contract(contract(queue={})).queue_timeout_seconds is None


def test_ledger_scope_defaults_to_run_and_accepts_work():
    assert validate_contract(contract()).ledger_scope == "run"
    assert validate_contract(contract(ledger={})).ledger_scope == "run"
    assert validate_contract(contract(ledger={"scope": "work"})).ledger_scope == "work"


def test_every_optional_step_field_together_is_valid():
    steps = [
        run(
            "build",
            uses="host",
            out=["report.json", "bin"],
            schema={"report.json": {"type": "object", "additionalProperties": False}},
            env=["CC", "_PATH"],
            workspace={"repo": "https://git.example/x.git", "rev": "main"},
            collect={"bin": "out/bin", "report.json": "report.json"},
            **{"in": {"prompt": "p", "from": []}},
        ),
        run("test", uses="dut", out=["log"], release=["dut"], needs=["build"]),
    ]
    assert validate_contract(contract(steps)).steps[1].needs == (1,)


# ------------------------------------------------------------------------------- work key forms


@pytest.mark.parametrize(
    ("work", "expected"),
    [
        ({"id": {"system": "gerrit", "change_id": "4711"}}, "gerrit:4711"),
        ({"system": "github", "change_id": "pr-9"}, "github:pr-9"),
        (
            {"id": {"system": "gerrit", "change_id": "1"}, "system": "gh", "change_id": "2"},
            "gerrit:1",
        ),
        ({"id": {"system": "gerrit"}, "system": "gh", "change_id": "2"}, "gh:2"),
        ({"id": {"system": "gerrit"}}, ""),
        ({"system": "gh"}, ""),
        ({}, ""),
    ],
    ids=[
        "id-form",
        "top-form",
        "id-form-wins",
        "incomplete-id-falls-back",
        "incomplete-id",
        "incomplete-top",
        "empty",
    ],
)
def test_work_key_forms(work, expected):
    assert validate_contract(contract(work=work)).work_id == expected


def test_no_work_means_empty_work_id():
    assert validate_contract(contract()).work_id == ""


# ------------------------------------------------------------------------------ needs defaults


def test_needs_default_to_the_previous_step_and_the_first_waits_for_nothing():
    steps = [run("a"), run("b"), run("c")]
    assert needs_of(contract(steps)) == {"a": (), "b": (1,), "c": (2,)}


def test_explicit_empty_needs_start_at_once():
    steps = [run("a"), run("b", needs=[]), run("c")]
    assert needs_of(contract(steps)) == {"a": (), "b": (), "c": (2,)}


def test_explicit_needs_are_stored_as_ascending_distinct_seqs():
    steps = [run("a"), run("b"), run("c"), run("d", needs=["c", "a", "c"])]
    assert needs_of(contract(steps))["d"] == (1, 3)


def test_dispatch_targets_default_to_needing_the_dispatcher():
    steps = [
        run("classify", out=["kind.json"], dispatch={"from": "kind.json.next", "to": ["x", "y"]}),
        run("x"),
        run("y"),
        run("z"),
    ]
    assert needs_of(contract(steps)) == {"classify": (), "x": (1,), "y": (1,), "z": (3,)}


def test_acquire_targets_default_to_needing_the_acquire_step():
    steps = [
        run("a"),
        acquire("grab", "extra", "with-node", "without-node"),
        run("with-node", uses="extra"),
        run("without-node"),
    ]
    assert needs_of(contract(steps)) == {
        "a": (),
        "grab": (1,),
        "with-node": (2,),
        "without-node": (2,),
    }


def test_explicit_needs_win_over_the_branch_default():
    steps = [
        run("classify", out=["k"], dispatch={"from": "k.v", "to": ["x", "y"]}),
        run("x"),
        run("y", needs=["x"]),
    ]
    assert needs_of(contract(steps))["y"] == (2,)


# ---------------------------------------------------------------------------------- requires_key


def test_requires_key_is_sha256_of_the_canonical_normalised_roles():
    roles = (Role("dut", "board", 2, {"soc": "imx8mp", "a": "1"}), Role("host", "host"))
    canonical = '[["dut","board",2,[["a","1"],["soc","imx8mp"]]],["host","host",1,[]]]'
    assert requires_key(roles) == hashlib.sha256(canonical.encode()).hexdigest()


def test_requires_key_does_not_depend_on_attribute_order():
    one = contract()
    one["requires"][0] = {"as": "dut", "capability": "board", "soc": "x", "rev": "2"}
    two = contract()
    two["requires"][0] = {"rev": "2", "capability": "board", "soc": "x", "as": "dut"}
    assert validate_contract(one).requires_key == validate_contract(two).requires_key


def test_requires_key_does_not_depend_on_the_rest_of_the_contract():
    other = contract(run_id="r2", steps=[run("only", uses="host"), run("two")])
    assert validate_contract(contract()).requires_key == validate_contract(other).requires_key


def test_requires_key_is_stable_for_an_explicit_count_of_1():
    explicit = contract()
    explicit["requires"][0]["count"] = 1
    assert validate_contract(explicit).requires_key == validate_contract(contract()).requires_key


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r[0].update(count=2),
        lambda r: r[0].update(soc="x"),
        lambda r: r[0].update(capability="other"),
        lambda r: r.reverse(),
    ],
    ids=["count", "attribute", "capability", "role-order"],
)
def test_requires_key_changes_with_the_shape(change: Callable[[list], None]):
    changed = contract()
    change(changed["requires"])
    assert validate_contract(changed).requires_key != validate_contract(contract()).requires_key


# -------------------------------------------------------------------------------------- warnings


def test_a_role_no_step_uses_is_a_warning():
    c = validate_contract(contract([run("a")]))
    assert c.warnings == (
        'role "host" is declared in requires but no step uses it; '
        "its node is held for the whole run",
    )


def test_an_acquired_role_no_step_uses_is_a_warning():
    steps = [run("a"), acquire("grab", "extra", "b", "c"), run("b", uses="host"), run("c")]
    c = validate_contract(contract(steps))
    assert c.warnings == ('step "grab" acquires role "extra" but no step uses it',)


def test_an_artifact_nobody_reads_is_not_a_warning():
    assert validate_contract(contract()).warnings == ()


def test_warnings_about_ignored_fields_follow_the_document_after_the_lease_and_before_roles():
    doc = contract(
        [run("a", colour="red")],
        success_when=[{"step": "a", "why": "x"}],
        lease={"ttl_seconds": 60},
        zzz=1,
    )
    assert validate_contract(doc).warnings == (
        "the contract's lease block is ignored: lease times are the server's",
        "zzz: unknown field, ignored",
        "steps[0].colour: unknown field, ignored",
        "success_when[0].why: unknown field, ignored",
        'role "host" is declared in requires but no step uses it; '
        "its node is held for the whole run",
    )


def test_warnings_about_ignored_fields_are_bounded():
    doc = contract([run("a", **{f"f{i}": i for i in range(60)})])
    doc["requires"] = doc["requires"][:1]
    warnings = validate_contract(doc).warnings
    assert len(warnings) == 51
    assert warnings[0] == "steps[0].f0: unknown field, ignored"
    assert warnings[49] == "steps[0].f49: unknown field, ignored"
    assert warnings[50] == "and 10 more unknown fields, ignored"


# ------------------------------------------------------------------------------- parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("30m", 1800),
        ("4h", 14400),
        ("2d", 172800),
        ("1h30m", 5400),
        ("1d2h3m4s", 93784),
        ("0s", 0),
        ("90m", 5400),
        # Go durations (docs/contract.md#top-level), as time.ParseDuration reads them
        ("1.5h", 5400),
        ("90s", 90),
        ("250ms", 0.25),
        ("2h45m30.5s", 9930.5),
        ("1.5s", 1.5),
        (".5s", 0.5),
        ("1.s", 1),
        ("1m1h", 3660),
        ("1h1h", 7200),
        ("1s500ms", 1.5),
        ("1500us", 0.0015),
        ("1500\u00b5s", 0.0015),
        ("1500\u03bcs", 0.0015),
        ("1500000000ns", 1.5),
        ("0", 0),
        ("+1h", 3600),
        ("-0s", 0),
    ],
)
def test_parse_duration_accepts(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("after", ["1.5h", "250ms", "2h45m30.5s", "1h30m", "4h"])
def test_an_ask_timeout_takes_a_go_duration(after):
    doc = contract([run("a"), ask("q", ask={"prompt": "ok?", "timeout": {"after": after}})])
    assert validate_contract(doc).steps[1].spec["ask"]["timeout"]["after"] == after


def test_parse_duration_drops_a_fraction_of_a_nanosecond_as_go_does():
    assert parse_duration("1.9ns") == 1e-9


@pytest.mark.parametrize(
    "text",
    [
        "",
        "30",
        "00",
        "m",
        ".s",
        ".",
        "+",
        "1.5.5h",
        "1hm",
        "1e3s",
        "1 h",
        " 1h",
        "1h ",
        "1H",
        "1MS",
        "-1s",
        "-1.5h",
        "\uff11h",
        "1w",
        "1h\n",
    ],
)
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("value", [None, 30, ["1h"], True])
def test_parse_duration_rejects_non_strings_with_value_error(value):
    with pytest.raises(ValueError):
        parse_duration(value)


def test_parse_duration_rejects_a_duration_that_does_not_fit_an_integer_column():
    with pytest.raises(ValueError):
        parse_duration("99999999999d")


@given(
    st.one_of(st.none(), st.integers(0, 9999)),
    st.one_of(st.none(), st.integers(0, 9999)),
    st.one_of(st.none(), st.integers(0, 9999)),
    st.one_of(st.none(), st.integers(0, 9999)),
)
def test_parse_duration_round_trips(days, hours, minutes, seconds):
    parts = list(zip((days, hours, minutes, seconds), "dhms", strict=True))
    text = "".join(f"{n}{unit}" for n, unit in parts if n is not None)
    if not text:
        with pytest.raises(ValueError):
            parse_duration(text)
        return
    want = sum((n or 0) * k for n, k in zip((days, hours, minutes, seconds), (86400, 3600, 60, 1)))
    assert parse_duration(text) == want


@given(st.text(max_size=20))
def test_parse_duration_raises_only_value_error(text):
    try:
        assert parse_duration(text) >= 0
    except ValueError:
        pass


# ------------------------------------------------------------------------------ check_json_depth


def nested(depth: int) -> object:
    obj: object = "leaf"
    for i in range(depth):
        obj = [obj] if i % 2 else {"k": obj}
    return obj


def test_json_depth_of_32_is_fine_and_33_is_not():
    check_json_depth(nested(32))
    with pytest.raises(BadRequest) as caught:
        check_json_depth(nested(33))
    assert caught.value.reason == "JSON nesting deeper than 32"


def test_json_depth_of_scalars_is_zero():
    check_json_depth("x", max_depth=0)


def test_json_depth_survives_nesting_that_would_overflow_recursion():
    with pytest.raises(BadRequest):
        check_json_depth(nested(100_000))


def test_a_too_deep_contract_is_400_even_inside_the_ignored_lease_block():
    assert reason(contract(lease=nested(40))) == "JSON nesting deeper than 32"


# ---------------------------------------------------------------------------------- check_field


def field_reason(obj: dict[str, Any], expect: type, **kwargs: Any) -> str:
    with pytest.raises(BadRequest) as caught:
        check_field(obj, "f", "at.f", expect, **kwargs)
    assert caught.value.status == 400
    return caught.value.reason


def test_check_field_returns_a_value_that_passes():
    assert check_field({"f": ["a"]}, "f", "at.f", list, at_most=1) == ["a"]
    assert check_field({"f": "abc"}, "f", "at.f", str, at_most=3) == "abc"


def test_check_field_names_a_missing_field_as_required():
    assert field_reason({}, list) == "at.f is required"
    assert field_reason({}, str) == "at.f is required"


@pytest.mark.parametrize(
    ("obj", "kwargs", "expected"),
    [
        ({"f": {}}, {}, "at.f must be a non-empty list, got {}"),
        ({"f": []}, {}, "at.f must be a non-empty list, got []"),
        ({"f": "x"}, {"non_empty": False}, 'at.f must be a list, got "x"'),
        ({"f": [1, 2, 3]}, {"at_most": 2}, "at.f must have at most 2 entries, got 3"),
    ],
    ids=["not-a-list", "empty", "not-a-list-empty-allowed", "too-many"],
)
def test_check_field_list_reasons(obj, kwargs, expected):
    assert field_reason(obj, list, **kwargs) == expected


def test_check_field_allows_an_empty_list_when_told():
    assert check_field({"f": []}, "f", "at.f", list, non_empty=False, at_most=2) == []


@pytest.mark.parametrize(
    ("obj", "kwargs", "expected"),
    [
        ({"f": 5}, {}, "at.f must be a non-empty string, got 5"),
        ({"f": ""}, {}, 'at.f must be a non-empty string, got ""'),
        ({"f": None}, {"non_empty": False}, "at.f must be a string, got null"),
        ({"f": ""}, {"at_most": 3}, 'at.f must be a string of 1-3 characters, got ""'),
        ({"f": "abcd"}, {"at_most": 3}, 'at.f must be a string of 1-3 characters, got "abcd"'),
    ],
    ids=["not-a-string", "empty", "not-a-string-empty-allowed", "bounded-empty", "too-long"],
)
def test_check_field_string_reasons(obj, kwargs, expected):
    assert field_reason(obj, str, **kwargs) == expected


def test_check_field_allows_an_empty_string_when_told():
    assert check_field({"f": ""}, "f", "at.f", str, non_empty=False) == ""


# --------------------------------------------------------------------------------- top level


@pytest.mark.parametrize("doc", [[], "x", None, 3, True], ids=repr)
def test_contract_must_be_an_object(doc):
    assert reason(doc) == "contract must be a JSON object"


def test_an_unknown_top_level_field_is_ignored_with_a_warning_and_kept_in_the_document():
    c = validate_contract(contract(expands=[], priority=3))
    assert c.warnings == ("expands: unknown field, ignored", "priority: unknown field, ignored")
    assert c.document["expands"] == [] and c.document["priority"] == 3


def test_an_unknown_field_with_an_odd_name_is_quoted_in_its_warning():
    c = validate_contract(contract(**{"odd key": 1}))
    assert c.warnings == ('"odd key": unknown field, ignored',)


def test_run_id_is_required():
    doc = contract()
    del doc["run_id"]
    assert reason(doc) == "run_id is required"


@pytest.mark.parametrize(
    ("value", "shown"),
    [("a b", '"a b"'), ("", '""'), (5, "5"), (True, "true"), ("é", '"\\u00e9"')],
)
def test_run_id_must_be_a_name(value, shown):
    assert reason(contract(run_id=value)) == (
        f"run_id must be 1-200 characters of [A-Za-z0-9._:@-], got {shown}"
    )


def test_run_id_may_have_200_characters_but_not_201():
    assert validate_contract(contract(run_id="r" * 200)).run_id == "r" * 200
    assert reason(contract(run_id="r" * 201)).startswith("run_id must be 1-200 characters")


def test_a_long_offending_value_is_shortened_in_the_reason():
    text = reason(contract(run_id="r" * 5000))
    assert text.endswith('got "' + "r" * 76 + "...")


def test_run_id_accepts_every_allowed_character():
    rid = "Az09._:@-"
    assert validate_contract(contract(run_id=rid)).run_id == rid


@pytest.mark.parametrize(
    ("work", "expected"),
    [
        ("gerrit:1", 'work must be an object, got "gerrit:1"'),
        ({"url": "x"}, 'work: unknown field "url"'),
        ({"system": 5}, "work.system must be a string of 1-200 characters, got 5"),
        ({"change_id": ""}, 'work.change_id must be a string of 1-200 characters, got ""'),
        ({"id": "4711"}, 'work.id must be an object, got "4711"'),
        ({"id": {"patchset": "1"}}, 'work.id: unknown field "patchset"'),
        ({"id": {"system": None}}, "work.id.system must be a string of 1-200 characters, got null"),
    ],
    ids=["not-object", "unknown", "system", "empty", "id-not-object", "id-unknown", "id-system"],
)
def test_work_rules(work, expected):
    assert reason(contract(work=work)) == expected


def test_work_may_say_where_the_run_stands_which_leaves_the_work_key_alone():
    work = {
        "system": "gerrit",
        "change_id": "4711",
        "patchset": 3,
        "parent_rev": "a" * 40,
        "patch_rev": "b" * 40,
    }
    c = validate_contract(contract(work=work))
    assert c.work_id == "gerrit:4711"
    assert c.document["work"] == work


def test_work_revs_may_be_empty_as_the_original_client_sends_them():
    c = validate_contract(contract(work={"patchset": 0, "parent_rev": "", "patch_rev": ""}))
    assert c.work_id == ""


@pytest.mark.parametrize(
    ("work", "expected"),
    [
        ({"patchset": "3"}, 'work.patchset must be an integer, got "3"'),
        ({"patchset": True}, "work.patchset must be an integer, got true"),
        ({"patchset": 1.5}, "work.patchset must be an integer, got 1.5"),
        ({"parent_rev": 5}, "work.parent_rev must be a string of at most 200 characters, got 5"),
        (
            {"patch_rev": "r" * 201},
            f'work.patch_rev must be a string of at most 200 characters, got "{"r" * 76}...',
        ),
    ],
    ids=["patchset-string", "patchset-bool", "patchset-float", "parent_rev", "patch_rev-long"],
)
def test_work_position_rules(work, expected):
    assert reason(contract(work=work)) == expected


# ----------------------------------------------------------------------------------- requires


def with_role(**entry: Any) -> dict[str, Any]:
    doc = contract()
    doc["requires"][1] = entry
    return doc


def test_requires_is_required():
    doc = contract()
    del doc["requires"]
    assert reason(doc) == "requires is required"


@pytest.mark.parametrize(("value", "shown"), [([], "[]"), ({}, "{}"), ("dut", '"dut"')])
def test_requires_must_be_a_non_empty_list(value, shown):
    assert reason(contract(requires=value)) == f"requires must be a non-empty list, got {shown}"


def test_requires_has_at_most_50_entries():
    roles = [{"as": f"r{i}", "capability": "board"} for i in range(51)]
    assert reason(contract(requires=roles)) == "requires must have at most 50 entries, got 51"


def test_requires_of_50_entries_is_fine():
    roles = [{"as": "dut", "capability": "board"}, {"as": "host", "capability": "host"}]
    roles += [{"as": f"r{i}", "capability": "board"} for i in range(48)]
    assert len(validate_contract(contract(requires=roles)).requires) == 50


def test_requires_entry_must_be_an_object():
    doc = contract()
    doc["requires"][1] = "host"
    assert reason(doc) == 'requires[1] must be an object, got "host"'


def test_requires_as_is_required():
    assert reason(with_role(capability="host")) == "requires[1].as is required"


def test_requires_as_must_be_a_name():
    assert reason(with_role(**{"as": "my host", "capability": "host"})) == (
        'requires[1].as must be 1-200 characters of [A-Za-z0-9._:@-], got "my host"'
    )


def test_requires_as_must_be_unique():
    assert reason(with_role(**{"as": "dut", "capability": "host"})) == (
        'requires[1].as: duplicate role "dut"'
    )


def test_requires_capability_is_required():
    assert reason(with_role(**{"as": "host"})) == "requires[1].capability is required"


@pytest.mark.parametrize(
    ("value", "shown"),
    [("Board", '"Board"'), ("1board", '"1board"'), ("", '""'), (["board"], '["board"]')],
)
def test_requires_capability_must_match_the_pattern(value, shown):
    assert reason(with_role(**{"as": "host", "capability": value})) == (
        f"requires[1].capability must match [a-z][a-z0-9._-]* (at most 200 characters), got {shown}"
    )


def test_requires_capability_has_at_most_200_characters():
    long = "a" * 201
    assert reason(with_role(**{"as": "host", "capability": long})).startswith(
        "requires[1].capability must match"
    )
    validate_contract(with_role(**{"as": "host", "capability": "a" * 200}))


def test_unknown_capability_when_the_config_lists_them():
    doc = with_role(**{"as": "host", "capability": "boardd"})
    assert reason(doc, capabilities=["board", "host"]) == 'unknown capability: "boardd"'


def test_any_capability_is_fine_when_the_config_lists_none():
    assert validate_contract(with_role(**{"as": "host", "capability": "boardd"}))


@pytest.mark.parametrize(
    ("count", "shown"), [(-1, "-1"), (True, "true"), (1.0, "1.0"), ("2", '"2"')]
)
def test_requires_count_must_be_an_integer_of_at_least_0(count, shown):
    assert reason(with_role(**{"as": "host", "capability": "host", "count": count})) == (
        f"requires[1].count must be an integer >= 0, got {shown}"
    )


def test_a_requires_count_of_0_means_1_in_the_role_its_output_and_its_queue_shape():
    zero = validate_contract(with_role(**{"as": "host", "capability": "host", "count": 0}))
    one = validate_contract(with_role(**{"as": "host", "capability": "host"}))
    assert zero.requires[1] == Role("host", "host", 1, {})
    assert zero.requires[1].to_wire() == {"as": "host", "capability": "host", "attrs": {}}
    assert zero.requires_key == one.requires_key


def test_requires_count_must_fit_an_integer_column():
    doc = with_role(**{"as": "host", "capability": "host", "count": 2**31})
    assert reason(doc) == "requires[1].count must be at most 2147483647, got 2147483648"


@pytest.mark.parametrize(("value", "shown"), [(5, "5"), (None, "null"), (True, "true")])
def test_requires_attribute_must_be_a_string(value, shown):
    assert reason(with_role(**{"as": "host", "capability": "host", "soc": value})) == (
        f"requires[1].soc must be a string of at most 1024 bytes, got {shown}"
    )


def test_requires_attribute_may_have_1024_bytes_but_not_1025():
    validate_contract(with_role(**{"as": "host", "capability": "host", "soc": "x" * 1024}))
    doc = with_role(**{"as": "host", "capability": "host", "soc": "x" * 1025})
    assert reason(doc).startswith("requires[1].soc must be a string of at most 1024 bytes, got")


def test_requires_attribute_size_counts_utf8_bytes():
    doc = with_role(**{"as": "host", "capability": "host", "soc": "\u00e9" * 513})
    assert reason(doc).startswith("requires[1].soc must be a string of at most 1024 bytes")


def test_requires_attribute_name_has_at_most_200_characters():
    doc = with_role(**{"as": "host", "capability": "host", "k" * 201: "v"})
    assert reason(doc).startswith('requires[1]: attribute names must be 1-200 characters, got "kkk')


def test_requires_attribute_with_an_odd_name_is_quoted_in_the_path():
    doc = with_role(**{"as": "host", "capability": "host", "a b": 1})
    assert reason(doc) == 'requires[1]["a b"] must be a string of at most 1024 bytes, got 1'


def test_parse_requirement_reads_the_flat_wire_form():
    role = parse_requirement({"as": "x", "capability": "board", "soc": "a"})
    assert role == Role("x", "board", 1, {"soc": "a"})
    assert role.to_wire() == {"as": "x", "capability": "board", "attrs": {"soc": "a"}}


# ------------------------------------------------------------------------- steps: shape of each


def test_steps_is_required():
    doc = contract()
    del doc["steps"]
    assert reason(doc) == "steps is required"


@pytest.mark.parametrize(("value", "shown"), [([], "[]"), ({"id": "a"}, '{"id": "a"}')])
def test_steps_must_be_a_non_empty_list(value, shown):
    assert reason(contract(value)) == f"steps must be a non-empty list, got {shown}"


def test_steps_has_at_most_500_entries():
    steps = [run(f"s{i}") for i in range(501)]
    assert reason(contract(steps)) == "steps must have at most 500 entries, got 501"


def test_steps_of_500_entries_is_fine():
    steps = [run(f"s{i}", uses="dut" if i % 2 else "host") for i in range(500)]
    assert validate_contract(contract(steps)).steps[-1].needs == (499,)


def test_step_must_be_an_object():
    assert reason(contract([run("a"), ["run"]])) == 'steps[1] must be an object, got ["run"]'


def test_step_id_is_required():
    assert reason(contract([run("a"), {"uses": "dut", "run": ["x"]}])) == "steps[1].id is required"


@pytest.mark.parametrize(("value", "shown"), [("a/b", '"a/b"'), (7, "7"), ("", '""')])
def test_step_id_must_be_a_name(value, shown):
    assert reason(contract([run("a"), run(value)])) == (
        f"steps[1].id must be 1-200 characters of [A-Za-z0-9._:@-], got {shown}"
    )


def test_step_id_must_be_unique():
    assert reason(contract([run("a"), run("a")])) == 'steps[1].id: duplicate step id "a"'


def test_an_unknown_step_field_is_ignored_with_a_warning_and_left_out_of_the_stored_step():
    c = validate_contract(with_step(1, retries=3, expands=True))
    assert c.warnings == (
        "steps[1].retries: unknown field, ignored",
        "steps[1].expands: unknown field, ignored",
    )
    assert c.steps[1].spec == {"id": "b", "uses": "host", "run": ["y"], "out": ["b.out"]}
    assert c.document["steps"][1]["retries"] == 3


def test_an_unknown_step_field_does_not_excuse_a_known_field_that_is_wrong():
    assert reason(with_step(1, retries=3, out="b.out")) == (
        'steps[1].out must be a list of artifact names, got "b.out"'
    )


def test_step_without_a_kind():
    assert reason(contract([run("a"), {"id": "b", "uses": "dut"}])) == (
        'step "b" has no kind: give exactly one of run, agent, ask or acquire'
    )


def test_step_with_several_kinds():
    assert reason(with_step(1, agent={})) == (
        'step "b" has several kinds ("run", "agent"): give exactly one of run, agent, ask or acquire'
    )


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (ask("q", uses="dut"), 'step "q": an ask step takes no "uses"'),
        (ask("q", env=["X"]), 'step "q": an ask step takes no "env"'),
        (ask("q", workspace={"repo": "r"}), 'step "q": an ask step takes no "workspace"'),
        (ask("q", collect={}), 'step "q": an ask step takes no "collect"'),
        (
            {**acquire("g", "x", "b", "c"), "uses": "dut"},
            'step "g": an acquire step takes no "uses"',
        ),
        ({**acquire("g", "x", "b", "c"), "out": ["o"]}, 'step "g": an acquire step takes no "out"'),
        (
            {**acquire("g", "x", "b", "c"), "loop": {}},
            'step "g": an acquire step takes no "loop"',
        ),
    ],
    ids=["ask-uses", "ask-env", "ask-workspace", "ask-collect", "acq-uses", "acq-out", "acq-loop"],
)
def test_fields_a_kind_cannot_act_on(step, expected):
    assert reason(contract([run("a"), step, run("b"), run("c")])) == expected


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (ask("q", feedback=["x"]), 'step "q": an ask step takes no "feedback"'),
        (ask("q", see={"ledger": "list"}), 'step "q": an ask step takes no "see"'),
        (
            {**acquire("g", "x", "b", "c"), "feedback": []},
            'step "g": an acquire step takes no "feedback"',
        ),
        ({**acquire("g", "x", "b", "c"), "see": {}}, 'step "g": an acquire step takes no "see"'),
    ],
    ids=["ask-feedback", "ask-see", "acq-feedback", "acq-see"],
)
def test_only_a_step_on_a_node_takes_feedback_or_see(step, expected):
    assert reason(contract([run("a"), step, run("b"), run("c")])) == expected


@pytest.mark.parametrize(
    ("value", "shown"), [([], "[]"), ("ls -l", '"ls -l"'), (["ls", 1], '["ls", 1]'), ({}, "{}")]
)
def test_run_must_be_a_non_empty_list_of_strings(value, shown):
    assert reason(with_step(1, run=value)) == (
        f"steps[1].run must be a non-empty list of strings, got {shown}"
    )


def test_run_argument_must_not_contain_nul():
    assert reason(with_step(0, run=["a", "b\x00"])) == (
        'steps[0].run[1] must not contain NUL, got "b\\u0000"'
    )


def test_run_step_needs_uses():
    assert reason(contract([run("a"), {"id": "b", "run": ["x"]}])) == (
        'step "b" has no uses: a run step runs on a role\'s node'
    )


def test_agent_step_needs_uses():
    assert reason(contract([run("a"), {"id": "b", "agent": {}}])) == (
        'step "b" has no uses: an agent step runs on a role\'s node'
    )


@pytest.mark.parametrize(("value", "shown"), [(5, "5"), ("no role", '"no role"'), (None, "null")])
def test_uses_must_be_a_role_name(value, shown):
    assert reason(with_step(1, uses=value)) == f"steps[1].uses must be a role name, got {shown}"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("claude", 'steps[1].agent must be an object, got "claude"'),
        ({"temperature": 1}, 'step "b": agent has unknown field "temperature"'),
        ({"model": 5}, "steps[1].agent.model must be a string, got 5"),
        ({"harness": []}, "steps[1].agent.harness must be a string, got []"),
        ({"max_turns": True}, "steps[1].agent.max_turns must be an integer >= 1, got true"),
        ({"max_tokens": 0}, "steps[1].agent.max_tokens must be an integer >= 1, got 0"),
        ({"mcp": "fs"}, 'steps[1].agent.mcp must be a list of strings, got "fs"'),
    ],
    ids=["not-object", "unknown", "model", "harness", "max_turns-bool", "max_tokens", "mcp"],
)
def test_agent_rules(body, expected):
    doc = contract([run("a"), {"id": "b", "uses": "host", "agent": body}])
    assert reason(doc) == expected


def ask_doc(body: object, **fields: Any) -> dict[str, Any]:
    return contract([run("a", out=["log"]), {"id": "q", "ask": body, "out": ["d"], **fields}])


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("ok?", 'steps[1].ask must be an object, got "ok?"'),
        ({"prompt": "p", "to": []}, 'step "q": ask has unknown field "to"'),
        ({}, "steps[1].ask.prompt is required"),
        ({"prompt": ""}, 'steps[1].ask.prompt must be a non-empty string, got ""'),
        (
            {"prompt": "p", "answerers": "qa"},
            'steps[1].ask.answerers must be a list of principals, got "qa"',
        ),
        (
            {"prompt": "p", "answerers": [""]},
            'steps[1].ask.answerers[0] must be 1-200 characters, got ""',
        ),
        ({"prompt": "p", "timeout": "4h"}, 'steps[1].ask.timeout must be an object, got "4h"'),
        (
            {"prompt": "p", "timeout": {"after": "4h", "else": 1}},
            'step "q": ask.timeout has unknown field "else"',
        ),
        ({"prompt": "p", "timeout": {}}, "steps[1].ask.timeout.after is required"),
        (
            {"prompt": "p", "timeout": {"after": "soon"}},
            'steps[1].ask.timeout.after must be a duration like "30m" or "4h", got "soon"',
        ),
        (
            {"prompt": "p", "timeout": {"after": "0s"}},
            'steps[1].ask.timeout.after must be a duration like "30m" or "4h", got "0s"',
        ),
        (
            {"prompt": "p", "timeout": {"after": "4h", "then": "approve"}},
            'steps[1].ask.timeout.then must be "fail", got "approve"',
        ),
        (
            {"prompt": "p", "show": "log"},
            'steps[1].ask.show must be a list of artifact names, got "log"',
        ),
        ({"prompt": "p", "show": ["nope"]}, 'step "q" reads "nope", which no step produces'),
    ],
    ids=[
        "not-object",
        "unknown",
        "prompt-missing",
        "prompt-empty",
        "answerers",
        "answerer-empty",
        "timeout-type",
        "timeout-unknown",
        "after-missing",
        "after-bad",
        "after-zero",
        "then",
        "show-type",
        "show-unproduced",
    ],
)
def test_ask_rules(body, expected):
    assert reason(ask_doc(body)) == expected


def test_ask_may_show_what_another_step_produces_and_time_out_without_then():
    body = {"prompt": "p", "show": ["log"], "timeout": {"after": "1d"}}
    assert validate_contract(ask_doc(body)).steps[1].kind == "ask"


@pytest.mark.parametrize(("out", "shown"), [([], "[]"), (["a", "b"], '["a", "b"]')])
def test_ask_step_has_exactly_one_out(out, shown):
    assert reason(ask_doc({"prompt": "p"}, out=out)) == (
        f'step "q": an ask step needs exactly one out, got {shown}'
    )


def test_ask_step_without_out_is_rejected():
    doc = contract([run("a"), {"id": "q", "ask": {"prompt": "p"}}])
    assert reason(doc) == 'step "q": an ask step needs exactly one out, got []'


def test_ask_schema_must_be_an_object_schema():
    doc = ask_doc({"prompt": "p"}, schema={"d": {"type": "string"}})
    assert reason(doc) == (
        'step "q": the ask schema for "d" must be a flat object schema with type "object", '
        'got {"type": "string"}'
    )


@pytest.mark.parametrize(
    "prop",
    [
        {"type": "object", "properties": {}},
        {"type": "array", "items": {"type": "string"}},
        {"description": "no type"},
        {"type": ["string", "object"]},
    ],
    ids=["object", "array", "untyped", "type-list-with-object"],
)
def test_ask_schema_properties_must_be_primitive_or_enum(prop):
    doc = ask_doc({"prompt": "p"}, schema={"d": {"type": "object", "properties": {"x": prop}}})
    assert reason(doc) == (
        'step "q": the ask schema for "d": property "x" must have a primitive type or an enum'
    )


def test_an_ask_property_named_like_the_pages_csrf_field_is_refused_naming_it():
    # The asks page's form sends its CSRF token as csrf_token: a property of that name would
    # share its input, and the answer would store the token.
    props = {"verdict": {"enum": ["approve", "reject"]}, "csrf_token": {"type": "string"}}
    doc = ask_doc({"prompt": "p"}, schema={"d": {"type": "object", "properties": props}})
    assert reason(doc) == (
        'steps[1].schema.d.properties.csrf_token: "csrf_token" is the name of a field the asks '
        "page's form sends itself; give the property another name"
    )


def test_ask_schema_with_primitive_and_enum_properties_is_flat():
    props = {
        "verdict": {"enum": ["approve", "reject"]},
        "why": {"type": "string", "description": "free text"},
        "score": {"type": ["integer", "null"]},
    }
    doc = ask_doc({"prompt": "p"}, schema={"d": {"type": "object", "properties": props}})
    assert validate_contract(doc).steps[1].kind == "ask"


def acq_doc(body: object) -> dict[str, Any]:
    return contract([run("a"), {"id": "g", "acquire": body}, run("b"), run("c")])


def want(**extra: Any) -> dict[str, Any]:
    return {"as": "extra", "capability": "board", **extra}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("board", 'steps[1].acquire must be an object, got "board"'),
        (
            {"want": want(), "acquired": "b", "unavailable": "c", "timeout": "1m"},
            'step "g": acquire has unknown field "timeout"',
        ),
        ({"acquired": "b", "unavailable": "c"}, "steps[1].acquire.want is required"),
        ({"want": want(), "unavailable": "c"}, "steps[1].acquire.acquired is required"),
        ({"want": want(), "acquired": "b"}, "steps[1].acquire.unavailable is required"),
        (
            {"want": "board", "acquired": "b", "unavailable": "c"},
            'steps[1].acquire.want must be an object, got "board"',
        ),
        (
            {"want": {"capability": "board"}, "acquired": "b", "unavailable": "c"},
            "steps[1].acquire.want.as is required",
        ),
        (
            {"want": want(count=2), "acquired": "b", "unavailable": "c"},
            "steps[1].acquire.want.count must be 1, got 2",
        ),
        (
            {"want": want(count=-1), "acquired": "b", "unavailable": "c"},
            "steps[1].acquire.want.count must be an integer >= 0, got -1",
        ),
        (
            {"want": want(), "acquired": 2, "unavailable": "c"},
            "steps[1].acquire.acquired must be a step id, got 2",
        ),
        (
            {"want": want(), "acquired": "b", "unavailable": "b"},
            'step "g": acquire.acquired and acquire.unavailable are both "b"',
        ),
        (
            {"want": want(**{"as": "dut"}), "acquired": "b", "unavailable": "c"},
            'step "g" acquires role "dut" that requires already declares',
        ),
        (
            {"want": want(), "acquired": "a", "unavailable": "c"},
            'step "g": acquire.acquired must name a later step, got "a"',
        ),
        (
            {"want": want(), "acquired": "b", "unavailable": "zz"},
            'step "g": acquire.unavailable must name a later step, got "zz"',
        ),
    ],
    ids=[
        "not-object",
        "unknown",
        "want-missing",
        "acquired-missing",
        "unavailable-missing",
        "want-type",
        "want-as",
        "want-count-2",
        "want-count-negative",
        "acquired-type",
        "same-targets",
        "role-in-requires",
        "acquired-earlier",
        "unavailable-unknown",
    ],
)
def test_acquire_rules(body, expected):
    assert reason(acq_doc(body)) == expected


def test_acquire_want_capability_is_checked_against_the_config():
    body = {"want": {"as": "extra", "capability": "gpu"}, "acquired": "b", "unavailable": "c"}
    assert reason(acq_doc(body), capabilities=["board", "host"]) == 'unknown capability: "gpu"'


def test_two_acquires_may_not_acquire_the_same_role():
    steps = [
        acquire("g1", "extra", "b", "c"),
        acquire("g2", "extra", "b", "c"),
        run("b", uses="extra"),
        run("c"),
    ]
    assert (
        reason(contract(steps)) == 'step "g2" acquires role "extra" that step "g1" already acquires'
    )


# ----------------------------------------------------------------- steps: roles and dependencies


def test_step_uses_undeclared_role():
    doc = contract([run("flash"), run("boot", uses="dutt")])
    assert reason(doc) == 'step "boot" uses undeclared role "dutt"'


def test_step_may_use_an_acquired_role_after_the_acquire():
    steps = [acquire("g", "extra", "b", "c"), run("b", uses="extra"), run("c", uses="extra")]
    assert validate_contract(contract(steps)).steps[2].uses == "extra"


def test_step_may_not_use_an_acquired_role_before_the_acquire():
    steps = [run("early", uses="extra"), acquire("g", "extra", "b", "c"), run("b"), run("c")]
    assert reason(contract(steps)) == 'step "early" uses role "extra" before step "g" acquires it'


@pytest.mark.parametrize(("value", "shown"), [("a", '"a"'), ([1], "[1]"), ({}, "{}")])
def test_needs_must_be_a_list_of_step_ids(value, shown):
    assert reason(with_step(1, needs=value)) == (
        f"steps[1].needs must be a list of step ids, got {shown}"
    )


def test_needs_entry_must_be_a_step_id():
    assert reason(with_step(1, needs=["a", "x y"])) == (
        'steps[1].needs[1] must be 1-200 characters of [A-Za-z0-9._:@-], got "x y"'
    )


def test_needs_must_name_an_existing_step():
    assert reason(with_step(1, needs=["zzz"])) == 'step "b" needs unknown step "zzz"'


def test_dependencies_must_point_backward():
    assert (
        reason(with_step(0, needs=["b"])) == 'dependencies must point backward: step "a" needs "b"'
    )


def test_a_step_may_not_need_itself():
    assert (
        reason(with_step(1, needs=["b"])) == 'dependencies must point backward: step "b" needs "b"'
    )


# ------------------------------------------------------------------------ steps: in, out, schema


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("p", 'steps[1].in must be an object, got "p"'),
        ({"files": []}, 'step "b": in has unknown field "files"'),
        ({"prompt": 3}, "steps[1].in.prompt must be a string, got 3"),
        ({"from": "a.out"}, 'steps[1].in.from must be a list of artifact names, got "a.out"'),
        ({"from": ["nope"]}, 'step "b" reads "nope", which no step produces'),
    ],
    ids=["not-object", "unknown", "prompt", "from-type", "from-unproduced"],
)
def test_in_rules(value, expected):
    assert reason(with_step(1, **{"in": value})) == expected


def test_in_from_may_read_what_any_step_produces():
    assert validate_contract(with_step(1, **{"in": {"from": ["a.out"], "prompt": "x"}}))


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("_meta", '"_meta"'),
        ("a/b", '"a/b"'),
        ("a\\b", '"a\\\\b"'),
        ("a\x00", '"a\\u0000"'),
        ("..", '".."'),
        (".", '"."'),
        ("", '""'),
        ("x" * 201, '"' + "x" * 76 + "..."),
    ],
    ids=["underscore", "slash", "backslash", "nul", "dotdot", "dot", "empty", "long"],
)
def test_out_names_are_safe_artifact_names(name, shown):
    assert reason(with_step(1, out=["ok", name])) == (
        'steps[1].out[1] must be an artifact name (1-200 characters, not starting with "_", '
        f'no "/", "\\" or NUL, not only dots), got {shown}'
    )


def test_out_must_be_a_list_of_strings():
    assert reason(with_step(1, out="b.out")) == (
        'steps[1].out must be a list of artifact names, got "b.out"'
    )


def test_out_names_are_unique():
    assert reason(with_step(1, out=["x", "x"])) == 'step "b": out lists "x" twice'


def test_out_name_with_dots_inside_is_fine():
    assert validate_contract(with_step(1, out=["a..b", ".hidden", "result.json"]))


def test_schema_must_be_an_object():
    assert reason(with_step(1, schema=[])) == "steps[1].schema must be an object, got []"


def test_schema_key_must_be_in_out():
    assert reason(with_step(1, schema={"other": {}})) == (
        'step "b": schema for "other" which is not in its out'
    )


def test_schema_must_be_an_object_schema():
    assert reason(with_step(1, schema={"b.out": True})) == (
        'step "b": schema for "b.out" must be an object, got true'
    )


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "string", "pattern": "^a"}, "pattern"),
        ({"$ref": "http://example.com/s.json"}, "$ref"),
        ({"type": "object", "properties": {"x": {"type": "string", "format": "email"}}}, "format"),
        ({"type": "array", "items": {"minLength": 1}}, "minLength"),
        ({"type": "object", "additionalProperties": {"const": 1}}, "const"),
    ],
    ids=["pattern", "ref", "nested-in-properties", "nested-in-items", "nested-in-additional"],
)
def test_schema_keywords_are_limited_anywhere_in_the_schema(schema, keyword):
    assert reason(with_step(1, schema={"b.out": schema})) == (
        f'step "b": schema for "b.out" uses keyword "{keyword}", which is not allowed'
    )


def test_schema_property_names_are_not_keywords():
    schema = {"type": "object", "properties": {"pattern": {"type": "string"}, "$ref": {}}}
    assert validate_contract(with_step(1, schema={"b.out": schema}))


def test_schema_must_be_a_valid_json_schema():
    assert reason(with_step(1, schema={"b.out": {"type": "bogus"}})).startswith(
        'step "b": schema for "b.out" is not a valid JSON schema: "'
    )


def test_schema_required_must_be_a_list_of_strings():
    assert reason(with_step(1, schema={"b.out": {"required": "ok"}})).startswith(
        'step "b": schema for "b.out" is not a valid JSON schema: '
    )


# ------------------------------------------------------------ steps: env, workspace, collect


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("HOME", 'steps[1].env must be a list of variable names, got "HOME"'),
        ([1], "steps[1].env must be a list of variable names, got [1]"),
        (
            ["OK", "1BAD"],
            'steps[1].env[1] must be a variable name ([A-Za-z_][A-Za-z0-9_]*), got "1BAD"',
        ),
        (["A=B"], 'steps[1].env[0] must be a variable name ([A-Za-z_][A-Za-z0-9_]*), got "A=B"'),
    ],
    ids=["not-list", "not-strings", "leading-digit", "equals"],
)
def test_env_rules(value, expected):
    assert reason(with_step(1, env=value)) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("repo", 'steps[1].workspace must be an object, got "repo"'),
        ({"repo": "r", "branch": "b"}, 'step "b": workspace has unknown field "branch"'),
        ({"rev": "main"}, "steps[1].workspace.repo is required"),
        ({"repo": ""}, 'steps[1].workspace.repo must be a non-empty string, got ""'),
        ({"repo": "r", "rev": 5}, "steps[1].workspace.rev must be a non-empty string, got 5"),
    ],
    ids=["not-object", "unknown", "repo-missing", "repo-empty", "rev-type"],
)
def test_workspace_rules(value, expected):
    assert reason(with_step(1, workspace=value)) == expected


def test_collect_must_be_an_object():
    assert reason(with_step(1, collect=["b.out"])) == (
        'steps[1].collect must be an object, got ["b.out"]'
    )


def test_collect_key_must_be_in_out():
    assert reason(with_step(1, collect={"x": "x"})) == (
        'step "b": collect for "x" which is not in its out'
    )


@pytest.mark.parametrize(
    ("path", "shown"),
    [
        ("/etc/passwd", '"/etc/passwd"'),
        ("../up", '"../up"'),
        ("a/../../b", '"a/../../b"'),
        ("a\\..\\b", '"a\\\\..\\\\b"'),
        ("", '""'),
        (5, "5"),
    ],
    ids=["absolute", "dotdot", "inner-dotdot", "backslash-dotdot", "empty", "not-string"],
)
def test_collect_path_must_be_relative_without_dotdot(path, shown):
    assert reason(with_step(1, collect={"b.out": path})) == (
        f'step "b": collect path for "b.out" must be relative with no ".." component, got {shown}'
    )


def test_collect_path_with_dots_in_names_is_fine():
    assert validate_contract(with_step(1, collect={"b.out": "out/..x/b..c/./f"}))


# ---------------------------------------------------- steps: feedback, see (docs/contract.md#steps)


def test_feedback_see_workspace_and_collect_are_kept_in_the_stored_step():
    fields = {
        "feedback": ["the last run timed out", "keep the log short"],
        "see": {"ledger": "list", "from": []},
        "workspace": {"repo": "gerrit.example.com/kernel", "rev": "abc123"},
        "collect": {"b.out": "build/b.out"},
    }
    spec = validate_contract(with_step(1, **fields)).steps[1].spec
    assert {k: spec[k] for k in fields} == fields
    assert spec["see"]["ledger"] == "list"


@pytest.mark.parametrize("see", [{}, {"ledger": ""}, {"ledger": "none"}, {"from": []}])
def test_see_may_leave_the_ledger_out(see):
    assert validate_contract(with_step(1, see=see)).steps[1].spec["see"] == see


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("x", 'steps[1].feedback must be a list of strings, got "x"'),
        (["ok", 5], 'steps[1].feedback must be a list of strings, got ["ok", 5]'),
    ],
    ids=["not-list", "not-strings"],
)
def test_feedback_must_be_a_list_of_strings(value, expected):
    assert reason(with_step(1, feedback=value)) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("list", 'steps[1].see must be an object, got "list"'),
        ({"ledger": "list", "scope": "run"}, 'step "b": see has unknown field "scope"'),
        ({"ledger": "all"}, 'steps[1].see.ledger must be "", "none" or "list", got "all"'),
        ({"ledger": None}, 'steps[1].see.ledger must be "", "none" or "list", got null'),
        (
            {"ledger": "list", "from": ["a.out"]},
            "steps[1].see.from must be an empty list (narrowing what a step sees is not "
            'supported; name fewer artifacts in in.from), got ["a.out"]',
        ),
        (
            {"from": "a.out"},
            "steps[1].see.from must be an empty list (narrowing what a step sees is not "
            'supported; name fewer artifacts in in.from), got "a.out"',
        ),
    ],
    ids=["not-object", "unknown", "ledger-value", "ledger-null", "from-not-empty", "from-type"],
)
def test_see_rules(value, expected):
    assert reason(with_step(1, see=value)) == expected


# ------------------------------------------------------------------------------- steps: release


def test_release_must_be_a_list_of_role_names():
    assert reason(with_step(1, release="dut")) == (
        'steps[1].release must be a list of role names, got "dut"'
    )


def test_release_must_name_a_declared_role():
    assert reason(with_step(1, release=["gpu"])) == 'step "b" releases undeclared role "gpu"'


def test_release_may_name_an_acquired_role():
    steps = [acquire("g", "extra", "b", "c"), run("b", uses="extra", release=["extra"]), run("c")]
    assert validate_contract(contract(steps))


def test_release_after_every_user_of_the_role_is_fine_and_the_releaser_may_use_it():
    steps = [run("a"), run("b"), run("c", release=["dut"]), run("d", uses="host")]
    assert validate_contract(contract(steps))


def test_release_when_another_user_is_not_an_ancestor():
    steps = [run("a"), run("b", needs=[], release=["dut"]), run("c", uses="host")]
    assert reason(contract(steps)) == (
        'step "b" releases role "dut" but step "a" uses it and is not an ancestor of "b"'
    )


def test_release_when_a_later_step_uses_the_role():
    steps = [run("a", release=["dut"]), run("b")]
    assert reason(contract(steps)) == (
        'step "a" releases role "dut" but step "b" uses it and is not an ancestor of "a"'
    )


def test_release_ancestry_is_transitive():
    steps = [run("a"), run("b", uses="host"), run("c", uses="host", release=["dut"])]
    assert validate_contract(contract(steps))


def test_release_inside_a_loop_range():
    steps = [
        run("a", uses="host"),
        run("b", release=["dut"]),
        run(
            "c", uses="host", out=["o"], loop={"back_to": "a", "max": 3, "until": {"exit_code": 0}}
        ),
    ]
    assert reason(contract(steps)) == 'step "b" has release but lies within the loop of step "c"'


def test_release_on_the_loop_step_itself_is_inside_the_range():
    loop = {"back_to": "a", "max": 3, "until": {"exit_code": 0}}
    steps = [run("a"), run("b", release=["dut"], loop=loop)]
    assert reason(contract(steps)) == 'step "b" has release but lies within the loop of step "b"'


def test_release_after_a_loop_range_is_fine():
    loop = {"back_to": "a", "max": 3, "until": {"exit_code": 0}}
    steps = [run("a"), run("b", loop=loop), run("c", release=["dut"])]
    assert validate_contract(contract(steps))


def test_release_between_a_step_and_its_validator():
    steps = [
        run("a", uses="host", validate_with="c"),
        run("b", release=["dut"]),
        run("c", uses="host"),
    ]
    assert reason(contract(steps)) == (
        'step "b" has release but lies within step "a" and its validator'
    )


def test_release_on_the_validator_itself_is_inside_the_range():
    steps = [run("a", validate_with="b"), run("b", release=["dut"])]
    assert reason(contract(steps)) == (
        'step "b" has release but lies within step "a" and its validator'
    )


# --------------------------------------------------------------------------------- steps: dispatch


def dispatch_doc(dispatch: object, out: list[str] | None = None) -> dict[str, Any]:
    first = run("pick", out=out if out is not None else ["route.json"], dispatch=dispatch)
    return contract([run("zero"), first, run("x"), run("y")])


@pytest.mark.parametrize(
    ("dispatch", "expected"),
    [
        ("route.json.to", 'steps[1].dispatch must be an object, got "route.json.to"'),
        (
            {"from": "route.json.k", "to": ["x", "y"], "default": "x"},
            'step "pick": dispatch has unknown field "default"',
        ),
        ({"to": ["x", "y"]}, "steps[1].dispatch.from is required"),
        ({"from": "route.json.k"}, "steps[1].dispatch.to is required"),
        (
            {"from": "route.json", "to": ["x", "y"]},
            'step "pick": dispatch.from must be "<out>.<field>[.<field>]" naming one of its outs, '
            'got "route.json"',
        ),
        (
            {"from": "other.k", "to": ["x", "y"]},
            'step "pick": dispatch.from must be "<out>.<field>[.<field>]" naming one of its outs, '
            'got "other.k"',
        ),
        (
            {"from": "route.json.", "to": ["x", "y"]},
            'step "pick": dispatch.from must be "<out>.<field>[.<field>]" naming one of its outs, '
            'got "route.json."',
        ),
        (
            {"from": 5, "to": ["x", "y"]},
            'step "pick": dispatch.from must be "<out>.<field>[.<field>]" naming one of its outs, '
            "got 5",
        ),
        (
            {"from": "route.json.k", "to": ["x"]},
            'steps[1].dispatch.to must list at least 2 step ids, got ["x"]',
        ),
        (
            {"from": "route.json.k", "to": "x"},
            'steps[1].dispatch.to must be a list of step ids, got "x"',
        ),
        ({"from": "route.json.k", "to": ["x", "x"]}, 'steps[1].dispatch.to lists "x" twice'),
        (
            {"from": "route.json.k", "to": ["x", "zero"]},
            'step "pick": dispatch.to must name a later step, got "zero"',
        ),
        (
            {"from": "route.json.k", "to": ["x", "pick"]},
            'step "pick": dispatch.to must name a later step, got "pick"',
        ),
        (
            {"from": "route.json.k", "to": ["x", "nope"]},
            'step "pick": dispatch.to must name a later step, got "nope"',
        ),
    ],
    ids=[
        "not-object",
        "unknown",
        "from-missing",
        "to-missing",
        "from-no-field",
        "from-not-an-out",
        "from-empty-field",
        "from-type",
        "to-one",
        "to-type",
        "to-duplicate",
        "to-earlier",
        "to-self",
        "to-unknown",
    ],
)
def test_dispatch_rules(dispatch, expected):
    assert reason(dispatch_doc(dispatch)) == expected


def test_dispatch_from_may_go_two_fields_deep():
    assert validate_contract(dispatch_doc({"from": "route.json.a.b", "to": ["x", "y"]}))


def test_dispatch_from_matches_a_whole_out_name_with_dots():
    doc = dispatch_doc({"from": "a.b.c", "to": ["x", "y"]}, out=["a", "a.b"])
    assert validate_contract(doc)


# ------------------------------------------------------------------------------ steps: loop


def loop_doc(loop: object, kind: str = "run") -> dict[str, Any]:
    last = run("c", out=["o"], loop=loop) if kind == "run" else agent("c", out=["o"], loop=loop)
    return contract([run("a"), run("b"), last])


@pytest.mark.parametrize(
    ("loop", "expected"),
    [
        ("a", 'steps[2].loop must be an object, got "a"'),
        (
            {"back_to": "a", "max": 2, "until": {"exit_code": 0}, "min": 1},
            'step "c": loop has unknown field "min"',
        ),
        ({"max": 2, "until": {"exit_code": 0}}, "steps[2].loop.back_to is required"),
        ({"back_to": "a", "until": {"exit_code": 0}}, "steps[2].loop.max is required"),
        ({"back_to": "a", "max": 2}, "steps[2].loop.until is required"),
        (
            {"back_to": 1, "max": 2, "until": {"exit_code": 0}},
            "steps[2].loop.back_to must be a step id, got 1",
        ),
        (
            {"back_to": "a", "max": 1, "until": {"exit_code": 0}},
            "steps[2].loop.max must be an integer >= 2, got 1",
        ),
        (
            {"back_to": "a", "max": True, "until": {"exit_code": 0}},
            "steps[2].loop.max must be an integer >= 2, got true",
        ),
        ({"back_to": "a", "max": 2, "until": 0}, "steps[2].loop.until must be an object, got 0"),
        (
            {"back_to": "a", "max": 2, "until": {}},
            "steps[2].loop.until must give exit_code or produced",
        ),
        (
            {"back_to": "a", "max": 2, "until": {"ok": True}},
            'step "c": loop.until has unknown field "ok"',
        ),
        (
            {"back_to": "a", "max": 2, "until": {"exit_code": "0"}},
            'steps[2].loop.until.exit_code must be an integer, got "0"',
        ),
        (
            {"back_to": "a", "max": 2, "until": {"produced": ["p"]}},
            'step "c": loop.until.produced names "p", which is not in its out',
        ),
        (
            {"back_to": "c", "max": 2, "until": {"exit_code": 0}},
            'step "c": loop.back_to must name an earlier step, got "c"',
        ),
        (
            {"back_to": "zz", "max": 2, "until": {"exit_code": 0}},
            'step "c": loop.back_to must name an earlier step, got "zz"',
        ),
    ],
    ids=[
        "not-object",
        "unknown",
        "back_to-missing",
        "max-missing",
        "until-missing",
        "back_to-type",
        "max-1",
        "max-bool",
        "until-type",
        "until-empty",
        "until-unknown",
        "exit_code-type",
        "produced-not-out",
        "back_to-self",
        "back_to-unknown",
    ],
)
def test_loop_rules(loop, expected):
    assert reason(loop_doc(loop)) == expected


def test_loop_until_exit_code_only_for_run_steps():
    doc = loop_doc({"back_to": "a", "max": 2, "until": {"exit_code": 0}}, kind="agent")
    assert reason(doc) == 'step "c": loop.until.exit_code applies only to run steps'


def test_loop_until_produced_is_fine_for_an_agent_step():
    doc = loop_doc({"back_to": "a", "max": 5, "until": {"produced": ["o"]}}, kind="agent")
    assert validate_contract(doc).steps[2].kind == "agent"


# ---------------------------------------------------------------------- steps: validate_with


def test_validate_with_must_be_a_step_id():
    assert reason(with_step(0, validate_with=["b"])) == (
        'steps[0].validate_with must be a step id, got ["b"]'
    )


@pytest.mark.parametrize("target", ["a", "zz"])
def test_validate_with_must_name_a_later_step(target):
    assert reason(with_step(0, validate_with=target)) == (
        f'step "a": validate_with must name a later step, got "{target}"'
    )


@pytest.mark.parametrize(("value", "shown"), [(0, "0"), (True, "true"), ("2", '"2"')])
def test_max_attempts_must_be_an_integer_of_at_least_1(value, shown):
    assert reason(with_step(0, validate_with="b", max_attempts=value)) == (
        f"steps[0].max_attempts must be an integer >= 1, got {shown}"
    )


def test_max_attempts_needs_validate_with():
    assert reason(with_step(0, max_attempts=2)) == (
        'step "a": max_attempts applies only with validate_with'
    )


def test_validate_with_and_max_attempts_are_accepted():
    assert validate_contract(with_step(0, validate_with="b", max_attempts=3))


# ---------------------------------------------------------------------------------- success_when


def cond_doc(*conditions: object) -> dict[str, Any]:
    steps = [
        run("a", out=["a.out"]),
        agent("b", out=["b.out"]),
        ask("q"),
        acquire("g", "extra", "c", "d"),
        run("c", uses="extra"),
        run("d"),
    ]
    return contract(steps, success_when=list(conditions))


def test_success_when_must_be_a_list():
    assert reason(contract(success_when={"step": "a"})) == (
        'success_when must be a list, got {"step": "a"}'
    )


def test_success_when_has_at_most_500_conditions():
    assert reason(contract(success_when=[{"step": "a"}] * 501)) == (
        "success_when must have at most 500 entries, got 501"
    )


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        ("a", 'success_when[0] must be an object, got "a"'),
        ({}, 'success_when[0] must have exactly one of "step" or "fleet_has", got {}'),
        (
            {"step": "a", "fleet_has": {"capability": "board"}},
            'success_when[0] must have exactly one of "step" or "fleet_has", got {"step": "a", '
            '"fleet_has": {"capability": "board"}}',
        ),
        ({"step": "zz"}, 'success_when[0].step names unknown step "zz"'),
        ({"step": 1}, "success_when[0].step names unknown step 1"),
        (
            {"step": "a", "produced": "a.out"},
            'success_when[0].produced must be a list of artifact names, got "a.out"',
        ),
        (
            {"step": "a", "produced": ["b.out"]},
            'success_when[0].produced names "b.out", which step "a" does not list in out',
        ),
        (
            {"step": "b", "exit_code": 0},
            'success_when[0].exit_code applies only to run steps; step "b" is an agent step',
        ),
        (
            {"step": "q", "exit_code": 0},
            'success_when[0].exit_code applies only to run steps; step "q" is an ask step',
        ),
        (
            {"step": "g", "exit_code": 0},
            'success_when[0].exit_code applies only to run steps; step "g" is an acquire step',
        ),
        (
            {"step": "a", "exit_code": True},
            "success_when[0].exit_code must be an integer, got true",
        ),
        (
            {"step": "a", "within_attempts": 1},
            "success_when[0].within_attempts must be true or false, got 1",
        ),
        ({"fleet_has": "board"}, 'success_when[0].fleet_has must be an object, got "board"'),
        ({"fleet_has": {}}, "success_when[0].fleet_has.capability is required"),
        (
            {"fleet_has": {"capability": "board"}, "min_count": 0},
            "success_when[0].min_count must be an integer >= 1, got 0",
        ),
        (
            {"fleet_has": {"capability": "board", "soc": 5}},
            "success_when[0].fleet_has.soc must be a string of at most 1024 bytes, got 5",
        ),
    ],
    ids=[
        "not-object",
        "neither",
        "both",
        "unknown-step",
        "step-type",
        "produced-type",
        "produced-not-out",
        "exit_code-agent",
        "exit_code-ask",
        "exit_code-acquire",
        "exit_code-bool",
        "within_attempts",
        "fleet-type",
        "fleet-capability",
        "min_count",
        "fleet-attr",
    ],
)
def test_success_when_rules(cond, expected):
    assert reason(cond_doc(cond)) == expected


def test_success_when_changed_on_a_step_with_a_workspace_is_kept():
    doc = cond_doc({"step": "d", "changed": ["src/main.c", "docs/a b.md"], "exit_code": 0})
    doc["steps"][5]["workspace"] = {"repo": "r"}
    assert validate_contract(doc).success_when[0]["changed"] == ["src/main.c", "docs/a b.md"]


@pytest.mark.parametrize(
    ("changed", "expected"),
    [
        ("src", 'success_when[0].changed must be a list of relative paths, got "src"'),
        (["src", 1], 'success_when[0].changed must be a list of relative paths, got ["src", 1]'),
        (
            ["src/a.c", "/etc/passwd"],
            'success_when[0].changed[1] must be a relative path with no ".." component, '
            'got "/etc/passwd"',
        ),
        (
            ["../up"],
            'success_when[0].changed[0] must be a relative path with no ".." component, '
            'got "../up"',
        ),
        (
            ["a/../../b"],
            'success_when[0].changed[0] must be a relative path with no ".." component, '
            'got "a/../../b"',
        ),
        (
            [""],
            'success_when[0].changed[0] must be a relative path with no ".." component, got ""',
        ),
    ],
    ids=["not-list", "not-strings", "absolute", "dotdot", "inner-dotdot", "empty"],
)
def test_success_when_changed_rules(changed, expected):
    doc = cond_doc({"step": "d", "changed": changed})
    doc["steps"][5]["workspace"] = {"repo": "r"}
    assert reason(doc) == expected


@pytest.mark.parametrize("sid", ["a", "b", "q", "g"])
def test_success_when_changed_needs_a_step_with_a_workspace(sid):
    assert reason(cond_doc({"step": sid, "changed": ["src/a.c"]})) == (
        f'success_when[0].changed needs a workspace, but step "{sid}" has none'
    )


def test_success_when_changed_may_be_empty_without_a_workspace():
    assert validate_contract(cond_doc({"step": "a", "changed": []}))


def test_an_unknown_condition_field_is_ignored_with_a_warning():
    doc = cond_doc(
        {"step": "a", "state": "DONE"},
        {"fleet_has": {"capability": "board"}, "max_count": 1},
        {"step": "b", "min_count": 2},
    )
    c = validate_contract(doc)
    assert c.warnings == (
        "success_when[0].state: unknown field, ignored",
        "success_when[1].max_count: unknown field, ignored",
        "success_when[2].min_count: unknown field, ignored",
    )
    assert c.success_when[0] == {"step": "a", "state": "DONE"}


def test_success_when_reports_the_failing_condition_index():
    assert reason(cond_doc({"step": "a"}, {"step": "zz"})) == (
        'success_when[1].step names unknown step "zz"'
    )


def test_success_when_fleet_has_capability_is_checked_against_the_config():
    doc = cond_doc({"fleet_has": {"capability": "gpu"}})
    assert reason(doc, capabilities=["board", "host"]) == 'unknown capability: "gpu"'


def test_success_when_valid_conditions_come_back_as_submitted():
    conditions = [
        {"step": "a", "exit_code": 0, "produced": ["a.out"], "within_attempts": True},
        {"step": "b", "produced": ["b.out"]},
        {"step": "q"},
        {"fleet_has": {"capability": "board", "soc": "x"}, "min_count": 2},
        {"fleet_has": {"as": "boards", "capability": "board"}},
    ]
    assert validate_contract(cond_doc(*conditions)).success_when == tuple(conditions)


# ---------------------------------------------------------------------------- ledger and queue


@pytest.mark.parametrize(
    ("ledger", "expected"),
    [
        ("work", 'ledger must be an object, got "work"'),
        ({"scope": "run", "keep": 1}, 'ledger: unknown field "keep"'),
        ({"scope": "global"}, 'ledger.scope must be "run" or "work", got "global"'),
        ({"scope": None}, 'ledger.scope must be "run" or "work", got null'),
    ],
    ids=["not-object", "unknown", "scope", "scope-null"],
)
def test_ledger_rules(ledger, expected):
    assert reason(contract(ledger=ledger)) == expected


@pytest.mark.parametrize(
    ("queue", "expected"),
    [
        ("30m", 'queue must be an object, got "30m"'),
        ({"timeout": "30m", "weight": 1}, 'queue: unknown field "weight"'),
        ({"priority": 101}, "queue.priority must be from -100 to 100, got 101"),
        ({"priority": -101}, "queue.priority must be from -100 to 100, got -101"),
        ({"priority": "high"}, 'queue.priority must be an integer, got "high"'),
        ({"priority": True}, "queue.priority must be an integer, got true"),
        ({"priority": 1.5}, "queue.priority must be an integer, got 1.5"),
        ({"timeout": 1800}, 'queue.timeout must be a duration like "30m" or "4h", got 1800'),
        (
            {"timeout": "half an hour"},
            'queue.timeout must be a duration like "30m" or "4h", got "half an hour"',
        ),
        ({"timeout": "0m"}, 'queue.timeout must be a duration like "30m" or "4h", got "0m"'),
    ],
    ids=[
        "not-object",
        "unknown",
        "priority-high",
        "priority-low",
        "priority-text",
        "priority-bool",
        "priority-float",
        "number",
        "words",
        "zero",
    ],
)
def test_queue_rules(queue, expected):
    assert reason(contract(queue=queue)) == expected


def test_queue_priority_is_kept_and_defaults_to_zero():
    assert validate_contract(contract()).priority == 0
    assert validate_contract(contract(queue={"priority": -100})).priority == -100
    assert validate_contract(contract(queue={"timeout": "1h", "priority": 100})).priority == 100


# ------------------------------------------------------------------------ the order of the rules


def test_the_first_rule_in_the_fixed_order_wins():
    doc = contract(run_id="bad id", requires=[], steps=[], ledger="x")
    assert reason(doc).startswith("run_id must be")
    doc["run_id"] = "ok"
    assert reason(doc).startswith("requires must be a non-empty list")
    doc["requires"] = contract()["requires"]
    assert reason(doc).startswith("steps must be a non-empty list")
    doc["steps"] = contract()["steps"]
    assert reason(doc).startswith("ledger must be an object")


def test_an_unknown_top_level_field_never_hides_a_failure():
    doc = contract(extra=1)
    del doc["run_id"]
    assert reason(doc) == "run_id is required"


def test_an_earlier_step_fails_before_a_later_one():
    doc = contract([run("a", out="x"), {"id": "b"}])
    assert reason(doc) == 'steps[0].out must be a list of artifact names, got "x"'


def test_a_steps_own_fields_are_checked_before_references_between_steps():
    doc = contract([run("a", uses="nobody"), run("b", out="x")])
    assert reason(doc) == 'steps[1].out must be a list of artifact names, got "x"'


def test_an_unknown_step_field_is_no_kind():
    assert reason(contract([{"id": "a", "bogus": ["x"]}])) == (
        'step "a" has no kind: give exactly one of run, agent, ask or acquire'
    )


def test_undeclared_role_is_checked_before_needs():
    doc = contract([run("a", uses="x", needs=["b"]), run("b")])
    assert reason(doc) == 'step "a" uses undeclared role "x"'


# -------------------------------------------------------------- property: nothing but BadRequest

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)

# Words the validator reacts to, so mutations reach deep rules instead of failing at the top.
VOCABULARY_WORDS = """
run_id work requires steps success_when ledger queue lease id system change_id as capability
count uses needs in out schema env workspace collect release dispatch loop validate_with
max_attempts run agent ask acquire prompt from answerers timeout show after then want
acquired unavailable to back_to max until exit_code produced step fleet_has min_count
within_attempts scope type properties items required enum additionalProperties model mcp
repo rev flash boot sign-off dut host extra board result.json decision result.json.ok fail
4h 0s object string work .. _x /abs feedback see list none changed patchset parent_rev
patch_rev 1.5h 250ms src/a.c
"""
VOCABULARY = [*VOCABULARY_WORDS.split(), ""]
INTERESTING = (
    st.sampled_from(VOCABULARY)
    | JSON_VALUES
    | st.sampled_from(
        [0, 1, 2, -1, True, False, None, [], {}, ["boot"], ["dut"], {"type": "object"}]
    )
)


def rich_contract() -> dict[str, Any]:
    """A valid contract that exercises most rules, as a seed for mutation."""
    doc = spec_example()
    doc["steps"][0]["release"] = ["host"]
    doc["steps"][0]["env"] = ["CC"]
    doc["steps"][0]["collect"] = {"flash.log": "logs/flash.log"}
    doc["steps"][0]["workspace"] = {"repo": "gerrit.example.com/kernel", "rev": "abc"}
    doc["steps"][0]["feedback"] = ["keep it short"]
    doc["steps"][0]["see"] = {"ledger": "list", "from": []}
    doc["work"].update(patchset=3, parent_rev="p", patch_rev="q")
    doc["steps"][1]["dispatch"] = {"from": "result.json.ok", "to": ["sign-off", "more"]}
    doc["steps"][1]["validate_with"] = "check"
    doc["steps"].extend(
        [
            {
                "id": "more",
                "acquire": {
                    "want": {"as": "extra", "capability": "board"},
                    "acquired": "use",
                    "unavailable": "check",
                },
            },
            {"id": "use", "uses": "extra", "agent": {"model": "m"}, "in": {"from": ["flash.log"]}},
            {
                "id": "check",
                "uses": "dut",
                "run": ["c"],
                "needs": ["boot"],
                "out": ["r"],
                "loop": {"back_to": "boot", "max": 2, "until": {"exit_code": 0}},
            },
        ]
    )
    doc["success_when"].append({"fleet_has": {"capability": "board"}, "min_count": 1})
    doc["success_when"].append({"step": "flash", "changed": ["src/a.c"]})
    doc["ledger"] = {"scope": "work"}
    doc["queue"] = {"timeout": "1h"}
    return doc


def test_rich_contract_is_valid():
    c = validate_contract(rich_contract())
    assert [s.needs for s in c.steps] == [(), (1,), (2,), (2,), (4,), (2,)]


def containers(obj: object, path: tuple = ()) -> list[tuple]:
    found = []
    if isinstance(obj, dict):
        found.append(path)
        for k, v in obj.items():
            found.extend(containers(v, (*path, k)))
    elif isinstance(obj, list):
        found.append(path)
        for i, v in enumerate(obj):
            found.extend(containers(v, (*path, i)))
    return found


def fresh(data: st.DataObject) -> Any:
    # A copy: sampled constants such as [] are shared objects that a later mutation would change.
    return copy.deepcopy(data.draw(INTERESTING))


def mutate(doc: dict[str, Any], data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(containers(doc)))
    target: Any = doc
    for part in path:
        target = target[part]
    op = data.draw(st.sampled_from(["replace", "delete", "insert"]))
    if isinstance(target, dict):
        if op == "insert" or not target:
            key = data.draw(st.sampled_from(VOCABULARY) | st.text(max_size=6))
            target[key] = fresh(data)
        else:
            key = data.draw(st.sampled_from(sorted(target)))
            if op == "delete":
                del target[key]
            else:
                target[key] = fresh(data)
    elif op == "insert" or not target:
        target.insert(data.draw(st.integers(0, len(target))), fresh(data))
    else:
        index = data.draw(st.integers(0, len(target) - 1))
        if op == "delete":
            del target[index]
        else:
            target[index] = fresh(data)


def assert_only_bad_request(doc: object) -> None:
    try:
        c = validate_contract(doc)
    except BadRequest as exc:
        assert exc.status == 400
        assert isinstance(exc.reason, str) and exc.reason
        assert len(exc.reason) < 1000
        return
    # When it passes, the normalised output keeps its invariants.
    assert [s.seq for s in c.steps] == list(range(1, len(c.steps) + 1))
    for s in c.steps:
        assert list(s.needs) == sorted(set(s.needs))
        assert all(1 <= n < s.seq for n in s.needs)
    assert re.fullmatch(r"[0-9a-f]{64}", c.requires_key)
    assert "lease" not in c.document
    json.dumps(c.document)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON_VALUES)
def test_arbitrary_json_raises_nothing_but_bad_request(value):
    assert_only_bad_request(value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(VOCABULARY[:8]), INTERESTING, max_size=8))
def test_contract_shaped_json_raises_nothing_but_bad_request(value):
    assert_only_bad_request(value)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_contracts_raise_nothing_but_bad_request(data):
    doc = copy.deepcopy(rich_contract())
    for _ in range(data.draw(st.integers(1, 4))):
        mutate(doc, data)
    assert_only_bad_request(doc)
