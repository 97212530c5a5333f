"""What a presented secret costs (unknown secrets: one SHA-256, never an argon2 verification), token
ids and ``med_<id>_<random>`` secrets, legacy argon2 entries behind ``tokens.legacy_argon2``,
the bound on slow verifications, the refusal memory, ``expires``, ``mediator token upgrade``, and
the refusal of the sample's placeholder and of short legacy tokens."""

from __future__ import annotations

import json
import secrets
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import argon2
import pytest
import requests
import structlog
import yaml
from click.testing import CliRunner

from app.commands.main import main
from app.config import load_config
from app.errors import ConfigError
from app.tokens import (
    REFUSAL_SECONDS,
    SlowVerificationBusy,
    TokenSet,
    new_token,
    parse_tokens,
)
from tests.support.apps import TOKEN, app_on, gunicorn_on
from tests.support.tokens import sha256_entry, token_client

ROLES = ("submitter", "node", "answerer", "reader", "operator")


def eight_argon2_tokens() -> list[tuple[str, dict[str, Any]]]:
    """Eight tokens as ``mediator token new`` makes them: (secret, entry with an id)."""
    made = [new_token(f"t{i}", [ROLES[i % len(ROLES)]]) for i in range(8)]
    return [(m.secret, m.entry) for m in made]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------ the secret's cost


def test_forty_concurrent_unknown_secrets_beside_eight_argon2_tokens_cost_no_slow_verification():
    made = eight_argon2_tokens()
    # A slot for a slow verification is waited for as long as a busy machine may need.
    tokens = TokenSet(parse_tokens("tokens", [e for _, e in made]), slow_wait_seconds=120)
    unknown = (
        [secrets.token_urlsafe(32) for _ in range(20)]
        + [f"med_{e['id']}_{secrets.token_urlsafe(32)}" for _, e in made for _ in range(2)]
        + [f"med_aaaaaaaaaaaaaaaa_{secrets.token_urlsafe(8)}" for _ in range(4)]
    )
    assert len(set(unknown)) == 40

    with ThreadPoolExecutor(8) as pool:
        found = list(pool.map(tokens.verify, unknown))

    assert found == [None] * 40
    # Twenty random secrets: no id, no sha256 entry, no legacy argon2 entry -> no argon2 at all.
    # Twenty med_ secrets with a known id but a wrong random part: one verification each
    # against their own entry only; none is ever tried against another entry.
    assert tokens.counts.slow_verifications == 16
    assert tokens.counts.refused + tokens.counts.refused_from_memory == 40


def test_random_secrets_never_reach_argon2(monkeypatch):
    made = eight_argon2_tokens()
    tokens = TokenSet(parse_tokens("tokens", [entry for _, entry in made]))
    for _ in range(40):
        assert tokens.verify(secrets.token_urlsafe(32)) is None
    assert tokens.counts.slow_verifications == 0
    assert tokens.counts.refused == 40


def test_a_med_secret_is_verified_against_its_own_entry_only_once():
    made = eight_argon2_tokens()
    tokens = TokenSet(parse_tokens("tokens", [entry for _, entry in made]))
    secret, entry = made[5]
    assert secret.startswith(f"med_{entry['id']}_")
    assert tokens.verify(secret).name == "t5"
    assert tokens.verify(secret).name == "t5"  # from the process's memory
    assert tokens.counts.slow_verifications == 1


def test_a_legacy_argon2_entry_without_an_id_still_works_while_legacy_argon2_is_on():
    secret = "an-old-argon2-secret"
    entry = {"name": "old", "argon2": argon2.PasswordHasher().hash(secret), "roles": ["reader"]}
    on = TokenSet(parse_tokens("tokens", [entry]))
    assert on.verify(secret).name == "old"
    assert on.legacy_argon2_tokens[0].name == "old"

    off = TokenSet(parse_tokens("tokens", [entry]), legacy_argon2=False)
    assert off.verify(secret) is None
    assert off.counts.slow_verifications == 0


def test_an_unknown_secret_tries_each_legacy_argon2_entry_but_no_entry_with_an_id():
    made = eight_argon2_tokens()
    old = {"name": "old", "argon2": argon2.PasswordHasher().hash("x" * 40), "roles": ["reader"]}
    tokens = TokenSet(parse_tokens("tokens", [old] + [e for _, e in made]))
    assert tokens.verify("not-a-secret-of-anyone") is None
    assert tokens.counts.slow_verifications == 1  # the legacy entry alone


def test_a_refused_secret_is_answered_from_memory_for_a_minute():
    clock = Clock()
    made = eight_argon2_tokens()
    tokens = TokenSet(parse_tokens("tokens", [e for _, e in made]), clock=clock)
    wrong = f"med_{made[0][1]['id']}_wrong"
    assert tokens.verify(wrong) is None
    assert tokens.verify(wrong) is None
    assert (tokens.counts.slow_verifications, tokens.counts.refused_from_memory) == (1, 1)
    clock.now += REFUSAL_SECONDS + 1
    assert tokens.verify(wrong) is None
    assert (tokens.counts.slow_verifications, tokens.counts.refused) == (2, 2)


def test_slow_verifications_wait_for_a_slot_and_give_up_with_busy():
    made = eight_argon2_tokens()
    tokens = TokenSet(
        parse_tokens("tokens", [e for _, e in made]), slow_concurrency=1, slow_wait_seconds=0.01
    )
    tokens._slots.acquire()  # another request's verification holds the only slot
    try:
        with pytest.raises(SlowVerificationBusy):
            tokens.verify(made[0][0])
    finally:
        tokens._slots.release()
    assert tokens.counts.busy == 1
    assert tokens.verify(made[0][0]).name == "t0"


def test_the_server_answers_503_when_no_slot_for_a_slow_verification_comes_free(db_url, tmp_path):
    (secret, entry), *_ = eight_argon2_tokens()
    with app_on(db_url, tmp_path / "r", tokens=[entry], **{"database.pool_timeout": 0.05}) as app:
        slots = app.extensions["mediator"].tokens._slots
        for _ in range(2):  # auth.slow_concurrency: 2 by default
            slots.acquire()
        try:
            resp = token_client(app, secret).get("/v1/runs")
        finally:
            for _ in range(2):
                slots.release()
        assert resp.status_code == 503
        assert resp.get_json()["error"]["reason"] == (
            "too many token verifications at once; try again"
        )
        assert token_client(app, secret).get("/v1/runs").status_code == 200


def test_forty_concurrent_random_secrets_at_gunicorn_are_401_with_no_slow_verification(
    fresh_db_url, tmp_path
):
    made = eight_argon2_tokens()
    env = {
        "MEDIATOR_TOKENS": json.dumps([e for _, e in made]),
        "MEDIATOR_WORKERS": "4",
    }
    with gunicorn_on(fresh_db_url, tmp_path, **env) as server:

        def present(_: int) -> int:
            headers = {"Authorization": f"Bearer {secrets.token_urlsafe(32)}"}
            return requests.get(f"{server.url}/v1/runs", headers=headers, timeout=60).status_code

        with ThreadPoolExecutor(40) as pool:
            statuses = list(pool.map(present, range(40)))
        assert statuses == [401] * 40
        metrics = requests.get(f"{server.url}/metrics", timeout=30).text
        assert auth_count(metrics, "slow_verifications") == 0
        assert auth_count(metrics, "refused") == 40
        # And the tokens themselves still work.
        ok = requests.get(
            f"{server.url}/v1/runs", headers={"Authorization": f"Bearer {made[3][0]}"}, timeout=30
        )
        assert ok.status_code == 200


def auth_count(metrics: str, outcome: str) -> float:
    prefix = f'mediator_auth_total{{outcome="{outcome}"}} '
    (line,) = [ln for ln in metrics.splitlines() if ln.startswith(prefix)]
    return float(line.removeprefix(prefix))


# ------------------------------------------------------------------ entries: id and expires


def test_two_entries_with_one_id_stop_the_start_up():
    a = sha256_entry("a", "secret-a", "reader", id="abcdefgh23456777")
    b = sha256_entry("b", "secret-b", "reader", id="abcdefgh23456777")
    with pytest.raises(ConfigError) as err:
        parse_tokens("tokens", [a, b])
    assert str(err.value) == "tokens[1].id: 'abcdefgh23456777' is the id of an earlier token"


@pytest.mark.parametrize("bad", ["short", "has_underscore1", "ABCDEFGH0000", 12345678, ""])
def test_an_id_must_be_base32(bad):
    with pytest.raises(ConfigError) as err:
        parse_tokens("tokens", [sha256_entry("a", "s", "reader", id=bad)])
    assert str(err.value).startswith("tokens[0].id: must be 8-64 characters of base32")


def test_an_expired_token_is_refused_and_one_not_yet_expired_is_taken(db_url, tmp_path):
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat().replace("+00:00", "Z")
    entries = [
        sha256_entry("gone", "secret-gone", "reader", expires=past),
        sha256_entry("kept", "secret-kept", "reader", expires=future),
    ]
    with app_on(db_url, tmp_path / "r", tokens=entries) as app:
        assert token_client(app, "secret-gone").get("/v1/runs").status_code == 401
        assert token_client(app, "secret-kept").get("/v1/runs").status_code == 200


def test_an_expiry_without_an_offset_stops_the_start_up():
    with pytest.raises(ConfigError) as err:
        parse_tokens("tokens", [sha256_entry("a", "s", "reader", expires="2027-01-01T00:00:00")])
    assert str(err.value) == "tokens[0].expires: must be an RFC 3339 time with its offset"


# ------------------------------------------------------------------ mediator token upgrade


def test_token_upgrade_reissues_a_legacy_entry_with_an_id_and_the_same_grants(tmp_path):
    old = {
        "name": "bench-3",
        "argon2": argon2.PasswordHasher().hash("the-old-secret"),
        "roles": ["node"],
        "nodes": ["bench-3"],
        "max_priority": 5,
    }
    config = tmp_path / "mediator.yaml"
    config.write_text(yaml.safe_dump({"tokens": [old]}))
    result = CliRunner().invoke(
        main, ["--config", str(config), "token", "upgrade", "--name", "bench-3"], env={}
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    secret = lines[1]
    entry = json.loads(lines[-1])
    assert secret.startswith(f"med_{entry['id']}_")
    assert {k: v for k, v in entry.items() if k not in {"id", "argon2"}} == {
        "name": "bench-3",
        "roles": ["node"],
        "nodes": ["bench-3"],
        "max_priority": 5,
    }
    (token,) = parse_tokens("tokens", [entry])
    tokens = TokenSet([token])
    assert tokens.verify(secret).name == "bench-3"
    assert tokens.verify("the-old-secret") is None


def test_token_upgrade_of_an_unknown_name_is_a_usage_error(tmp_path):
    config = tmp_path / "mediator.yaml"
    config.write_text(yaml.safe_dump({"tokens": [sha256_entry("ci", "s", "submitter")]}))
    result = CliRunner().invoke(
        main, ["--config", str(config), "token", "upgrade", "--name", "nope"], env={}
    )
    assert result.exit_code == 2
    assert "no configured token is named 'nope' (configured: ci)" in result.output


# ------------------------------------------------------------------ the legacy token


def test_the_samples_placeholder_token_is_always_refused(tmp_path: Path):
    # The legacy token of the environment file of earlier samples: an install made from them may
    # still hold it (today's samples hold no token at all).
    placeholder = "change-me-to-a-long-random-secret"
    for allow in (False, True):
        with pytest.raises(ConfigError) as err:
            load_config(env={}, overrides={"token": placeholder, "token_allow_short": allow})
        assert str(err.value) == "token: the sample's placeholder; set a long random secret"


def test_a_short_legacy_token_needs_token_allow_short():
    with pytest.raises(ConfigError) as err:
        load_config(env={}, overrides={"token": "short-secret"})
    assert str(err.value) == (
        "token: shorter than 32 characters (set token_allow_short: true to allow)"
    )
    cfg = load_config(env={}, overrides={"token": "short-secret", "token_allow_short": True})
    assert cfg["token"] == "short-secret"


# ------------------------------------------------------------------ failed authentications


def from_address(client: Any, address: str) -> Any:
    client.environ_base["REMOTE_ADDR"] = address
    return client


def test_an_address_is_answered_429_after_30_failed_authentications_in_a_minute(app, sql):
    bad = from_address(token_client(app, "not-a-token"), "192.0.2.7")
    assert [bad.get("/v1/runs").status_code for _ in range(30)] == [401] * 30
    resp = bad.get("/v1/runs")
    assert resp.status_code == 429
    assert resp.headers["Retry-After"] == "60"
    assert resp.get_json()["error"]["reason"] == (
        "too many failed authentications from this address; try again in a minute"
    )
    assert from_address(app.test_client(), "192.0.2.7").get("/v1/runs").status_code == 429
    # Another address is not held up, nor a token this process has verified before.
    assert from_address(token_client(app, "wrong"), "192.0.2.8").get("/v1/runs").status_code == 401
    assert sql.execute("select address, failures from auth_failures order by 1").fetchall() == [
        ("192.0.2.7", 30),
        ("192.0.2.8", 1),
    ]


def test_a_token_this_process_verified_still_passes_from_a_blocked_address(app):
    good = from_address(app.test_client(), "192.0.2.9")
    good.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {TOKEN}"
    assert good.get("/v1/runs").status_code == 200
    bad = from_address(token_client(app, "not-a-token"), "192.0.2.9")
    for _ in range(31):
        bad.get("/v1/runs")
    assert bad.get("/v1/runs").status_code == 429
    assert good.get("/v1/runs").status_code == 200  # an agent behind the same NAT


def test_failures_are_counted_across_processes(db_url, tmp_path):
    with (
        app_on(db_url, tmp_path / "a") as first,
        app_on(db_url, tmp_path / "b") as second,
    ):
        a = from_address(token_client(first, "nope"), "198.51.100.3")
        b = from_address(token_client(second, "nope"), "198.51.100.3")
        assert [a.get("/v1/runs").status_code for _ in range(15)] == [401] * 15
        assert [b.get("/v1/runs").status_code for _ in range(15)] == [401] * 15
        assert a.get("/v1/runs").status_code == 429  # its own count is 16: the shared one 31


def test_loopback_addresses_are_not_limited_unless_configured(db_url, tmp_path):
    with app_on(db_url, tmp_path / "a") as application:
        local = token_client(application, "nope")  # the test client's address: 127.0.0.1
        assert {local.get("/v1/runs").status_code for _ in range(40)} == {401}
    with app_on(db_url, tmp_path / "b", **{"auth.limit_loopback": True}) as application:
        local = token_client(application, "nope")
        statuses = [local.get("/v1/runs").status_code for _ in range(31)]
        assert statuses[-1] == 429


def test_behind_a_trusted_proxy_the_forwarded_address_is_counted(db_url, tmp_path, sql):
    with app_on(db_url, tmp_path / "a", **{"http.trusted_proxies": 1}) as application:
        c = token_client(application, "nope")
        c.environ_base["HTTP_X_FORWARDED_FOR"] = "203.0.113.5"
        assert c.get("/v1/runs").status_code == 401
    assert sql.execute("select address from auth_failures").fetchall() == [("203.0.113.5",)]


PROXY_WARNING = "a request came through a proxy (X-Forwarded-For) but http.trusted_proxies is 0"


def proxy_warnings(db_url: str, records: Path, trusted: int) -> list[dict[str, Any]]:
    """The proxy warnings of an app with ``http.trusted_proxies`` at ``trusted`` that gets a
    request straight from its client, then four through a proxy on this host (three refused)."""
    keys = {"log.level": "warning", "http.trusted_proxies": trusted}
    with app_on(db_url, records, **keys) as application:
        proxied = token_client(application, "nope")
        proxied.environ_base["HTTP_X_FORWARDED_FOR"] = "203.0.113.5"
        with structlog.testing.capture_logs() as logs:
            assert application.test_client().get("/healthz").status_code == 200
            assert [proxied.get("/v1/runs").status_code for _ in range(3)] == [401] * 3
            assert proxied.get("/healthz").status_code == 200
    return [e for e in logs if e["event"].startswith(PROXY_WARNING)]


def test_a_forwarded_request_is_warned_of_once_when_no_proxy_is_trusted_and_never_when_one_is(
    db_url, tmp_path
):
    """Behind a proxy with http.trusted_proxies at 0 every client is the proxy's address (on the
    same host: loopback, never limited), so the 429 never comes: one line says what to set."""
    warned = proxy_warnings(db_url, tmp_path / "a", trusted=0)
    assert len(warned) == 1, warned
    assert warned[0]["log_level"] == "warning"
    assert warned[0]["proxy"] == "127.0.0.1"
    assert "set http.trusted_proxies to the number of proxies in front" in warned[0]["event"]
    assert proxy_warnings(db_url, tmp_path / "b", trusted=1) == []
