"""What the figures were measured on, and where the CPU went while they were measured (/proc)."""

from __future__ import annotations

import datetime
import os
import platform
import resource
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str:
    """HEAD of the source tree, with ``+changes`` when files under app/ differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "app", "alembic", "gunicorn.conf.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def describe(libpq_url: str, server: dict[str, object]) -> dict[str, object]:
    with psycopg.connect(libpq_url, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in ("fsync", "synchronous_commit", "shared_buffers", "max_connections")
        }
    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "postgresql_version": version[0] if version else "unknown",
        "postgresql_settings": settings,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat(),
        "git_commit": git_commit(),
        "server": server,
    }


def record_opening(directory: Path, label: str, count: int = 1000) -> dict[str, float]:
    """What opening a Record costs on the file system the benchmark's Records live on: ``count``
    Records opened one after another in this process, as the Mediator opens one for every run it
    creates (``FilesystemRecords.open``: a directory and its ``manifest.json``, two new inodes),
    while the benchmark loads nothing. The floors open a Record per request too
    (``bench/floor.py``), so the ratios no longer move with this cost, but every rate does: on an
    ext4 without a journal, allocating an inode skips every inode of its group deleted in the
    last ``vm.dirtytime_expire_seconds`` (12 hours by default), one lookup each, and the cost of
    a Record grows with the files deleted on that disk that day.
    The probe's Records stay in ``directory`` (deleting them would add to that count)."""
    from app.records import record_location
    from app.records.filesystem import FilesystemRecords
    from app.services.records import manifest
    from bench.contracts import two_steps

    store = FilesystemRecords(directory)
    directory.mkdir(parents=True, exist_ok=True)
    created_at = datetime.datetime.now(datetime.UTC)
    took: list[float] = []
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    for i in range(count):
        run_id = f"record-probe-{label}-{i}"
        # The manifest of a placed line's run, as the Mediator writes it when the run is created.
        doc = manifest(
            run_id=run_id,
            work_id="",
            principal=None,
            token_name="bench",
            contract=two_steps(run_id, slot="s0"),
            created_at=created_at,
            state="RUNNING",
        )
        started = time.perf_counter()
        store.open(record_location(run_id), doc)
        took.append(time.perf_counter() - started)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    took.sort()
    return {
        "count": count,
        "p50_us": round(took[count // 2] * 1e6, 1),
        "p99_us": round(took[min(count - 1, count * 99 // 100)] * 1e6, 1),
        "system_us": round((cpu1.ru_stime - cpu0.ru_stime) / count * 1e6, 1),
    }


# ---------------------------------------------------------------- CPU accounting


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after the last ')'.
    return raw[raw.rindex(")") + 2 :].split()


def process_cpu(pid: int) -> float:
    """utime + stime of a process in seconds."""
    f = _stat_fields(pid)
    if f is None:
        return 0.0
    return (int(f[11]) + int(f[12])) / TICK  # fields 14 and 15 of proc(5)


def children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            f = _stat_fields(int(entry.name))
            if f is not None and int(f[1]) == pid:
                out.append(int(entry.name))
    return out


def _postgres_pids(database: str) -> list[int]:
    """The local server's processes that work for ``database``: its backends (their command line
    names the database) and the shared ones (checkpointer, WAL writer, …), not the backends of
    other databases."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() not in ("postgres", "postmaster"):
                continue
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        backend = "(" in cmd or "[local]" in cmd
        if not backend or f" {database} " in cmd:
            pids.append(int(entry.name))
    return pids


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _machine_busy() -> tuple[float, float]:
    """(busy seconds, total seconds) of all cores, from /proc/stat."""
    parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(v) for v in parts]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])
    return (total - idle) / TICK, total / TICK


@dataclass
class CpuSnapshot:
    at: float
    machine_busy: float
    server: float
    postgres: dict[int, float]


class CpuMeter:
    """CPU used by the server's processes, by the local PostgreSQL for ``database`` (see
    :func:`_postgres_pids`; a backend that ended between the snapshots is not counted) and by
    the whole machine, between two snapshots."""

    def __init__(self, server_pids: list[int], database: str) -> None:
        self.server_pids = server_pids
        self.database = database

    def snapshot(self, at: float) -> CpuSnapshot:
        busy, _ = _machine_busy()
        server = sum(process_cpu(p) for p in self.server_pids)
        pg = {p: process_cpu(p) for p in _postgres_pids(self.database)}
        return CpuSnapshot(at, busy, server, pg)

    @staticmethod
    def cores(start: CpuSnapshot, end: CpuSnapshot) -> dict[str, float]:
        wall = max(end.at - start.at, 1e-9)
        pg = sum(v - start.postgres.get(p, 0.0) for p, v in end.postgres.items())
        return {
            "machine": round((end.machine_busy - start.machine_busy) / wall, 2),
            "server": round((end.server - start.server) / wall, 2),
            "postgres": round(pg / wall, 2),
        }
