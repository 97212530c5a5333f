"""Configuration (docs/configuration.md#keys): defaults, a YAML or TOML file, ``MEDIATOR_*``
variables that win over the file, the environment alone as a complete configuration, database URL
forms, and invalid values that stop the process with one line naming the key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from app import create_app
from app.config import load_config, to_libpq_url
from app.db import CONNECT_DEFAULTS, conninfo
from app.errors import ConfigError
from tests.support.apps import TOKEN, clean_env, mediator_cli
from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024

# The keys and defaults of docs/configuration.md#keys.
DOC_DEFAULTS: dict[str, Any] = {
    "database.url": None,
    "database.pool_size": 5,
    "database.pool_timeout": 5,
    "max_blob_bytes": 10 * MIB,
    "max_body_bytes": 1 * MIB,
    "claim.long_poll_seconds": 30,
    "claim.recheck_seconds": 5,
    "lease.ttl_seconds": 3600,
    "lease.renew_seconds": 60,
    "lease.not_after_factor": 3,
    "lease.max_per_run": 0,
    "notify.asks_url": None,
    "notify.runs_url": None,
    "token": None,
    "metrics.require_token": False,
    "ui.require_token": False,
}

# Every key of docs/configuration.md#keys has its variable: MEDIATOR_ + the key upper-cased, dots as
# underscores.
ENV_VALUES: list[tuple[str, str, str, Any]] = [
    (
        "MEDIATOR_DATABASE_URL",
        "database.url",
        "postgresql://u@db.example:5432/m",
        "postgresql://u@db.example:5432/m",
    ),
    ("MEDIATOR_DATABASE_POOL_SIZE", "database.pool_size", "7", 7),
    ("MEDIATOR_DATABASE_POOL_TIMEOUT", "database.pool_timeout", "2.5", 2.5),
    ("MEDIATOR_RECORDS_ROOT", "records.root", "/srv/records", "/srv/records"),
    ("MEDIATOR_MAX_BLOB_BYTES", "max_blob_bytes", "2048", 2048),
    ("MEDIATOR_MAX_BODY_BYTES", "max_body_bytes", "4096", 4096),
    ("MEDIATOR_CLAIM_LONG_POLL_SECONDS", "claim.long_poll_seconds", "12", 12),
    ("MEDIATOR_CLAIM_RECHECK_SECONDS", "claim.recheck_seconds", "3", 3),
    ("MEDIATOR_LEASE_TTL_SECONDS", "lease.ttl_seconds", "600", 600),
    ("MEDIATOR_LEASE_RENEW_SECONDS", "lease.renew_seconds", "20", 20),
    ("MEDIATOR_LEASE_NOT_AFTER_FACTOR", "lease.not_after_factor", "4", 4),
    ("MEDIATOR_LEASE_MAX_PER_RUN", "lease.max_per_run", "2", 2),
    (
        "MEDIATOR_NOTIFY_ASKS_URL",
        "notify.asks_url",
        "http://hooks.example/asks",
        "http://hooks.example/asks",
    ),
    (
        "MEDIATOR_NOTIFY_RUNS_URL",
        "notify.runs_url",
        "http://hooks.example/runs",
        "http://hooks.example/runs",
    ),
    (
        "MEDIATOR_TOKEN",
        "token",
        "s3cret-of-at-least-32-characters",
        "s3cret-of-at-least-32-characters",
    ),
    ("MEDIATOR_TOKENS_LEGACY_ARGON2", "tokens.legacy_argon2", "false", False),
    ("MEDIATOR_TOKEN_ALLOW_SHORT", "token_allow_short", "true", True),
    ("MEDIATOR_AUTH_SLOW_CONCURRENCY", "auth.slow_concurrency", "4", 4),
    ("MEDIATOR_AUTH_MAX_FAILURES_PER_MINUTE", "auth.max_failures_per_minute", "0", 0),
    ("MEDIATOR_AUTH_LIMIT_LOOPBACK", "auth.limit_loopback", "true", True),
    ("MEDIATOR_HTTP_TRUSTED_PROXIES", "http.trusted_proxies", "1", 1),
    ("MEDIATOR_METRICS_REQUIRE_TOKEN", "metrics.require_token", "true", True),
    ("MEDIATOR_UI_REQUIRE_TOKEN", "ui.require_token", "true", True),
]

# (key, its variable, an invalid value)
INVALID: list[tuple[str, str, str]] = [
    ("lease.ttl_seconds", "MEDIATOR_LEASE_TTL_SECONDS", "0"),
    ("lease.ttl_seconds", "MEDIATOR_LEASE_TTL_SECONDS", "-1"),
    ("lease.ttl_seconds", "MEDIATOR_LEASE_TTL_SECONDS", "an hour"),
    ("lease.ttl_seconds", "MEDIATOR_LEASE_TTL_SECONDS", "1.5"),
    ("lease.renew_seconds", "MEDIATOR_LEASE_RENEW_SECONDS", "-5"),
    ("lease.renew_seconds", "MEDIATOR_LEASE_RENEW_SECONDS", "0"),
    ("lease.not_after_factor", "MEDIATOR_LEASE_NOT_AFTER_FACTOR", "0"),
    ("lease.max_per_run", "MEDIATOR_LEASE_MAX_PER_RUN", "-1"),
    ("max_body_bytes", "MEDIATOR_MAX_BODY_BYTES", "0"),
    ("max_blob_bytes", "MEDIATOR_MAX_BLOB_BYTES", "big"),
    ("database.pool_size", "MEDIATOR_DATABASE_POOL_SIZE", "0"),
    ("database.pool_timeout", "MEDIATOR_DATABASE_POOL_TIMEOUT", "soon"),
    ("claim.long_poll_seconds", "MEDIATOR_CLAIM_LONG_POLL_SECONDS", "-1"),
    ("claim.recheck_seconds", "MEDIATOR_CLAIM_RECHECK_SECONDS", "0"),
    ("claim.long_poll_jitter", "MEDIATOR_CLAIM_LONG_POLL_JITTER", "1"),
    ("claim.long_poll_jitter", "MEDIATOR_CLAIM_LONG_POLL_JITTER", "-0.1"),
    ("database.url", "MEDIATOR_DATABASE_URL", "mysql://u@h/db"),
    ("database.url", "MEDIATOR_DATABASE_URL", "sqlite:///mediator.db"),
    ("metrics.require_token", "MEDIATOR_METRICS_REQUIRE_TOKEN", "perhaps"),
]


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def yaml_file(tmp_path: Path) -> Path:
    return _write(
        tmp_path / "mediator.yaml",
        "database:\n"
        "  url: postgresql://file@db.example/m\n"
        "  pool_size: 3\n"
        "lease:\n"
        "  ttl_seconds: 900\n"
        "  renew_seconds: 30\n"
        "max_body_bytes: 65536\n"
        "contract:\n"
        "  capabilities: [board, agent.reason]\n"
        "notify:\n"
        "  asks_url: http://hooks.example/asks\n",
    )


@pytest.fixture
def toml_file(tmp_path: Path) -> Path:
    return _write(
        tmp_path / "mediator.toml",
        'max_blob_bytes = 2097152\ntoken = "from-the-file-a-secret-of-32-chars"\n\n'
        '[database]\nurl = "postgresql+psycopg://file@db.example/m"\n\n'
        "[lease]\nttl_seconds = 1200\nmax_per_run = 4\n\n"
        "[claim]\nlong_poll_seconds = 10\n",
    )


# ------------------------------------------------------------------ defaults, files, environment


def test_defaults_are_those_of_the_spec():
    cfg = load_config(env={})
    assert {k: cfg[k] for k in DOC_DEFAULTS} == DOC_DEFAULTS
    assert not cfg["contract.capabilities"]  # empty = any capability name
    assert not cfg["tokens"]
    assert cfg["records.root"]


def test_a_yaml_file_with_nested_sections_sets_the_dotted_keys(yaml_file):
    cfg = load_config(yaml_file, env={})
    assert cfg["database.url"] == "postgresql://file@db.example/m"
    assert cfg["database.pool_size"] == 3
    assert cfg["lease.ttl_seconds"] == 900
    assert cfg["lease.renew_seconds"] == 30
    assert cfg["max_body_bytes"] == 65536
    assert list(cfg["contract.capabilities"]) == ["board", "agent.reason"]
    assert cfg["notify.asks_url"] == "http://hooks.example/asks"
    # what the file does not name keeps its default
    assert cfg["lease.not_after_factor"] == 3
    assert cfg["max_blob_bytes"] == 10 * MIB


def test_a_toml_file_with_tables_sets_the_dotted_keys(toml_file):
    cfg = load_config(toml_file, env={})
    assert cfg["database.url"] == "postgresql+psycopg://file@db.example/m"
    assert cfg["lease.ttl_seconds"] == 1200
    assert cfg["lease.max_per_run"] == 4
    assert cfg["claim.long_poll_seconds"] == 10
    assert cfg["max_blob_bytes"] == 2 * MIB
    assert cfg["token"] == "from-the-file-a-secret-of-32-chars"
    assert cfg["lease.renew_seconds"] == 60


def test_mediator_config_names_the_file_when_no_path_is_given(yaml_file):
    cfg = load_config(env={"MEDIATOR_CONFIG": str(yaml_file)})
    assert cfg["lease.ttl_seconds"] == 900


def test_an_environment_variable_wins_over_the_yaml_file(yaml_file):
    cfg = load_config(
        yaml_file,
        env={
            "MEDIATOR_LEASE_TTL_SECONDS": "120",
            "MEDIATOR_DATABASE_URL": "postgresql://env@db.example/m",
            "MEDIATOR_CONTRACT_CAPABILITIES": "board",
        },
    )
    assert cfg["lease.ttl_seconds"] == 120
    assert cfg["database.url"] == "postgresql://env@db.example/m"
    assert list(cfg["contract.capabilities"]) == ["board"]
    assert cfg["lease.renew_seconds"] == 30  # from the file, no variable set


def test_an_environment_variable_wins_over_the_toml_file(toml_file):
    cfg = load_config(
        toml_file,
        env={
            "MEDIATOR_TOKEN": "from-env-a-secret-of-32-characters",
            "MEDIATOR_LEASE_MAX_PER_RUN": "1",
        },
    )
    assert cfg["token"] == "from-env-a-secret-of-32-characters"
    assert cfg["lease.max_per_run"] == 1
    assert cfg["lease.ttl_seconds"] == 1200


@pytest.mark.parametrize(
    ("var", "key", "text", "value"), ENV_VALUES, ids=[v[0] for v in ENV_VALUES]
)
def test_every_key_has_its_mediator_variable(var, key, text, value):
    assert var == "MEDIATOR_" + key.upper().replace(".", "_")
    cfg = load_config(env={var: text})
    assert cfg[key] == value


def test_contract_capabilities_from_the_environment_is_a_list():
    cfg = load_config(env={"MEDIATOR_CONTRACT_CAPABILITIES": "board,agent.reason"})
    assert list(cfg["contract.capabilities"]) == ["board", "agent.reason"]


def test_database_url_is_accepted_for_the_database_url_key():
    cfg = load_config(env={"DATABASE_URL": "postgresql://ops@db.example/m"})
    assert cfg["database.url"] == "postgresql://ops@db.example/m"


def test_mediator_database_url_wins_over_database_url():
    cfg = load_config(
        env={
            "DATABASE_URL": "postgresql://generic@db.example/m",
            "MEDIATOR_DATABASE_URL": "postgresql://specific@db.example/m",
        }
    )
    assert cfg["database.url"] == "postgresql://specific@db.example/m"


def test_every_connection_adds_the_client_side_settings_unless_the_string_sets_them():
    info = conninfo_to_dict(
        conninfo("postgresql+psycopg://u:pw@db.example:5433/m?connect_timeout=9")
    )
    assert info["host"] == "db.example" and info["port"] == "5433" and info["dbname"] == "m"
    assert info["connect_timeout"] == "9"  # the string's own
    assert info["target_session_attrs"] == "primary"
    assert {k: info[k] for k in CONNECT_DEFAULTS if k != "connect_timeout"} == {
        k: v for k, v in CONNECT_DEFAULTS.items() if k != "connect_timeout"
    }


def test_libpqs_multi_host_url_and_keyword_forms_are_taken_as_given():
    url = "postgresql://ops@h1:5432,h2:5433/m?target_session_attrs=any"
    cfg = load_config(env={"MEDIATOR_DATABASE_URL": url})
    info = conninfo_to_dict(conninfo(cfg.database_url))
    assert (info["host"], info["port"], info["user"]) == ("h1,h2", "5432,5433", "ops")
    assert info["target_session_attrs"] == "any"
    words = "host=h1,h2 port=5432,5432 dbname=m user=ops"
    cfg = load_config(env={"MEDIATOR_DATABASE_URL": words})
    info = conninfo_to_dict(conninfo(cfg.database_url))
    assert (info["host"], info["port"], info["dbname"]) == ("h1,h2", "5432,5432", "m")
    assert info["target_session_attrs"] == "primary"


def test_a_database_string_libpq_cannot_read_names_the_key_and_not_the_string():
    with pytest.raises(ConfigError) as err:
        load_config(env={"MEDIATOR_DATABASE_URL": "host=h1 password=s3cr3t extra"})
    assert "database.url" in str(err.value)
    assert "s3cr3t" not in str(err.value) and "extra" not in str(err.value)


# ------------------------------------------------------------------ the environment alone serves


def _serving_env(db_url: str, records: Path, **extra: str) -> dict[str, str]:
    return {
        "MEDIATOR_DATABASE_URL": db_url,
        "MEDIATOR_RECORDS_ROOT": str(records),
        "MEDIATOR_TOKEN": TOKEN,
        "MEDIATOR_LOG_LEVEL": "error",
        **extra,
    }


def _serve(cfg):
    app = create_app(cfg)
    return app, app.test_client()


def test_environment_variables_alone_are_a_complete_configuration(db_url, tmp_path):
    app, client = _serve(load_config(env=_serving_env(db_url, tmp_path / "records")))
    try:
        assert client.get("/readyz").status_code == 200
        resp = client.post(
            "/v1/nodes",
            json={"node_id": "n1", "capabilities": [{"capability": "board"}]},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert resp.status_code == 200
        assert resp.get_json()["renew_seconds"] == 60
    finally:
        app.extensions["mediator"].close()


def test_a_value_from_the_environment_governs_the_running_app(db_url, tmp_path, sql):
    env = _serving_env(db_url, tmp_path / "records", MEDIATOR_LEASE_RENEW_SECONDS="17")
    app, client = _serve(load_config(env=env))
    try:
        resp = client.post(
            "/v1/nodes",
            json={"node_id": "n1", "capabilities": [{"capability": "board"}]},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert resp.get_json()["renew_seconds"] == 17
        # the advert lives renew x factor = 51 s (docs/queue.md#heartbeats-what-a-node-learns)
        (ttl,) = sql.execute(
            "SELECT extract(epoch FROM expires_at - seen_at) FROM nodes"
        ).fetchone()
        assert round(float(ttl)) == 51
    finally:
        app.extensions["mediator"].close()


@pytest.mark.parametrize("form", ["postgresql", "postgresql+psycopg"])
def test_both_url_forms_connect_with_psycopg_3(db_url, tmp_path, form):
    url = form + "://" + to_libpq_url(db_url).split("://", 1)[1]
    app, client = _serve(load_config(env=_serving_env(url, tmp_path / "records")))
    try:
        assert client.get("/readyz").status_code == 200
        engine = app.extensions["mediator"].db.engine
        assert engine.dialect.name == "postgresql"
        assert engine.dialect.driver == "psycopg"
    finally:
        app.extensions["mediator"].close()


# ------------------------------------------------------------------ invalid values


@pytest.mark.parametrize(("key", "var", "value"), INVALID, ids=[f"{v[1]}={v[2]}" for v in INVALID])
def test_an_invalid_value_from_the_environment_is_a_config_error_naming_the_key(key, var, value):
    with pytest.raises(ConfigError) as err:
        load_config(env={var: value})
    message = str(err.value)
    assert key in message
    assert "\n" not in message


def test_an_invalid_value_in_the_file_is_a_config_error_naming_the_key(tmp_path):
    path = _write(tmp_path / "m.yaml", "lease:\n  ttl_seconds: 0\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert "lease.ttl_seconds" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_non_integer_in_the_toml_file_is_a_config_error_naming_the_key(tmp_path):
    path = _write(tmp_path / "m.toml", '[lease]\nrenew_seconds = "often"\n')
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert "lease.renew_seconds" in str(err.value)


def test_a_boolean_is_not_an_integer(tmp_path):
    path = _write(tmp_path / "m.yaml", "lease:\n  ttl_seconds: true\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert "lease.ttl_seconds" in str(err.value)


def test_an_unknown_key_in_the_file_is_a_config_error_naming_it(tmp_path):
    path = _write(tmp_path / "m.yaml", "lease:\n  ttl_secs: 60\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert "lease.ttl_secs" in str(err.value)


def test_a_file_that_does_not_parse_is_one_line_naming_the_file(tmp_path):
    path = _write(tmp_path / "m.toml", "[lease\nttl_seconds = 1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_a_missing_file_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "absent.yaml", env={})
    assert "absent.yaml" in str(err.value)


def test_the_error_for_a_bad_database_url_does_not_show_its_password():
    with pytest.raises(ConfigError) as err:
        load_config(env={"MEDIATOR_DATABASE_URL": "mysql://ops:hunter2@db.example/m"})
    assert "database.url" in str(err.value)
    assert "hunter2" not in str(err.value)


def test_a_wrong_type_for_the_legacy_token_does_not_show_it(tmp_path):
    path = _write(tmp_path / "m.yaml", "token: [not-a-string-secret]\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert "token" in str(err.value)
    assert "not-a-string-secret" not in str(err.value)


# ------------------------------------------------------------------ the process stops with one line


def test_the_cli_stops_on_a_lease_ttl_of_0_with_one_line_naming_the_key(db_url):
    proc = mediator_cli(
        "db", "check", env=clean_env(MEDIATOR_DATABASE_URL=db_url, MEDIATOR_LEASE_TTL_SECONDS="0")
    )
    assert proc.returncode != 0
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert "lease.ttl_seconds" in lines[0]


def test_the_cli_stops_on_an_invalid_value_in_the_config_file_with_one_line_naming_the_key(
    db_url, tmp_path
):
    path = _write(tmp_path / "m.toml", "[lease]\nrenew_seconds = -5\n")
    proc = mediator_cli(
        "--config", str(path), "db", "check", env=clean_env(MEDIATOR_DATABASE_URL=db_url)
    )
    assert proc.returncode != 0
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert "lease.renew_seconds" in lines[0]


def test_gunicorn_stops_on_an_invalid_config_naming_the_key_without_a_traceback(db_url, tmp_path):
    port = free_port()
    env = clean_env(
        MEDIATOR_DATABASE_URL=db_url,
        MEDIATOR_RECORDS_ROOT=str(tmp_path / "records"),
        MEDIATOR_LEASE_TTL_SECONDS="0",
        MEDIATOR_BIND=f"127.0.0.1:{port}",
        MEDIATOR_WORKERS="1",
        MEDIATOR_THREADS="2",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "lease.ttl_seconds" in output
    assert "Traceback" not in output, output[-2000:]


@pytest.mark.parametrize(
    "args", [["serve", "--port", "0"], ["reaper", "--once"]], ids=["serve", "reaper"]
)
def test_a_process_without_a_database_url_stops_with_one_line_naming_the_key(args, tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MEDIATOR_") and k not in ("DATABASE_URL", "PGDATABASE")
    }
    env["MEDIATOR_TOKEN"] = TOKEN
    env["MEDIATOR_RECORDS_ROOT"] = str(tmp_path / "records")
    env["PYTHONPATH"] = str(ROOT)

    done = subprocess.run(
        [sys.executable, "-m", "app.commands", *args],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "database.url" in lines[0]
