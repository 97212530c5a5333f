"""The deployment files are what they say: the production configuration example loads and lists
every key of the configuration with its default, the systemd units pass ``systemd-analyze
verify`` and start what the documentation says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from app.config import KEYS, load_config, read_file
from tests.apps import ROOT
from tests.deploy.programs import require_program

DEPLOY = ROOT / "deploy"
# The example's one departure from the defaults: a production path for the Records.
PRODUCTION = {
    "records.root": "/var/lib/mediator/records",
    "http.trusted_proxies": 1,
    "metrics.require_token": True,
    "ui.require_token": True,
}


def test_the_configuration_example_loads_and_gives_every_key_its_default() -> None:
    path = DEPLOY / "mediator.yaml"
    loaded = load_config(path, env={"MEDIATOR_DATABASE_URL": "postgresql://u@h/db"})
    in_file = read_file(path)
    text = path.read_text()
    for key in KEYS:
        if key.secret:  # in the environment file only; named in a comment
            assert key.name not in in_file, key.name
            leaf = key.name.split(".")[-1]
            assert re.search(rf"^\s*#\s*{re.escape(leaf)}:", text, flags=re.M), key.name
            assert key.env in text or key.name == "database.url", key.name
            continue
        assert key.name in in_file, f"deploy/mediator.yaml does not list {key.name}"
        expected = PRODUCTION.get(key.name, key.default)
        assert loaded[key.name] == expected, key.name
    assert "MEDIATOR_DATABASE_URL" in text


def test_the_environment_file_example_holds_the_secrets() -> None:
    text = (DEPLOY / "mediator.env.example").read_text()
    names = {
        line.split("=", 1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#") and "=" in line
    }
    assert names == {"MEDIATOR_DATABASE_URL", "MEDIATOR_TOKEN"}
    assert "MEDIATOR_TOKENS=" in text


def test_the_systemd_units_verify_and_start_gunicorn_and_the_reaper(tmp_path: Path) -> None:
    analyze = require_program("systemd-analyze", "systemd")
    bin_dir = Path(sys.executable).parent
    units = {}
    for name in ("mediator.service", "mediator-reaper.service"):
        text = (DEPLOY / name).read_text()
        assert "EnvironmentFile=/etc/mediator/mediator.env" in text
        assert "Environment=MEDIATOR_CONFIG=/etc/mediator/mediator.yaml" in text
        assert "RestartPreventExitStatus=2" in text  # an invalid configuration: no restart loop
        units[name] = text
        # The units name the virtualenv of /opt/mediator; verify them against this one.
        (tmp_path / name).write_text(text.replace("/opt/mediator/.venv/bin", str(bin_dir)))
    exec_start = {
        name: re.findall(r"^ExecStart=(.*)$", text, flags=re.M) for name, text in units.items()
    }
    assert exec_start == {
        "mediator.service": ["/opt/mediator/.venv/bin/gunicorn -c gunicorn.conf.py wsgi:app"],
        "mediator-reaper.service": ["/opt/mediator/.venv/bin/mediator reaper"],
    }
    done = subprocess.run(
        [analyze, "verify", *(str(tmp_path / n) for n in units)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "" and done.stdout.strip() == ""
