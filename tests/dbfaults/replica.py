"""A primary and its streaming standby, both servers of the test's own (the embedded one's
binaries, never the machine's shared server): the standby is made with ``pg_basebackup -R``
and replicates synchronously, so every commit the primary acknowledged is on the standby;
``promote()`` makes it the primary, as a failover manager does."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from app.dev.embedded import EmbeddedPostgresError
from tests.dbfaults.server import RestartablePostgres
from tests.support.concurrency import await_condition
from tests.support.processes import free_port

STANDBY_NAME = "mediator_standby"


class PrimaryAndStandby:
    def __init__(self) -> None:
        self.primary = RestartablePostgres(
            settings={
                "full_page_writes": "on",  # a base backup needs it
                "wal_level": "replica",
                "max_wal_senders": "4",
            }
        )
        self.standby_port: int | None = None
        self._standby: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None

    def start(self) -> PrimaryAndStandby:
        self.primary.start()
        return self

    @property
    def primary_port(self) -> int:
        assert self.primary.pg.port is not None
        return self.primary.pg.port

    def _as_server_user(self) -> dict[str, Any]:
        return self.primary.pg._credentials()

    def start_standby(self) -> None:
        """A base backup of the primary as it is now, started as its synchronous standby;
        returns once the primary reports it streaming in sync."""
        creds = self._as_server_user()
        base = self.primary.pg.directory
        assert base is not None and self.primary._bin is not None
        self._dir = Path(tempfile.mkdtemp(prefix="standby-", dir=base))
        data = self._dir / "data"
        if creds:
            os.chown(self._dir, creds["user"], creds["group"])
        os.chmod(self._dir, 0o700)
        conninfo = (
            f"host=127.0.0.1 port={self.primary_port} user=postgres application_name={STANDBY_NAME}"
        )
        subprocess.run(
            [
                str(self.primary._bin / "pg_basebackup"),
                "-d",
                conninfo,
                "-D",
                str(data),
                "-R",
                "-X",
                "stream",
                "--no-sync",
                "--checkpoint=fast",  # not a spread checkpoint of minutes first
            ],
            check=True,
            env=self.primary.pg._child_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
            **creds,
        )
        self.standby_port = free_port()
        log = open(self._dir / "standby.log", "ab")  # noqa: SIM115 (the server writes it)
        self._standby = subprocess.Popen(
            [
                str(self.primary._bin / "postgres"),
                "-D",
                str(data),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"port={self.standby_port}",
                "-c",
                "unix_socket_directories=",
                "-c",
                f"primary_conninfo={conninfo}",
                "-c",
                "hot_standby=on",
                "-c",
                "synchronous_standby_names=",
            ],
            cwd=self._dir,
            env=self.primary.pg._child_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **creds,
        )
        log.close()
        # Synchronous from now on: a commit waits for the standby (set before, every commit,
        # the base backup's own included, would wait for a standby that is not there yet).
        with psycopg.connect(self.primary.admin_url, autocommit=True) as conn:
            conn.execute(f"alter system set synchronous_standby_names = '{STANDBY_NAME}'")
            conn.execute("select pg_reload_conf()")
        standby, log_path = self._standby, self._dir / "standby.log"

        def in_sync() -> bool:
            if standby.poll() is not None:
                text = log_path.read_text(errors="replace")
                raise EmbeddedPostgresError(f"the standby exited:\n{text}")
            return self._in_sync()

        await_condition(in_sync, "the standby streaming in sync", 60, interval=0.05)

    def _in_sync(self) -> bool:
        try:
            with psycopg.connect(self.primary.admin_url, autocommit=True) as conn:
                row = conn.execute(
                    "select sync_state from pg_stat_replication where application_name = %s",
                    (STANDBY_NAME,),
                ).fetchone()
        except psycopg.OperationalError:
            return False
        return row == ("sync",)

    def standby_url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.standby_port}/{database}"

    def kill_primary(self) -> None:
        """The primary's postmaster is killed (``kill -9``), as a host that dies."""
        self.primary.down(signal.SIGKILL)

    def promote(self) -> None:
        """The standby becomes the primary; returns once it takes writes."""
        with psycopg.connect(self.standby_url(), autocommit=True) as conn:
            conn.execute("select pg_promote(true, 60)")

    def close(self) -> None:
        if self._standby is not None and self._standby.poll() is None:
            self._standby.send_signal(signal.SIGINT)
            try:
                self._standby.wait(30)
            except subprocess.TimeoutExpired:
                self._standby.kill()
        if self.primary.is_up:
            self.primary.close()
        else:
            self.primary.pg.stop()
