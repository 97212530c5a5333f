"""What an operator runs: gunicorn's settings from the environment (one line and a non-zero exit
on a bad value, ``WEB_CONCURRENCY`` honoured), the worker closing its context when it exits,
``mediator --version`` and ``mediator server db check``'s exit codes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from app.commands.main import DB_CHECK_BEHIND, DB_CHECK_UNREACHABLE
from app.migrate import head_revision
from tests.support.apps import ROOT, clean_env, gunicorn_on, mediator_cli

GUNICORN = [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"]


def _env(**extra: str) -> dict[str, str]:
    env = clean_env()
    env.pop("WEB_CONCURRENCY", None)
    env["MEDIATOR_DATABASE_URL"] = "postgresql://postgres@127.0.0.1:5432/unused"
    env.update(extra)
    return env


def _gunicorn(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GUNICORN, *args, "wsgi:app"],
        cwd=ROOT,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _settings(**env: str) -> dict[str, str]:
    done = _gunicorn("--print-config", **env)
    assert done.returncode == 0, done.stderr
    out = {}
    for line in done.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("MEDIATOR_WORKERS", "four"),
        ("MEDIATOR_WORKERS", "0"),
        ("MEDIATOR_THREADS", "-3"),
        ("MEDIATOR_THREADS", "1.5"),
        ("MEDIATOR_WORKER_TIMEOUT", "0"),
        ("MEDIATOR_WORKER_TIMEOUT", "90s"),
        ("MEDIATOR_GRACEFUL_TIMEOUT", "x"),
        ("MEDIATOR_WORKER_CONNECTIONS", "0"),
    ],
)
def test_a_bad_gunicorn_setting_stops_with_one_line_naming_the_variable(
    variable: str, value: str
) -> None:
    done = _gunicorn("--check-config", **{variable: value})
    assert done.returncode == 2  # the code of an invalid configuration: systemd does not restart
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"mediator: invalid gunicorn setting: {variable}: "
        f"must be an integer of at least 1 (got {value!r})"
    ]


def test_gunicorn_takes_its_counts_from_the_environment() -> None:
    defaults = _settings()
    assert (defaults["workers"], defaults["threads"], defaults["timeout"]) == ("4", "1000", "90")
    assert defaults["graceful_timeout"] == "30"
    given = _settings(
        MEDIATOR_WORKERS="3",
        MEDIATOR_THREADS="12",
        MEDIATOR_WORKER_TIMEOUT="120",
        MEDIATOR_GRACEFUL_TIMEOUT="20",
    )
    assert (given["workers"], given["threads"], given["timeout"]) == ("3", "12", "120")
    assert given["graceful_timeout"] == "20"


def test_a_worker_keeps_as_many_idle_connections_alive_as_it_has_threads() -> None:
    """gthread keeps an idle connection only below worker_connections - threads: gunicorn's
    default (1,000) beside 1,000 threads would close every connection after its request."""
    assert _settings()["worker_connections"] == "2000"
    assert _settings(MEDIATOR_THREADS="12")["worker_connections"] == "24"
    assert _settings(MEDIATOR_WORKER_CONNECTIONS="5000")["worker_connections"] == "5000"


def test_gunicorn_honours_web_concurrency_unless_mediator_workers_is_set() -> None:
    assert _settings(WEB_CONCURRENCY="7")["workers"] == "7"
    assert _settings(WEB_CONCURRENCY="7", MEDIATOR_WORKERS="2")["workers"] == "2"


def test_a_worker_closes_its_context_when_it_exits(fresh_db_url: str, tmp_path: Path) -> None:
    with gunicorn_on(
        fresh_db_url, tmp_path, MEDIATOR_WORKERS="1", MEDIATOR_LOG_LEVEL="info"
    ) as server:
        assert server.get("/v1/nodes").status_code == 200
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
    lines = [
        json.loads(line)
        for line in (tmp_path / "gunicorn.log").read_text().splitlines()
        if line.startswith("{")
    ]
    closed = [line for line in lines if line.get("event", "").startswith("process shut down")]
    assert len(closed) == 1, lines[-5:]


def _mediator(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return mediator_cli(*args, env=_env(**env))


def test_mediator_version_names_the_installed_package() -> None:
    done = _mediator("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"mediator, version {version('mediator')}"


def test_db_check_with_the_database_unreachable_says_so_in_one_line_with_its_own_code() -> None:
    done = _mediator(
        "server", "db", "check", MEDIATOR_DATABASE_URL="postgresql://postgres:s3cret@127.0.0.1:1/x"
    )
    assert done.returncode == DB_CHECK_UNREACHABLE
    assert DB_CHECK_UNREACHABLE != DB_CHECK_BEHIND
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("mediator: database unreachable: ")
    assert "Connection refused" in lines[0]
    assert "s3cret" not in done.stderr + done.stdout


def test_db_check_tells_a_schema_behind_from_a_current_one(
    fresh_db_url: str, pg_admin_url: str
) -> None:
    import psycopg

    from app.config import to_libpq_url

    current = _mediator("server", "db", "check", MEDIATOR_DATABASE_URL=fresh_db_url)
    assert current.returncode == 0, current.stderr
    first, server = current.stdout.splitlines()
    assert first == f"database is at {head_revision()}"
    assert server.startswith("server ") and server.endswith(")") and ", the primary (" in server
    with psycopg.connect(to_libpq_url(fresh_db_url), autocommit=True) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'an-older-one'")
    behind = _mediator("server", "db", "check", MEDIATOR_DATABASE_URL=fresh_db_url)
    assert behind.returncode == DB_CHECK_BEHIND
    assert "run `mediator server db upgrade`" in behind.stderr


def test_db_check_help_documents_its_exit_codes() -> None:
    done = _mediator("server", "db", "check", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for line in (
        "0 the database is at this code's head revision",
        "1 the schema is behind",
        "2 the configuration is invalid",
        "3 the database is unreachable",
    ):
        assert line in text
