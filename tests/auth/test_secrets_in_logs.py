"""No secret, and no hash of one, in any log line: requests with right and wrong tokens of every
kind, refusals, and the configuration's own errors."""

from __future__ import annotations

import hashlib

import argon2
import pytest

from app.config import load_config
from app.errors import ConfigError
from tests.support.actors import cap
from tests.support.apps import TOKEN, app_on
from tests.support.tokens import SECRETS, sha256_entry, token_client

ARGON2_SECRET = "argon2-secret-that-must-not-leak"
ARGON2_HASH = argon2.PasswordHasher().hash(ARGON2_SECRET)
SHA_SECRET = "sha256-secret-that-must-not-leak"
WRONG = "a-wrong-secret-that-must-not-leak"


def leaked(text: str) -> list[str]:
    words = [
        ARGON2_SECRET,
        SHA_SECRET,
        WRONG,
        TOKEN,
        hashlib.sha256(SHA_SECRET.encode()).hexdigest(),
    ]
    words += [ARGON2_HASH.rsplit("$", 1)[-1]]
    return [w for w in words if w in text]


def test_no_request_logs_a_secret(db_url, tmp_path, capfd):
    tokens = [
        {"name": "argon", "argon2": ARGON2_HASH, "roles": ["node"], "nodes": ["n1"]},
        sha256_entry("sha", SHA_SECRET, "submitter", principal="p@example.com"),
    ]
    capfd.readouterr()
    with app_on(
        db_url, tmp_path / "r", tokens=tokens, **{"log.format": "json", "log.level": "debug"}
    ) as app:
        node, sub = token_client(app, ARGON2_SECRET), token_client(app, SHA_SECRET)
        assert (
            node.post("/v1/nodes", json={"node_id": "n1", "capabilities": [cap()]}).status_code
            == 200
        )
        assert (
            node.post("/v1/nodes", json={"node_id": "n2", "capabilities": [cap()]}).status_code
            == 403
        )
        assert node.post("/v1/runs", json={}).status_code == 403
        assert token_client(app, SHA_SECRET, "x@example.com").get("/v1/runs").status_code == 403
        assert sub.post("/v1/runs/dry-run", json={"run_id": "r"}).status_code == 400
        assert token_client(app, WRONG).get("/v1/runs").status_code == 401
        assert token_client(app, TOKEN).get("/v1/runs").status_code == 200
        with app.test_client() as raw:
            assert raw.get("/v1/runs", headers={"Authorization": WRONG}).status_code == 401
            assert (
                raw.get("/v1/runs", headers={"Authorization": f"Basic {WRONG}"}).status_code == 401
            )
    out, err = capfd.readouterr()
    logged = out + err
    assert logged.count('"request"') >= 9, logged[-2000:]  # the lines are there to look at
    assert leaked(logged) == []


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "a", "sha256": hashlib.sha256(SHA_SECRET.encode()).hexdigest(), "roles": ["x"]},
        {"name": "a", "argon2": ARGON2_HASH, "roles": ["node"], "nodes": "n1"},
        {"name": "a", "argon2": ARGON2_HASH[:-4] + "$$$$", "roles": ["node"]},
        {"name": SHA_SECRET + "/", "sha256": "0" * 64, "roles": ["node"]},
    ],
)
def test_a_configuration_error_shows_no_hash(entry):
    with pytest.raises(ConfigError) as err:
        load_config(env={}, overrides={"tokens": [entry]})
    assert leaked(str(err.value)) == []


def test_a_plain_secret_given_as_mediator_tokens_is_not_echoed():
    with pytest.raises(ConfigError) as err:
        load_config(env={"MEDIATOR_TOKENS": SECRETS["legacy"]})
    assert TOKEN not in str(err.value)
