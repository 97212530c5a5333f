"""Debian programs some tests drive (nginx, chromium): found on PATH, or the test fails in CI
(``.ci/run`` installs them) and is skipped elsewhere with the command that installs it."""

from __future__ import annotations

import os
import shutil

import pytest


def require_program(name: str, package: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if found:
        return found
    message = f"{name} is not installed: apt-get install -y {package}"
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(message + " (.ci/run installs it)")
    pytest.skip(message)
