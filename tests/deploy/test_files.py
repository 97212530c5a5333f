"""The deployment files are what they say: the production configuration example loads and lists
every key of the configuration with its default, the systemd units pass ``systemd-analyze
verify``, start what the documentation says and are hardened (docs/security.md#the-deployment)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from app.config import KEYS, load_config, read_file
from tests.support.apps import ROOT
from tests.support.programs import require_program

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
        if key.name == "database.url":  # in the environment file only; named in a comment
            assert key.name not in in_file
            assert re.search(r"^\s*#\s*url:", text, flags=re.M)
            continue
        assert key.name in in_file, f"deploy/mediator.yaml does not list {key.name}"
        expected = PRODUCTION.get(key.name, key.default)
        assert loaded[key.name] == expected, key.name
    assert "MEDIATOR_DATABASE_URL" in text


def test_the_environment_file_example_holds_the_database_url_and_no_token() -> None:
    """systemd reads the environment file only when a unit starts, and its variables win over
    the configuration file, which a reload reads again: a token there would outlive its removal
    (docs/tokens.md, "Changing tokens"). The tokens are kept in mediator.yaml."""
    text = (DEPLOY / "mediator.env.example").read_text()
    names = {
        line.split("=", 1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#") and "=" in line
    }
    assert names == {"MEDIATOR_DATABASE_URL"}
    assert "MEDIATOR_TOKEN=" not in text and "MEDIATOR_TOKENS=" not in text
    assert {"tokens", "token"} <= set(read_file(DEPLOY / "mediator.yaml"))


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
        "mediator-reaper.service": ["/opt/mediator/.venv/bin/mediator server reaper"],
    }
    done = subprocess.run(
        [analyze, "verify", *(str(tmp_path / n) for n in units)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "" and done.stdout.strip() == ""


# Each unit's hardening (docs/security.md#the-deployment): the directive and its value, exactly as
# the unit sets it.
HARDENING = {
    "UMask": "0027",
    "NoNewPrivileges": "yes",
    "CapabilityBoundingSet": "",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "ProtectKernelTunables": "yes",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "LimitNOFILE": "65536",
}


def _service_settings(text: str) -> dict[str, list[str]]:
    """``{directive: [values]}`` of the ``[Service]`` section, comments left out."""
    section = text.split("[Service]", 1)[1].split("\n[", 1)[0]
    settings: dict[str, list[str]] = {}
    for line in section.splitlines():
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            settings.setdefault(name.strip(), []).append(value.strip())
    return settings


def test_the_systemd_units_are_hardened_and_bounded() -> None:
    for name in ("mediator.service", "mediator-reaper.service"):
        settings = _service_settings((DEPLOY / name).read_text())
        for directive, value in HARDENING.items():
            assert settings.get(directive) == [value], (name, directive, settings.get(directive))
        memory = settings.get("MemoryMax", [""])
        assert len(memory) == 1 and re.fullmatch(r"\d+[KMG]", memory[0]), (name, memory)
    # A worker the kernel ends for memory is replaced by gunicorn; the unit goes on.
    assert _service_settings((DEPLOY / "mediator.service").read_text())["OOMPolicy"] == ["continue"]
