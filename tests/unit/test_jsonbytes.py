"""The JSON the Mediator writes itself (app/jsonbytes.py): the standard library's bytes for
ASCII text, and every document the standard library takes is written, orjson's refusals
included."""

from __future__ import annotations

import datetime
import json

import pytest

from app.jsonbytes import compact, pretty

WHEN = datetime.datetime(2026, 12, 5, 20, 0, 1, 234567, tzinfo=datetime.UTC)


def stdlib_pretty(doc: object) -> bytes:
    return json.dumps(doc, indent=2, sort_keys=True, default=str).encode() + b"\n"


@pytest.mark.parametrize(
    "doc",
    [
        {"b": [1, 2, {"z": None, "a": True}], "a": {}, "c": [], "d": 1.5, "e": "x"},
        {"run_id": "r-1", "created_at": WHEN, "steps": [{"id": "flash", "run": ["a", "b"]}]},
        [],
        "text",
    ],
)
def test_ascii_documents_are_written_as_the_standard_library_writes_them(doc: object):
    assert pretty(doc) == stdlib_pretty(doc)
    if "created_at" not in str(doc):  # a time: the standard library's dumps refuses it
        assert json.loads(compact(doc)) == json.loads(json.dumps(doc))


@pytest.mark.parametrize(
    "doc",
    [
        {"run": ["echo", "\ud800"]},  # a lone surrogate: not UTF-8
        {"n": 2**70},  # beyond 64 bits
        {1: "a key that is not a string"},
    ],
)
def test_what_orjson_refuses_is_written_by_the_standard_library(doc: object):
    assert pretty(doc) == stdlib_pretty(doc)
    assert compact(doc) == json.dumps(doc).encode()


def test_other_text_is_utf8():
    doc = {"label": "salle é"}
    assert json.loads(pretty(doc)) == doc
    assert "é".encode() in pretty(doc) and "é".encode() in compact(doc)


# ---------------------------------------------------------------- answers and log lines


def answer_body(doc: object) -> bytes:
    from flask import Flask

    from app.jsonbytes import AnswerJSON

    app = Flask("answers")
    app.json = AnswerJSON(app)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    with app.app_context():
        return app.json.response(doc).get_data()


def flask_body(doc: object) -> bytes:
    from flask import Flask

    app = Flask("answers")
    app.json.sort_keys = False  # type: ignore[attr-defined]
    with app.app_context():
        return app.json.response(doc).get_data()


@pytest.mark.parametrize(
    "doc",
    [
        {
            "run_id": "r-1",
            "state": "RUNNING",
            "steps": [{"id": "a", "n": 1, "x": None}],
            "ok": True,
        },
        {"b": 1, "a": [1.5, -2, {"z": False}]},  # keys keep their order
        {"when": WHEN},  # a time, as Flask writes one (an HTTP date)
        {"n": 2**70},  # beyond 64 bits: Flask's own encoder
        {"run": ["echo", "\ud800"]},  # a lone surrogate: Flask's own encoder
        [],
    ],
)
def test_an_answer_body_is_the_json_flask_writes_for_ascii_text(doc: object):
    assert answer_body(doc) == flask_body(doc)


def test_an_answer_body_writes_other_text_as_utf8_and_means_the_same():
    doc = {"label": "bänk ✓", "attrs": {"zone": "東"}}
    body = answer_body(doc)
    assert "bänk ✓".encode() in body
    assert json.loads(body) == json.loads(flask_body(doc)) == doc


def test_a_log_line_is_one_line_of_json_whatever_its_values():
    from app.logs import _line

    class Odd:
        def __repr__(self) -> str:
            return "<odd>"

    def fallback(obj: object) -> object:
        return repr(obj)

    line = _line({"event": "x", "n": 2**70, "o": Odd(), "t": "é\n"}, default=fallback)
    assert "\n" not in line
    assert json.loads(line) == {"event": "x", "n": 2**70, "o": "<odd>", "t": "é\n"}
