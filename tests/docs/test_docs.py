"""The user documentation says what the code does (no database needed).

- docs/contract.md: every ```json block is JSON; every block that is a complete contract (it has
  ``run_id``, ``requires`` and ``steps``) passes the server's own validator, unless the line
  before the block is ``<!-- invalid: <reason> -->``: then validation fails with exactly that
  reason. ``<!-- warns: <line> -->`` before a block: the contract is valid and ``<line>`` is one
  of its warnings.
- docs/configuration.md names every configuration key of app/config.py with its environment
  variable.
- docs/security.md names only test files that exist; no page points at the design notes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.config import KEYS, Key
from app.contract import validate_contract
from app.errors import BadRequest

DOCS = Path(__file__).resolve().parents[2] / "docs"
CONTRACT_MD = DOCS / "contract.md"
CONFIGURATION_MD = DOCS / "configuration.md"

_FENCE = re.compile(r"^```json[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_MARK = re.compile(r"<!--\s*(invalid|warns):\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    text: str
    mark: str | None  # "invalid", "warns" or None
    expect: str | None  # the reason or warning the mark names

    @property
    def doc(self) -> object:
        return json.loads(self.text)

    @property
    def is_contract(self) -> bool:
        doc = self.doc
        return isinstance(doc, dict) and {"run_id", "requires", "steps"} <= doc.keys()


def json_blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    blocks = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        blocks.append(
            Block(
                line=text.count("\n", 0, m.start()) + 1,
                text=m.group(1),
                mark=mark.group(1) if mark else None,
                expect=mark.group(2) if mark else None,
            )
        )
    return blocks


BLOCKS = json_blocks(CONTRACT_MD)


def _id(block: Block) -> str:
    return f"contract.md:{block.line}"


def test_the_page_has_what_the_tests_below_check() -> None:
    contracts = [b for b in BLOCKS if b.is_contract]
    assert len(contracts) >= 10
    assert sum(b.mark == "invalid" for b in contracts) >= 3
    assert sum(b.mark is None for b in contracts) >= 8


@pytest.mark.parametrize("block", BLOCKS, ids=_id)
def test_every_json_block_is_json(block: Block) -> None:
    try:
        json.loads(block.text)
    except json.JSONDecodeError as exc:
        pytest.fail(f"contract.md line {block.line}: not JSON: {exc}")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.mark], ids=_id)
def test_marks_stand_before_complete_contracts(block: Block) -> None:
    assert block.is_contract, f"contract.md line {block.line}: a mark before a fragment"


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.is_contract and b.mark != "invalid"], ids=_id
)
def test_complete_contracts_are_valid(block: Block) -> None:
    try:
        contract = validate_contract(block.doc)
    except BadRequest as exc:
        pytest.fail(f"contract.md line {block.line}: {exc.reason}")
    if block.mark == "warns":
        assert block.expect in contract.warnings


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.mark == "invalid"], ids=_id)
def test_invalid_contracts_fail_with_the_reason_shown(block: Block) -> None:
    with pytest.raises(BadRequest) as caught:
        validate_contract(block.doc)
    assert caught.value.reason == block.expect


@pytest.mark.parametrize("key", KEYS, ids=lambda k: k.name)
def test_every_configuration_key_is_documented(key: Key) -> None:
    text = CONFIGURATION_MD.read_text(encoding="utf-8")
    assert f"`{key.name}`" in text, f"{key.name} is missing from docs/configuration.md"
    assert f"`{key.env}`" in text, f"{key.env} is missing from docs/configuration.md"


def test_every_test_file_the_threat_model_names_exists() -> None:
    """docs/security.md says which test shows each defence: those files must be there."""
    text = (DOCS / "security.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(tests/[\w/]+(?:\.py)?)`", text))
    assert len(named) >= 10
    root = DOCS.parent
    missing = sorted(path for path in named if not (root / path).exists())
    assert missing == [], f"docs/security.md names tests that do not exist: {missing}"


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_the_pages_stand_alone(page: Path) -> None:
    """User documentation never points at the design notes the service was built from."""
    text = page.read_text(encoding="utf-8")
    for word in ("SPEC", "\u00a7", "/work/"):
        assert word not in text, f"docs/{page.name} mentions {word!r}"
