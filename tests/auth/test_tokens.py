"""The configured tokens: entries checked at start-up (one line naming the field, never a hash),
sha256 and argon2 hashes both verified, the legacy token beside them, and a per-process cache
that checks a secret's hashes once."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import argon2
import pytest
from click.testing import CliRunner

import app.tokens
from app.commands.main import main
from app.config import load_config
from app.errors import ConfigError
from app.tokens import ALL_ROLES, TokenSet, legacy_token, parse_tokens
from tests.support.apps import TOKEN
from tests.support.tokens import sha256_entry, token_client

ARGON2_SECRET = "an-argon2-secret"
ARGON2_HASH = argon2.PasswordHasher().hash(ARGON2_SECRET)
SHA_SECRET = "a-sha256-secret"
SHA_HEX = hashlib.sha256(SHA_SECRET.encode()).hexdigest()


def argon2_entry(name: str = "argon", **extra: Any) -> dict[str, Any]:
    return {"name": name, "argon2": ARGON2_HASH, "roles": ["reader"], **extra}


# ------------------------------------------------------------------ entries


def test_an_entry_becomes_a_token_with_its_fields():
    (tok,) = parse_tokens(
        "tokens",
        [
            {
                "name": "bench-3",
                "sha256": SHA_HEX.upper(),
                "roles": ["node", "reader"],
                "nodes": ["n1", "n2"],
                "principal": "lab@example.com",
                "max_priority": -5,
            }
        ],
    )
    assert tok.name == "bench-3"
    assert tok.roles == {"node", "reader"}
    assert tok.nodes == {"n1", "n2"}
    assert tok.principal == "lab@example.com"
    assert tok.max_priority == -5
    assert tok.sha256 == hashlib.sha256(SHA_SECRET.encode()).digest()


@pytest.mark.parametrize(
    ("roles", "priority"),
    [
        (["submitter"], 0),
        (["reader", "answerer"], 0),
        (["operator"], 100),
        (["node", "operator"], 100),
    ],
)
def test_max_priority_defaults_to_0_and_to_100_for_operators(roles, priority):
    (tok,) = parse_tokens("tokens", [sha256_entry("t", "x", *roles)])
    assert tok.max_priority == priority


def test_an_explicit_max_priority_beats_the_operators_default():
    (tok,) = parse_tokens("tokens", [sha256_entry("t", "x", "operator", max_priority=10)])
    assert tok.max_priority == 10


def test_the_legacy_token_has_every_role_and_priority_100():
    tok = legacy_token("old-secret")
    assert (tok.name, tok.roles, tok.max_priority, tok.nodes) == ("token", ALL_ROLES, 100, None)


BAD_ENTRIES = [
    ("not a mapping", ["x"], "tokens[0]: must be a mapping"),
    ("no name", [{"sha256": SHA_HEX, "roles": ["node"]}], "tokens[0].name:"),
    ("a name with a space", [sha256_entry("a b", "x", "node")], "tokens[0].name:"),
    ("the legacy name", [sha256_entry("token", "x", "node")], "tokens[0].name:"),
    ("no hash", [{"name": "a", "roles": ["node"]}], "tokens[0]: needs exactly one of sha256"),
    (
        "two hashes",
        [{"name": "a", "sha256": SHA_HEX, "argon2": ARGON2_HASH, "roles": ["node"]}],
        "tokens[0]: needs exactly one",
    ),
    (
        "a short sha256",
        [{"name": "a", "sha256": SHA_HEX[:-2], "roles": ["node"]}],
        "tokens[0].sha256:",
    ),
    ("not hex", [{"name": "a", "sha256": "z" * 64, "roles": ["node"]}], "tokens[0].sha256:"),
    (
        "a plain secret",
        [{"name": "a", "argon2": "hunter2", "roles": ["node"]}],
        "tokens[0].argon2:",
    ),
    (
        "a broken argon2 hash",
        [{"name": "a", "argon2": ARGON2_HASH[:30], "roles": ["node"]}],
        "tokens[0].argon2:",
    ),
    ("no roles", [{"name": "a", "sha256": SHA_HEX}], "tokens[0].roles:"),
    (
        "an unknown role",
        [sha256_entry("a", "x", "admin")],
        "tokens[0].roles: 'admin' is not a role",
    ),
    ("roles as text", [{"name": "a", "sha256": SHA_HEX, "roles": "node"}], "tokens[0].roles:"),
    (
        "a typo in a field",
        [sha256_entry("a", "x", "node", role="node")],
        "tokens[0].role: unknown field",
    ),
    ("empty nodes", [sha256_entry("a", "x", "node", nodes=[])], "tokens[0].nodes:"),
    ("a bad node id", [sha256_entry("a", "x", "node", nodes=["a/b"])], "tokens[0].nodes:"),
    (
        "nodes without the node role",
        [sha256_entry("a", "x", "reader", nodes=["n1"])],
        "tokens[0].nodes:",
    ),
    ("a principal not text", [sha256_entry("a", "x", "node", principal=3)], "tokens[0].principal:"),
    (
        "priority out of range",
        [sha256_entry("a", "x", "node", max_priority=101)],
        "tokens[0].max_priority:",
    ),
    (
        "priority a bool",
        [sha256_entry("a", "x", "node", max_priority=True)],
        "tokens[0].max_priority:",
    ),
    (
        "a name twice",
        [sha256_entry("a", "x", "node"), sha256_entry("a", "y", "node")],
        "tokens[1].name:",
    ),
    (
        "a secret twice",
        [sha256_entry("a", "x", "node"), sha256_entry("b", "x", "reader")],
        "tokens[1].sha256:",
    ),
    ("not a list", {"name": "a"}, "tokens: must be a list"),
]


@pytest.mark.parametrize(
    ("entries", "start"), [c[1:] for c in BAD_ENTRIES], ids=[c[0] for c in BAD_ENTRIES]
)
def test_a_bad_entry_stops_the_configuration_with_one_line_naming_it(entries, start):
    with pytest.raises(ConfigError) as err:
        load_config(env={}, overrides={"tokens": entries})
    message = str(err.value)
    assert message.startswith(start), message
    assert "\n" not in message
    assert SHA_HEX not in message.lower() and ARGON2_HASH[30:] not in message


def test_mediator_tokens_holds_the_list_as_json():
    env = {"MEDIATOR_TOKENS": json.dumps([argon2_entry(), sha256_entry("s", SHA_SECRET, "node")])}
    tokens = load_config(env=env)["tokens"]
    assert [t.name for t in tokens] == ["argon", "s"]


def test_mediator_tokens_that_is_not_json_names_the_key():
    with pytest.raises(ConfigError, match=r"^tokens: must be a JSON list"):
        load_config(env={"MEDIATOR_TOKENS": "[{"})


def test_a_config_file_lists_tokens(tmp_path: Path):
    path = tmp_path / "mediator.yaml"
    path.write_text(
        "tokens:\n"
        f"  - name: ci\n    sha256: {SHA_HEX}\n    roles: [submitter]\n"
        f"  - name: bench\n    argon2: '{ARGON2_HASH}'\n    roles: [node]\n    nodes: [n1]\n",
        encoding="utf-8",
    )
    tokens = load_config(path, env={})["tokens"]
    assert [(t.name, sorted(t.roles), t.nodes) for t in tokens] == [
        ("ci", ["submitter"], None),
        ("bench", ["node"], frozenset({"n1"})),
    ]


def test_the_command_line_stops_on_a_bad_entry_with_one_line(tmp_path: Path):
    env = {
        "MEDIATOR_TOKENS": json.dumps([sha256_entry("a", "x", "admin")]),
        "MEDIATOR_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
    }
    result = CliRunner().invoke(main, ["db", "check"], env=env)
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "mediator: invalid configuration: tokens[0].roles: 'admin' is not a role"
        " (submitter, node, answerer, reader, operator)"
    ]


# ------------------------------------------------------------------ verification and the cache


def test_sha256_and_argon2_hashes_both_verify_and_nothing_else_does():
    tokens = TokenSet(
        parse_tokens("tokens", [argon2_entry(), sha256_entry("s", SHA_SECRET, "node")])
    )
    assert tokens.verify(ARGON2_SECRET).name == "argon"
    assert tokens.verify(SHA_SECRET).name == "s"
    for wrong in ("", "nope", ARGON2_HASH, SHA_HEX, SHA_SECRET + " ", ARGON2_SECRET.upper()):
        assert tokens.verify(wrong) is None


@pytest.fixture
def checks(monkeypatch) -> list[str]:
    """Every call of the slow check of a secret against one token's hash, by token name."""
    calls: list[str] = []
    real = app.tokens.check_secret

    def counting(token: Any, secret: str, digest: bytes) -> bool:
        calls.append(token.name)
        return real(token, secret, digest)

    monkeypatch.setattr(app.tokens, "check_secret", counting)
    return calls


def test_a_secret_is_checked_against_the_hashes_once_per_process(checks):
    tokens = TokenSet(
        parse_tokens("tokens", [argon2_entry(), sha256_entry("s", SHA_SECRET, "node")])
    )
    assert tokens.verify(ARGON2_SECRET).name == "argon"
    assert checks == ["argon"]  # the sha256 entry by its digest, then the legacy argon2 one

    for _ in range(3):
        assert tokens.verify(ARGON2_SECRET).name == "argon"
        assert tokens.verify("wrong") is None
    assert checks == ["argon", "argon"]  # and once for the wrong one


def test_the_server_checks_an_argon2_token_once_across_requests(tmp_path, db_url, checks):
    from tests.support.apps import app_on

    with app_on(db_url, tmp_path / "records", tokens=[argon2_entry()]) as application:
        reader = token_client(application, ARGON2_SECRET)
        assert reader.get("/v1/runs").status_code == 200
        after_first = list(checks)
        assert reader.get("/v1/runs").status_code == 200
        assert token_client(application, ARGON2_SECRET).get("/v1/nodes").status_code == 200
        assert after_first == ["argon"]  # the legacy token's digest costs no slow check
        assert checks == after_first
        assert token_client(application, TOKEN).get("/v1/runs").status_code == 200


def test_a_configuration_handed_on_keeps_its_tokens():
    first = load_config(env={}, overrides={"tokens": [argon2_entry()]})
    again = load_config(env={}, overrides={"tokens": first["tokens"]})
    assert again["tokens"] == first["tokens"]
