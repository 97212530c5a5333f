"""The benchmark's databases on the local PostgreSQL (or MEDIATOR_BENCH_DATABASE_URL): one
migrated template, a fresh copy of it per measurement, all dropped at the end; bulk rows by SQL
(copies of rows the Mediator wrote itself), and pgbench."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from app.config import to_libpq_url
from app.dev.embedded import create_database, drop_database, server_answers
from app.migrate import upgrade

LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
ENV_URL = "MEDIATOR_BENCH_DATABASE_URL"


def admin_url() -> str:
    url = os.environ.get(ENV_URL, "").strip() or LOCAL_URL
    if not server_answers(url):
        raise SystemExit(
            f"bench: no PostgreSQL answers at {url}; start the local server "
            f"(127.0.0.1:5432, user postgres) or set {ENV_URL} to an admin URL"
        )
    return url


class Databases:
    """A migrated template and the fresh databases cloned from it; :meth:`drop_all` removes
    every one of them."""

    def __init__(self, admin: str) -> None:
        self.admin = admin
        self.prefix = f"mediator_bench_{os.getpid()}_{uuid.uuid4().hex[:4]}"
        self.template = self.prefix + "_tpl"
        self.made: list[str] = []

    def prepare(self) -> None:
        url = create_database(self.admin, self.template)
        self.made.append(self.template)
        upgrade(url)

    def fresh(self, name: str) -> str:
        db = f"{self.prefix}_{name}"
        url = create_database(self.admin, db, template=self.template)
        self.made.append(db)
        return url

    def drop_all(self) -> None:
        for name in reversed(self.made):
            try:
                drop_database(self.admin, name)
            except Exception as exc:  # keep dropping the others
                print(f"bench: could not drop database {name}: {exc}")
        self.made.clear()


def connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(to_libpq_url(url), autocommit=True)


def vacuum_analyze(url: str, tables: tuple[str, ...] = ("runs", "steps", "run_events")) -> None:
    """What autovacuum would have done to a table filled over weeks: statistics for the planner
    and a visibility map for index-only scans."""
    with connect(url) as conn:
        for table in tables:
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))


def _columns(conn: psycopg.Connection[Any], table: str) -> list[str]:
    """The table's columns in order, less those filled by a sequence (they number themselves)."""
    rows = conn.execute(
        "SELECT column_name, coalesce(column_default, '') FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    return [name for name, default in rows if not default.startswith("nextval(")]


def clone_run(
    url: str,
    template: str,
    prefix: str,
    first: int,
    last: int,
    *,
    every_us: int = 1,
    offset_us: int = 0,
    tables: tuple[str, ...] = ("runs", "steps", "run_events"),
    overrides: dict[tuple[str, str], str] | None = None,
) -> int:
    """Copies ``prefix || g`` (g from ``first`` to ``last``) of the run ``template`` with its rows
    in ``tables``, as the Mediator wrote them; copy g was created ``g * every_us + offset_us``
    microseconds after the template (arrival order). ``overrides`` gives (table, column) an SQL
    expression of ``t`` (the template's row) and ``g`` instead. Returns the number of runs
    copied."""
    if last < first:
        return 0
    new_id = sql.SQL("({} || g::text)").format(sql.Literal(prefix))
    with connect(url) as conn:
        for table in tables:
            cols = _columns(conn, table)
            exprs: list[sql.Composable] = []
            for col in cols:
                if overrides and (table, col) in overrides:
                    exprs.append(sql.SQL(overrides[(table, col)]))
                elif col == "run_id":
                    exprs.append(new_id)
                elif table == "runs" and col == "created_at":
                    exprs.append(
                        sql.SQL(
                            "t.created_at + make_interval(secs => (g::float8 * {} + {}) / 1e6)"
                        ).format(sql.Literal(every_us), sql.Literal(offset_us))
                    )
                elif table == "runs" and col == "contract":
                    exprs.append(
                        sql.SQL("jsonb_set(t.contract, '{{run_id}}', to_jsonb({}))").format(new_id)
                    )
                else:
                    exprs.append(sql.SQL("t.{}").format(sql.Identifier(col)))
            conn.execute(
                sql.SQL(
                    "INSERT INTO {table} ({cols}) SELECT {exprs} FROM {table} t"
                    " CROSS JOIN generate_series({first}, {last}) g WHERE t.run_id = {template}"
                ).format(
                    table=sql.Identifier(table),
                    cols=sql.SQL(", ").join(sql.Identifier(c) for c in cols),
                    exprs=sql.SQL(", ").join(exprs),
                    first=sql.Literal(first),
                    last=sql.Literal(last),
                    template=sql.Literal(template),
                )
            )
    return last - first + 1


# ---------------------------------------------------------------- pgbench


def pgbench_path() -> str:
    """The server's own pgbench (``/usr/lib/postgresql/N/bin``, newest first), else the one on
    PATH; scripts/bench installs Debian's PostgreSQL packages when there is neither."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pgbench"),
        key=lambda p: int(re.sub(r"\D", "", p.split("/")[4]) or 0),
        reverse=True,
    )
    if found:
        return found[0]
    on_path = shutil.which("pgbench")
    if on_path:
        return on_path
    raise SystemExit("bench: pgbench not found (Debian: apt-get install postgresql)")


FLOOR_SQL = Path(__file__).with_name("floor.sql")
# The pinned shape's floor: the same statements for a submit that names its one board.
FLOOR_PINNED_SQL = Path(__file__).with_name("floor_pinned.sql")

# The variables of the floors' files: a fresh key per transaction, and what the submit's
# requirement names (the slot's number on the pool shape, the board on the pinned one).
FLOOR_VARIABLES = ("bench_id", "slot", "board")
_NAMES = "|".join(FLOOR_VARIABLES)
# pgbench reads ``:name`` as a variable anywhere in a statement; only ours may appear.
_STRAY_VARIABLE = re.compile(rf"(?<!:):(?!:)(?!(?:{_NAMES})\b)[A-Za-z0-9_]")
FLOOR_VARIABLE = re.compile(rf"(?<!:):({_NAMES})\b")


def floor_statements(path: Path = FLOOR_SQL) -> list[str]:
    """The frozen statements of ``bench/floor.sql`` or ``bench/floor_pinned.sql``
    (docs/design.md#targets), their variables (``:bench_id``, ``:slot``, ``:board``) left as
    pgbench writes them: statements end with ``;`` at the end of a line, ``--`` lines are
    comments."""
    statements, current = [], []
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("--"):
            continue
        current.append(line.strip())
        if line.rstrip().endswith(";"):
            statements.append(" ".join(current).rstrip(";"))
            current = []
    if current or not statements:
        raise ValueError(f"{path}: no statements, or one without its closing ';'")
    return statements


def pgbench_script(statements: list[str], slots: int) -> str:
    """One transaction of the given statements (``:bench_id`` is a fresh random key each time,
    ``:slot`` one of ``slots``)."""
    for st in statements:
        m = _STRAY_VARIABLE.search(st)
        if m:
            raise ValueError(f"a literal pgbench would read as a variable: …{st[m.start() - 20 :]}")
    lines = [
        "\\set bench_id random(1, 1000000000000000)",
        f"\\set slot random(0, {max(0, slots - 1)})",
        "BEGIN;",
    ]
    lines += [st.rstrip().rstrip(";") + ";" for st in statements]
    lines.append("COMMIT;")
    return "\n".join(lines) + "\n"


def run_pgbench(
    url: str, script: Path, *, clients: int, threads: int, seconds: float
) -> dict[str, Any]:
    """pgbench -M prepared (psycopg prepares a statement from its fifth use too) on ``url``."""
    info = psycopg.conninfo.conninfo_to_dict(to_libpq_url(url))
    env = dict(os.environ)
    for key, var in (
        ("host", "PGHOST"),
        ("port", "PGPORT"),
        ("user", "PGUSER"),
        ("password", "PGPASSWORD"),
        ("dbname", "PGDATABASE"),
    ):
        if info.get(key):
            env[var] = str(info[key])
    argv = [
        pgbench_path(),
        "--no-vacuum",
        "--protocol=prepared",
        f"--client={clients}",
        f"--jobs={threads}",
        f"--time={max(1, round(seconds))}",
        f"--file={script}",
    ]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 120)
    if out.returncode != 0:
        raise RuntimeError(f"pgbench failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    text = out.stdout + out.stderr
    tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", text)
    latency = re.search(r"latency average = ([0-9.]+) ms", text)
    failed = re.search(r"number of failed transactions: (\d+)", text)
    if tps is None:
        raise RuntimeError(f"pgbench printed no tps:\n{text}")
    return {
        "tps": round(float(tps.group(1)), 1),
        "latency_avg_ms": float(latency.group(1)) if latency else None,
        "failed": int(failed.group(1)) if failed else 0,
        "clients": clients,
        "seconds": max(1, round(seconds)),
    }
