"""Tokens of every role for the tests of authorisation, and clients that present them."""

from __future__ import annotations

import hashlib
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from tests.support.apps import TOKEN


def sha256_entry(name: str, secret: str, *roles: str, **extra: Any) -> dict[str, Any]:
    """A ``tokens`` entry whose secret is kept as its SHA-256."""
    return {
        "name": name,
        "sha256": hashlib.sha256(secret.encode()).hexdigest(),
        "roles": list(roles),
        **extra,
    }


# name -> (secret, entry)
TOKENS: dict[str, tuple[str, dict[str, Any]]] = {
    "submitter": ("s3cret-submitter", sha256_entry("sub", "s3cret-submitter", "submitter")),
    "submitter-b": ("s3cret-submitter-b", sha256_entry("sub-b", "s3cret-submitter-b", "submitter")),
    "node": ("s3cret-node", sha256_entry("node-any", "s3cret-node", "node")),
    "node-n1": ("s3cret-node-n1", sha256_entry("node-n1", "s3cret-node-n1", "node", nodes=["n1"])),
    "node-n2": ("s3cret-node-n2", sha256_entry("node-n2", "s3cret-node-n2", "node", nodes=["n2"])),
    "answerer": ("s3cret-answerer", sha256_entry("ans", "s3cret-answerer", "answerer")),
    "reader": ("s3cret-reader", sha256_entry("reader", "s3cret-reader", "reader")),
    "operator": ("s3cret-operator", sha256_entry("op", "s3cret-operator", "operator")),
    "alice": (
        "s3cret-alice",
        sha256_entry(
            "alice", "s3cret-alice", "submitter", "answerer", principal="alice@example.com"
        ),
    ),
}
SECRETS = {name: secret for name, (secret, _) in TOKENS.items()} | {"legacy": TOKEN}
ENTRIES = [entry for _, entry in TOKENS.values()]


def token_client(app: Flask, secret: str | None, principal: str | None = None) -> FlaskClient:
    """A test client of ``app`` that presents ``secret`` (none: no Authorization header)."""
    c = app.test_client()
    if secret is not None:
        c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {secret}"
    if principal is not None:
        c.environ_base["HTTP_X_ENODE_PRINCIPAL"] = principal
    return c


def as_role(app: Flask, name: str, principal: str | None = None) -> FlaskClient:
    return token_client(app, SECRETS[name], principal)


def forbidden(resp: Any) -> str:
    """The reason of a 403 in the one error shape."""
    assert resp.status_code == 403, (resp.status_code, resp.get_data(as_text=True)[:300])
    body = resp.get_json()
    assert set(body) == {"error"} and body["error"]["code"] == 403, body
    return body["error"]["reason"]
