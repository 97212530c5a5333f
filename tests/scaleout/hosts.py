"""Two Mediator hosts for the tests: two gunicorns on different ports, each with a local directory
of its own, one PostgreSQL database, and their Records in one bucket of moto's S3 server."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.support.apps import ROOT, LiveServer, gunicorn_on
from tests.support.s3 import AWS_ENV, new_bucket, shared_server


def store_keys(prefix: str = "records") -> dict[str, str]:
    """The Record store configuration several hosts share: a fresh bucket."""
    server = shared_server()
    return {
        "records.backend": "s3",
        "records.s3.bucket": new_bucket(server.url),
        "records.s3.prefix": prefix,
        "records.s3.endpoint_url": server.url,
    }


def store_env(keys: dict[str, str]) -> dict[str, str]:
    """``keys`` as the environment variables that set them, with the AWS chain's credentials."""
    return {"MEDIATOR_" + k.upper().replace(".", "_"): v for k, v in keys.items()} | AWS_ENV


@contextmanager
def two_hosts(
    db_url: str, tmp_path: Path, keys: dict[str, str], **env: str
) -> Iterator[tuple[LiveServer, LiveServer]]:
    """Hosts A and B (``tmp_path/a`` and ``tmp_path/b``). ``env`` goes to both; a key ending in
    ``_B`` only to B (without that suffix)."""
    both = {k: v for k, v in env.items() if not k.endswith("_B")}
    only_b = {k[:-2]: v for k, v in env.items() if k.endswith("_B")}
    with ExitStack() as stack:
        hosts = []
        for name, extra in (("a", {}), ("b", only_b)):
            d = tmp_path / name
            d.mkdir()
            live = gunicorn_on(db_url, d, **store_env(keys), **both, **extra)
            hosts.append(stack.enter_context(live))
        yield hosts[0], hosts[1]


def reaper_once(host: LiveServer) -> subprocess.CompletedProcess[str]:
    """``mediator reaper --once`` configured as ``host`` is (its environment, its directory)."""
    return subprocess.run(
        [sys.executable, "-m", "app.commands.main", "reaper", "--once"],
        cwd=ROOT,
        env=host.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
