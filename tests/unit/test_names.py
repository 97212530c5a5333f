"""One definition of what a name may be (app/names.py, docs/contract.md#limits): the contract's
validator, the wire schemas, the OpenAPI document's path parameters, the agent's configuration
and the tokens all take and refuse the same names, and no module restates the rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from marshmallow import ValidationError

from app.agent.config import CAPABILITY, NODE_ID
from app.api.openapi import ID_SCHEMA
from app.api.schemas import NAME
from app.contract.fields import is_valid_id
from app.names import CAPABILITY_RE, NAME_CHARACTERS, is_capability, is_name

APP = Path(__file__).resolve().parents[2] / "app"

GOOD = ["n1", "board-2", "run.2026-12-07", "a:b@c", "_x", "x" * 200]
BAD = ["", "x" * 201, "n 1", "n/1", "n1\n", "é", "n\u202e1"]


def _schema_takes(name: str) -> bool:
    try:
        for check in NAME:
            check(name)
    except ValidationError:
        return False
    return True


def _openapi_takes(name: str) -> bool:
    return (
        ID_SCHEMA["minLength"] <= len(name) <= ID_SCHEMA["maxLength"]
        and re.search(str(ID_SCHEMA["pattern"]).replace("$", r"\Z"), name) is not None
    )


@pytest.mark.parametrize("name", GOOD + BAD)
def test_every_place_takes_the_same_names(name: str) -> None:
    expected = name in GOOD
    assert is_name(name) is expected
    assert is_valid_id(name) is expected
    assert (NODE_ID.fullmatch(name) is not None) is expected
    assert _schema_takes(name) is expected
    assert _openapi_takes(name) is expected


@pytest.mark.parametrize(
    ("name", "expected"), [("board", True), ("usb.hub-2", True), ("Board", False), ("2x", False)]
)
def test_the_agent_and_the_contract_take_the_same_capability_names(name: str, expected: bool):
    assert is_capability(name) is expected
    assert (CAPABILITY.fullmatch(name) is not None) is expected
    assert CAPABILITY is CAPABILITY_RE


def test_no_module_restates_the_name_rule() -> None:
    restated = [
        f"{path.relative_to(APP.parent)}:{n}"
        for path in sorted(APP.rglob("*.py"))
        if path.name != "names.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if NAME_CHARACTERS in line or "[a-z][a-z0-9._-]" in line
    ]
    assert restated == []
