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
