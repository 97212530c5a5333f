"""An ask's form from its schema and the answer read back (docs/pages.md#asks-asks; app/pages/askform.py,
pure), and a run's timeline (app/pages/timeline.py, pure)."""

from __future__ import annotations

from datetime import UTC, datetime

from app.pages.askform import TOP, field_of_violation, form_of, read_answer
from app.pages.timeline import LABEL, NO_NODE_LANE, WIDTH, timeline

SCHEMA = {
    "type": "object",
    "required": ["verdict", "boards"],
    "properties": {
        "verdict": {"enum": ["approve", "reject"], "title": "Verdict"},
        "severity": {"enum": [1, 2, 3]},
        "boots": {"type": "boolean", "description": "did it boot?"},
        "boards": {"type": "integer"},
        "volts": {"type": "number"},
        "note": {"type": "string"},
        "maybe": {"type": ["string", "null"]},
    },
}


def test_an_object_with_a_property_named_like_the_csrf_field_is_one_json_field() -> None:
    # An ask stored before such names were refused: its property would share the form's own
    # csrf_token input, so the whole answer is typed as JSON and the token never read into it.
    schema = {"type": "object", "properties": {"csrf_token": {"type": "string"}}}
    form = form_of(schema)
    assert [(f.name, f.kind) for f in form.fields] == [(TOP, "json")] and form.whole
    sent = {"csrf_token": "the-page's-token", TOP: '{"csrf_token": "typed"}'}
    assert read_answer(form, sent).value == {"csrf_token": "typed"}


def test_each_property_becomes_the_field_of_its_type() -> None:
    form = form_of(SCHEMA)
    kinds = {f.name: f.kind for f in form.fields}
    assert kinds == {
        "verdict": "enum",
        "severity": "select",  # one set of buttons a form: the second enum is a choice list
        "boots": "boolean",
        "boards": "integer",
        "volts": "number",
        "note": "string",
        "maybe": "json",
    }
    assert form.buttons is not None and form.buttons.name == "verdict"
    by_name = {f.name: f for f in form.fields}
    assert by_name["verdict"].label == "Verdict" and by_name["boards"].label == "boards"
    assert by_name["boots"].help == "did it boot?"
    assert by_name["severity"].options == (("1", 1), ("2", 2), ("3", 3))
    assert by_name["verdict"].required and not by_name["note"].required


def test_no_schema_is_one_json_field_for_the_whole_answer() -> None:
    form = form_of(None)
    assert form.whole and [(f.name, f.kind) for f in form.fields] == [(TOP, "json")]
    assert read_answer(form, {TOP: '{"a": [1]}'}).value == {"a": [1]}
    assert read_answer(form, {}).errors == {TOP: "an answer is needed"}


def test_the_answer_takes_typed_values_and_leaves_empty_optional_fields_out() -> None:
    sent = {
        "verdict": "approve",
        "severity": "2",
        "boards": "3",
        "volts": "3.3",
        "note": "",
        "maybe": "null",
    }
    reading = read_answer(form_of(SCHEMA), sent)
    assert reading.errors == {}
    assert reading.value == {
        "verdict": "approve",
        "severity": 2,
        "boots": False,  # unchecked: false
        "boards": 3,
        "volts": 3.3,
        "maybe": None,
    }


def test_a_value_the_form_cannot_read_is_an_error_of_its_field_and_keeps_the_text() -> None:
    sent = {"verdict": "maybe", "boards": "3.5", "volts": "high", "maybe": "{"}
    reading = read_answer(form_of(SCHEMA), sent)
    assert set(reading.errors) == {"verdict", "boards", "volts", "maybe"}
    assert reading.errors["boards"] == "not a whole number"
    assert reading.errors["maybe"].startswith("not JSON: ")
    assert reading.typed["volts"] == "high"


def test_a_violation_is_placed_beside_its_field() -> None:
    form = form_of(SCHEMA)
    assert field_of_violation(form, "schema violation: $.boards: 'x' is not of type 'integer'") == (
        "boards"
    )
    assert field_of_violation(form, "schema violation: $: 'boards' is a required property") == (
        "boards"
    )
    assert field_of_violation(form, "schema violation: $: 'other' is a required property") == ""
    assert field_of_violation(form_of(None), "schema violation: $: whatever") == TOP


def at(second: int) -> str:
    return f"2026-12-05T12:00:{second:02d}Z"


def test_the_timeline_draws_one_lane_per_node_in_order_of_start() -> None:
    steps = [
        {"id": "ask", "state": "DONE", "started_at": at(0), "ended_at": at(2)},
        {"id": "flash", "state": "DONE", "node": "b1", "started_at": at(2), "ended_at": at(6)},
        {"id": "scope", "state": "CLAIMED", "node": "s1", "started_at": at(4)},
        {"id": "boot", "state": "PENDING", "node": "b1"},
    ]
    pic = timeline(steps, datetime(2026, 12, 5, 12, 0, 10, tzinfo=UTC))
    assert [lane.node for lane in pic.lanes] == [NO_NODE_LANE, "b1", "s1"]
    scale = (WIDTH - LABEL) / 10
    flash = pic.lanes[1].bars[0]
    assert (flash.x, flash.width) == (LABEL + 2 * scale, 4 * scale)
    running = pic.lanes[2].bars[0]  # still running: drawn up to now
    assert running.x + running.width == WIDTH
    assert timeline([], datetime.now(UTC)).lanes == ()
