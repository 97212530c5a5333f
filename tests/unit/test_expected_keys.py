"""The duration keys the expected start computes from the stored JSON text
(app/services/expected.py) are the keys a result records (app.estimate.duration_key on the decoded
documents), whether the contract is small enough to be remembered or not."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.estimate import duration_key, roles_by_name
from app.services.expected import DURATION_KEYS_DOCUMENT_MAX, _duration_keys


def _contract(padding: int) -> tuple[list[dict[str, Any]], list[tuple[str, str, str | None, Any]]]:
    requires = [{"as": "dut", "capability": "board", "attrs": {"kind": "a", "pad": "x" * padding}}]
    steps = [
        ("flash", "run", "dut", {"run": ["flash", "image.bin"]}),
        ("ask", "ask", None, {"ask": {"prompt": "ok?"}}),
        ("boot", "run", "dut", {"run": ["boot-test"]}),
    ]
    return requires, steps


@pytest.mark.parametrize("padding", [0, DURATION_KEYS_DOCUMENT_MAX], ids=["kept", "too big"])
def test_the_keys_from_json_text_are_the_keys_a_result_records(padding: int) -> None:
    requires, steps = _contract(padding)
    roles = roles_by_name(requires, [spec for *_, spec in steps])
    expected = tuple(
        duration_key(step_id, kind, spec, roles.get(uses or "")) if kind == "run" else None
        for step_id, kind, uses, spec in steps
    )
    docs = tuple((step_id, kind, uses, json.dumps(spec)) for step_id, kind, uses, spec in steps)
    assert _duration_keys(json.dumps(requires), docs) == expected
    assert _duration_keys(json.dumps(requires), docs) == expected  # again: remembered, or not
    assert expected[0] is not None and expected[1] is None and expected[0] != expected[2]
