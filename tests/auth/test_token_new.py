"""``mediator token new`` prints a secret once and the entry to configure; a Mediator configured
with only that entry (no legacy token) accepts the secret, in a test app and in gunicorn."""

from __future__ import annotations

import json
from typing import Any

import argon2
import pytest
import requests
import yaml
from click.testing import CliRunner

from app import create_app
from app.commands.main import main
from app.config import load_config
from tests.support.actors import cap
from tests.support.apps import TOKEN, app_on, gunicorn_on
from tests.support.tokens import forbidden, token_client


def token_new(*args: str) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """Run the command; the secret, the YAML entry (a one-item list) and the JSON entry."""
    result = CliRunner().invoke(main, ["token", "new", *args])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("#") and lines[2].startswith("#")
    secret = lines[1]
    json_at = next(i for i, line in enumerate(lines) if "MEDIATOR_TOKENS" in line)
    yaml_entry = yaml.safe_load("\n".join(lines[3:json_at]))
    (json_line,) = lines[json_at + 1 :]
    return secret, yaml_entry, json.loads(json_line)


def test_the_printed_entry_holds_an_argon2_hash_of_the_secret_and_not_the_secret():
    secret, from_yaml, from_json = token_new(
        "--name", "bench-7", "--role", "node", "--role", "reader", "--node", "n1",
        "--principal", "lab@example.com", "--max-priority", "5",
    )  # fmt: skip

    assert from_yaml == [from_json]
    assert {k: v for k, v in from_json.items() if k not in {"argon2", "id"}} == {
        "name": "bench-7",
        "roles": ["node", "reader"],
        "nodes": ["n1"],
        "principal": "lab@example.com",
        "max_priority": 5,
    }
    assert from_json["argon2"].startswith("$argon2id$")
    assert argon2.PasswordHasher().verify(from_json["argon2"], secret)
    assert secret not in json.dumps(from_json)
    assert len(secret) >= 40
    assert secret.startswith(f"med_{from_json['id']}_")  # the id names the entry to check


def test_two_new_tokens_have_different_secrets():
    assert (
        token_new("--name", "a", "--role", "reader")[0]
        != token_new("--name", "a", "--role", "reader")[0]
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--name", "a", "--role", "admin"], "'admin' is not one of"),
        (["--name", "a"], "Missing option '--role'"),
        (["--name", "a b", "--role", "node"], "name: must be 1-200 characters"),
        (["--name", "a", "--role", "reader", "--node", "n1"], "nodes: only a token with the node"),
        (["--name", "a", "--role", "node", "--max-priority", "101"], "101 is not in the range"),
    ],
)
def test_a_wrong_option_is_a_usage_error_and_prints_no_secret(args, says):
    result = CliRunner().invoke(main, ["token", "new", *args])
    assert result.exit_code == 2
    assert says in result.output
    assert "argon2" not in result.output


def test_a_mediator_with_only_the_printed_yaml_entries_accepts_their_secrets(db_url, tmp_path):
    node_secret, node_entry, _ = token_new("--name", "bench-1", "--role", "node", "--node", "n1")
    sub_secret, sub_entry, _ = token_new("--name", "ci", "--role", "submitter")

    with app_on(db_url, tmp_path / "r", token=None, tokens=node_entry + sub_entry) as app:
        node, submitter = token_client(app, node_secret), token_client(app, sub_secret)
        advert = {"node_id": "n1", "capabilities": [cap("board")]}

        assert node.post("/v1/nodes", json=advert).status_code == 200
        assert "may not act for node n2" in forbidden(
            node.post("/v1/nodes", json={**advert, "node_id": "n2"})
        )
        assert "lacks the role" in forbidden(node.post("/v1/runs/dry-run", json={}))
        run = {"run_id": "r1", "requires": [{"as": "dut", "capability": "board"}],
               "steps": [{"id": "s", "uses": "dut", "run": ["true"]}]}  # fmt: skip
        assert submitter.post("/v1/runs", json=run).status_code == 201
        assert submitter.get("/v1/runs/r1").get_json()["state"] == "RUNNING"
        # No legacy token is configured: the old shared secret is just an unknown token.
        assert token_client(app, TOKEN).get("/v1/runs").status_code == 401
        assert token_client(app, None).get("/v1/runs").status_code == 401


def test_the_printed_json_entry_configures_mediator_tokens(db_url, tmp_path):
    secret, _, entry = token_new("--name", "watcher", "--role", "reader")
    env = {
        "MEDIATOR_DATABASE_URL": db_url,
        "MEDIATOR_RECORDS_ROOT": str(tmp_path / "r"),
        "MEDIATOR_TOKENS": json.dumps([entry]),
        "MEDIATOR_LOG_LEVEL": "error",
    }
    app = create_app(load_config(env=env))
    try:
        assert token_client(app, secret).get("/v1/runs").status_code == 200
        assert "lacks the role" in forbidden(token_client(app, secret).post("/v1/runs", json={}))
    finally:
        app.extensions["mediator"].close()


def test_gunicorn_configured_by_mediator_tokens_alone_serves_its_tokens(fresh_db_url, tmp_path):
    secret, _, entry = token_new("--name", "ops", "--role", "operator")
    env = {
        "MEDIATOR_TOKEN": "",
        "MEDIATOR_TOKENS": json.dumps([entry]),
        "MEDIATOR_LOG_LEVEL": "info",
    }
    with gunicorn_on(fresh_db_url, tmp_path, **env) as server:
        auth = {"Authorization": f"Bearer {secret}"}
        for _ in range(4):  # whichever worker accepts the connection
            resp = requests.get(server.url + "/v1/runs", headers=auth, timeout=30)
            assert resp.status_code == 200, resp.text
        legacy = requests.get(server.url + "/v1/runs", headers=server.headers(), timeout=30)
        assert legacy.status_code == 401
    logged = (tmp_path / "gunicorn.log").read_text()
    assert logged.count('"request"') >= 5, logged[-2000:]  # every request's line is there
    assert secret not in logged and TOKEN not in logged
