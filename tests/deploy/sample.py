"""The deploy samples installed as docs/deploy.md installs them, into a test's directory: the
configuration file (``deploy/mediator.yaml``) and the environment file
(``deploy/mediator.env.example``), with the test's database, and the test's tokens put where the
samples keep them — in whichever of the two files sets a token key — and written there again when
the test changes them, as an operator edits that file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from app.config import read_file
from tests.support.apps import ROOT

ENV_SAMPLE = ROOT / "deploy" / "mediator.env.example"
CONFIG_SAMPLE = ROOT / "deploy" / "mediator.yaml"
# The token keys and their variables.
TOKEN_VARIABLES = {"tokens": "MEDIATOR_TOKENS", "token": "MEDIATOR_TOKEN"}


def environment_file(text: str) -> dict[str, str]:
    """The variables of an environment file (``NAME=value`` lines; ``#`` comments), as systemd's
    ``EnvironmentFile=`` reads the samples' (their values are not quoted)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            out[name.strip()] = value.strip()
    return out


class Installed:
    """``/etc/mediator`` of a test: ``config`` (``MEDIATOR_CONFIG``) and ``env_file``
    (``EnvironmentFile=``). The Records go to ``records``; the pages' cookies go without
    ``Secure``, since the tests speak plain HTTP to gunicorn (nginx serves HTTPS in front)."""

    def __init__(self, etc: Path, database_url: str, records: Path) -> None:
        etc.mkdir(parents=True, exist_ok=True)
        self.config = etc / "mediator.yaml"
        self.env_file = etc / "mediator.env"
        self._records = records
        self._database_url = database_url
        variables = environment_file(ENV_SAMPLE.read_text())
        in_environment = sorted(k for k, name in TOKEN_VARIABLES.items() if name in variables)
        in_file = sorted(key for key in TOKEN_VARIABLES if key in read_file(CONFIG_SAMPLE))
        assert bool(in_environment) != bool(in_file), (
            "the samples set tokens in one place: "
            f"mediator.env.example {in_environment}, mediator.yaml {in_file}"
        )
        # Where the samples keep the tokens: the environment file, or the configuration file.
        self.tokens_in_environment = bool(in_environment)
        self.set_tokens(None, [])

    def set_tokens(self, token: str | None, tokens: list[dict[str, Any]]) -> None:
        """Write the legacy ``token`` (None: none) and the ``tokens`` entries where the samples
        keep them, and each file as the samples have it otherwise."""
        env_lines = []
        for line in ENV_SAMPLE.read_text().splitlines():
            name = line.split("=", 1)[0].strip()
            if name == "MEDIATOR_DATABASE_URL":
                line = f"{name}={self._database_url}"
            elif name in TOKEN_VARIABLES.values():
                continue  # the sample's placeholder: the test's own tokens are written below
            env_lines.append(line)
        config = yaml.safe_load(CONFIG_SAMPLE.read_text())
        config["records"]["root"] = str(self._records)
        config["ui"]["insecure_cookie"] = True
        if self.tokens_in_environment:
            if token is not None:
                env_lines.append(f"{TOKEN_VARIABLES['token']}={token}")
            env_lines.append(f"{TOKEN_VARIABLES['tokens']}={json.dumps(tokens)}")
        else:
            config["token"] = token
            config["tokens"] = tokens
        self.env_file.write_text("\n".join(env_lines) + "\n")
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))

    def environment(self) -> dict[str, str | None]:
        """What ``EnvironmentFile=`` and ``Environment=MEDIATOR_CONFIG=`` give the unit's
        processes when it starts, for :func:`tests.support.apps.gunicorn_on`: the environment file's
        variables as the file is now, and no token variable it does not set."""
        env: dict[str, str | None] = dict.fromkeys(TOKEN_VARIABLES.values())
        env.update(environment_file(self.env_file.read_text()))
        env["MEDIATOR_CONFIG"] = str(self.config)
        return env
