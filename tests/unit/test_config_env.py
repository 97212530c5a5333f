"""Unknown ``MEDIATOR_*`` variables (docs/configuration.md#keys): a variable that no configuration
key and nothing else of the Mediator reads is a warning at start-up naming it (and the closest known
variable), so a typo such as ``MEDIATOR_LEASE_TTL=0`` does not go unnoticed; it never stops the
process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog

from app.config import KEYS, OTHER_VARIABLES, load_config, unknown_variables
from app.logs import configure_logging

ROOT = Path(__file__).resolve().parents[2]
WARNING = "unknown environment variable, ignored"


@pytest.fixture(autouse=True)
def warnings_are_logged() -> None:
    configure_logging("console", "info")  # an app of an earlier test may have set "error"


def warnings(env: dict[str, str]) -> list[dict[str, Any]]:
    with structlog.testing.capture_logs() as logs:
        load_config(env=env)
    return [e for e in logs if e["event"] == WARNING]


def test_a_mistyped_variable_is_named_in_a_warning_with_the_variable_it_resembles():
    found = warnings({"MEDIATOR_LEASE_TTL": "0"})

    assert found == [
        {
            "event": WARNING,
            "log_level": "warning",
            "variable": "MEDIATOR_LEASE_TTL",
            "did_you_mean": "MEDIATOR_LEASE_TTL_SECONDS",
        }
    ]


def test_each_unknown_variable_has_its_own_warning_in_name_order():
    env = {"MEDIATOR_ZZZ": "1", "MEDIATOR_RECORD_ROOT": "/srv", "MEDIATOR_LEASE_TTL_SECONDS": "9"}

    found = warnings(env)

    assert [e["variable"] for e in found] == ["MEDIATOR_RECORD_ROOT", "MEDIATOR_ZZZ"]
    assert found[0]["did_you_mean"] == "MEDIATOR_RECORDS_ROOT"


def test_an_unknown_variable_changes_no_value_and_stops_nothing():
    cfg = load_config(env={"MEDIATOR_LEASE_TTL": "0"})

    assert cfg["lease.ttl_seconds"] == 3600


@pytest.mark.parametrize(
    "name", sorted({key.env for key in KEYS} | OTHER_VARIABLES | {"DATABASE_URL"})
)
def test_a_variable_the_mediator_reads_is_not_warned_about(name, tmp_path):
    value = {
        "MEDIATOR_CONFIG": str(tmp_path / "absent-but-named.yaml"),
        "MEDIATOR_DATABASE_URL": "postgresql://db.example/m",
        "DATABASE_URL": "postgresql://db.example/m",
        "MEDIATOR_TOKENS": "[]",
        "MEDIATOR_TEAMS": "[]",
        "MEDIATOR_LOG_FORMAT": "console",
        "MEDIATOR_LOG_LEVEL": "info",
        "MEDIATOR_METRICS_REQUIRE_TOKEN": "false",
        "MEDIATOR_UI_REQUIRE_TOKEN": "false",
        "MEDIATOR_UI_INSECURE_COOKIE": "false",
        "MEDIATOR_CONTRACT_CAPABILITIES": "board",
        "MEDIATOR_RECORDS_BACKEND": "filesystem",
        "MEDIATOR_TOKEN": "a-legacy-token-of-32-characters-or-more",
        "MEDIATOR_TOKENS_LEGACY_ARGON2": "true",
        "MEDIATOR_TOKEN_ALLOW_SHORT": "false",
        "MEDIATOR_AUTH_LIMIT_LOOPBACK": "false",
        "MEDIATOR_CLAIM_LONG_POLL_JITTER": "0.5",
    }.get(name, "7")
    if name == "MEDIATOR_CONFIG":
        (tmp_path / "absent-but-named.yaml").write_text("{}\n")

    assert unknown_variables({name: value}) == []
    assert warnings({name: value}) == []


def test_variables_of_other_programs_are_not_the_mediators_business():
    env = {"GUNICORN_CMD_ARGS": "--workers 2", "PGPASSWORD": "x", "MEDIATORX": "1"}

    assert unknown_variables(env) == []
    assert warnings(env) == []


def _sources() -> list[Path]:
    """The Mediator's own code and scripts, and the test suite's set-up."""
    paths = [*sorted((ROOT / "app").rglob("*.py")), ROOT / "gunicorn.conf.py", ROOT / "wsgi.py"]
    paths += [p for p in sorted((ROOT / "scripts").glob("*")) if p.is_file()]
    paths += [
        ROOT / ".ci" / "run",
        ROOT / "tests" / "conftest.py",
        ROOT / "tests" / "support" / "apps.py",
    ]
    return [p for p in paths if p.is_file()]


def test_every_mediator_variable_the_code_names_is_a_key_or_read_elsewhere():
    named = {
        name
        for path in _sources()
        for name in re.findall(r"MEDIATOR_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="replace"))
    }

    assert len(named) > 5
    assert unknown_variables(dict.fromkeys(named, "1")) == []


def test_a_process_warns_at_start_up_in_its_log_format_and_goes_on(db_url):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIATOR_")}
    env.pop("DATABASE_URL", None)
    env.update({"MEDIATOR_DATABASE_URL": db_url, "MEDIATOR_LEASE_TTL": "0"})

    proc = subprocess.run(
        [sys.executable, "-m", "app.commands.main", "db", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    assert [(e["event"], e["variable"], e["level"]) for e in lines] == [
        (WARNING, "MEDIATOR_LEASE_TTL", "warning")
    ]
    assert lines[0]["did_you_mean"] == "MEDIATOR_LEASE_TTL_SECONDS"


def test_the_clients_and_the_agents_own_variables_never_become_the_servers_legacy_token():
    """A shell set up for the client (or a node's agent) can start a server: only the shared
    MEDIATOR_TOKEN would be taken as its all-roles token, never the client's or the agent's."""
    env = {
        "MEDIATOR_CLIENT_URL": "http://mediator.lab:8080",
        "MEDIATOR_CLIENT_TOKEN": "a-submitters-token-of-forty-characters-0",
        "MEDIATOR_CLIENT_PRINCIPAL": "me@lab.test",
        "MEDIATOR_CLIENT_PROFILE": "lab",
        "MEDIATOR_CLIENT_CONFIG": "/etc/mediator/client.toml",
        "MEDIATOR_AGENT_URL": "http://mediator.lab:8080",
        "MEDIATOR_AGENT_TOKEN": "a-nodes-token-of-forty-characters-00000",
        "MEDIATOR_AGENT_PRINCIPAL": "lab-admin@lab.test",
    }

    assert warnings(env) == []
    assert load_config(env=env)["token"] is None
