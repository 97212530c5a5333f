"""A primary and its streaming standby, both servers of the test's own (the embedded one's
binaries, never the machine's shared server): the standby is made with ``pg_basebackup -R``
and replicates synchronously, so every commit the primary acknowledged is on the standby;
``promote()`` makes it the primary, as a failover manager does; ``rejoin_old_primary()`` brings
the old primary's address back as a replica of the new primary, as a manager reinstates it (a
fresh copy of the new primary: the old one's last WAL may not be on the new timeline)."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import Any

import psycopg

from app.dev.embedded import EmbeddedPostgresError
from tests.dbfaults.server import RestartablePostgres
from tests.support.concurrency import await_condition
from tests.support.processes import children_of, free_port

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
        self._rejoined: subprocess.Popen[bytes] | None = None
        self._stopped = False
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
        self.standby_port = free_port()
        self._standby, self._dir = self._replica_of(self.primary_port, self.standby_port)
        # Synchronous from now on: a commit waits for the standby (set before, every commit,
        # the base backup's own included, would wait for a standby that is not there yet).
        with psycopg.connect(self.primary.admin_url, autocommit=True) as conn:
            conn.execute(f"alter system set synchronous_standby_names = '{STANDBY_NAME}'")
            conn.execute("select pg_reload_conf()")
        standby, log_path = self._standby, self._dir / "replica.log"

        def in_sync() -> bool:
            if standby.poll() is not None:
                text = log_path.read_text(errors="replace")
                raise EmbeddedPostgresError(f"the standby exited:\n{text}")
            return self._in_sync()

        await_condition(in_sync, "the standby streaming in sync", 60, interval=0.05)

    def _replica_of(
        self, source_port: int, port: int, name: str = STANDBY_NAME
    ) -> tuple[subprocess.Popen[bytes], Path]:
        """``pg_basebackup -R`` of the server on ``source_port`` into a directory of its own,
        started on ``port`` as its streaming replica; returns the postmaster and the directory
        (its ``replica.log`` is the server's log)."""
        creds = self._as_server_user()
        base = self.primary.pg.directory
        assert base is not None and self.primary._bin is not None
        where = Path(tempfile.mkdtemp(prefix="replica-", dir=base))
        data = where / "data"
        if creds:
            os.chown(where, creds["user"], creds["group"])
        os.chmod(where, 0o700)
        conninfo = f"host=127.0.0.1 port={source_port} user=postgres application_name={name}"
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
        log = open(where / "replica.log", "ab")  # noqa: SIM115 (the server writes it)
        proc = subprocess.Popen(
            [
                str(self.primary._bin / "postgres"),
                "-D",
                str(data),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"port={port}",
                "-c",
                "unix_socket_directories=",
                "-c",
                f"primary_conninfo={conninfo}",
                "-c",
                "hot_standby=on",
                "-c",
                "synchronous_standby_names=",
            ],
            cwd=where,
            env=self.primary.pg._child_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **creds,
        )
        log.close()
        return proc, where

    def _in_sync(self) -> bool:
        return _replication(self.primary.admin_url, STANDBY_NAME, "sync_state") == "sync"

    def standby_url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.standby_port}/{database}"

    def _primary_processes(self) -> list[int]:
        """The old primary's postmaster and every process it started."""
        proc = self.primary.pg._proc
        assert proc is not None
        return [proc.pid, *sorted(children_of(proc.pid))]

    def kill_primary(self) -> None:
        """Every process of the primary is killed (``kill -9``), as a host that dies; stopped
        ones too (``stop_primary``)."""
        pids = self._primary_processes()
        for pid in pids[1:]:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.primary.down(signal.SIGKILL)

    def stop_primary(self) -> None:
        """Every process of the primary is stopped (SIGSTOP), the postmaster first so that it
        starts no new one: its port still completes TCP handshakes and its kernel acknowledges
        what is sent, but nothing answers, as a hung host."""
        self._stopped = True
        for pid in self._primary_processes():
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def rejoin_old_primary(self) -> None:
        """The old primary (killed) comes back on its own address as a streaming replica of the
        new primary; returns once the new primary reports it streaming."""
        assert not self.primary.is_up and self.standby_port is not None
        name = "mediator_old_primary"
        self._rejoined, where = self._replica_of(self.standby_port, self.primary_port, name)
        rejoined, log_path = self._rejoined, where / "replica.log"

        def streaming() -> bool:
            if rejoined.poll() is not None:
                text = log_path.read_text(errors="replace")
                raise EmbeddedPostgresError(f"the rejoined replica exited:\n{text}")
            return _replication(self.standby_url(), name, "state") == "streaming"

        await_condition(streaming, "the old primary streaming from the new one", 60, 0.05)

    def primary_url(self, database: str = "postgres") -> str:
        """The old primary's address (a replica once rejoined)."""
        return f"postgresql://postgres@127.0.0.1:{self.primary_port}/{database}"

    def promote(self) -> None:
        """The standby becomes the primary; returns once it takes writes."""
        with psycopg.connect(self.standby_url(), autocommit=True) as conn:
            conn.execute("select pg_promote(true, 60)")

    def close(self) -> None:
        for replica in (self._rejoined, self._standby):
            if replica is not None and replica.poll() is None:
                replica.send_signal(signal.SIGINT)
                try:
                    replica.wait(30)
                except subprocess.TimeoutExpired:
                    replica.kill()
        if self._stopped and self.primary.is_up:
            self.kill_primary()  # never woken: it would take writes beside the new primary
        if self.primary.is_up:
            self.primary.close()
        else:
            self.primary.pg.stop()


def _replication(url: str, name: str, column: str) -> str | None:
    """``column`` of ``pg_stat_replication`` for the replica ``name`` as the server at ``url``
    sees it (None: not connected, or the server does not answer)."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                f"select {column} from pg_stat_replication where application_name = %s", (name,)
            ).fetchone()
    except psycopg.OperationalError:
        return None
    return None if row is None else str(row[0])
