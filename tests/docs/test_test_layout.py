"""The tests' own layout (tests/README.md#where-helpers-live) stays true (no database needed): every
helper that more than one test package uses lives in tests/support/, and a test module is never
imported.

This test parses every .py file under tests/ and fails, naming file and line, when a module
imports (at its top or inside a function, absolutely or relatively):

- a ``test_*`` module: what two test modules share is a helper, and it belongs in tests/support/;
- a ``conftest`` module: pytest gives a package's fixtures to its tests without an import;
- a helper module of another test package (``tests.deploy.nginx`` from tests/pages/, say): the
  allowed imports from ``tests.*`` are ``tests.support.*``, and a package's own helper modules
  from inside that package. A module of tests/support/ imports only from tests/support/.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
SUPPORT = "support"


@dataclass(frozen=True)
class Import:
    line: int
    module: str  # dotted, absolute: tests.api.test_cancel


def _package_of(path: Path) -> tuple[str, ...]:
    """The dotted package of the module at ``path`` (a file under the project root)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return parts[:-1]


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or a package of the project (a file or a directory)."""
    base = ROOT.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path, source: str) -> list[Import]:
    """Every module of ``tests`` that ``source`` (the text of the file at ``path``) imports: for
    ``from X import n``, ``X.n`` when that is a module, else ``X``."""
    found: list[Import] = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            found += [Import(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package_of(path)
                up = package[: len(package) - (node.level - 1)]
                base = ".".join([*up, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append(Import(node.lineno, sub if _is_module(sub) else base))
    ours = [i for i in found if i.module == "tests" or i.module.startswith("tests.")]
    return list(dict.fromkeys(ours))  # one of each: ``from X import a, b`` is one import of X


def violations(path: Path, source: str) -> list[str]:
    """What is wrong with the imports of ``source`` (the file at ``path``), one line each."""
    where = path.relative_to(ROOT)
    own = _package_of(path)[1:2]  # () for tests/conftest.py, ("api",) for tests/api/...
    out = []
    for imp in imports_of(path, source):
        parts = imp.module.split(".")
        if any(p.startswith("test_") for p in parts):
            out.append(f"{where}:{imp.line}: imports the test module {imp.module}")
        elif "conftest" in parts:
            out.append(f"{where}:{imp.line}: imports {imp.module} (pytest provides fixtures)")
        elif len(parts) > 1 and parts[1] != SUPPORT and tuple(parts[1:2]) != own:
            out.append(
                f"{where}:{imp.line}: imports {imp.module}, a helper of another test package"
                " (shared helpers live in tests/support/)"
            )
    return out


def test_no_test_module_imports_a_test_module_a_conftest_or_another_packages_helper() -> None:
    found = [
        line
        for path in sorted(TESTS.rglob("*.py"))
        for line in violations(path, path.read_text(encoding="utf-8"))
    ]
    assert found == [], "\n".join(found)


def test_the_shared_helpers_are_in_tests_support() -> None:
    """No helper module is left at the top of tests/ (tests/helpers.py, say): only the suite's
    conftest.py and __init__.py."""
    assert sorted(p.name for p in TESTS.glob("*.py")) == ["__init__.py", "conftest.py"]
    assert (TESTS / SUPPORT / "__init__.py").is_file()


@pytest.mark.parametrize(
    ("where", "source", "wrong"),
    [
        ("api/test_x.py", "from tests.api.test_cancel import cancel\n", "test module"),
        ("api/test_x.py", "import tests.api.test_cancel\n", "test module"),
        ("api/test_x.py", "from .test_cancel import cancel\n", "test module"),
        ("api/test_x.py", "from tests.api import test_cancel\n", "test module"),
        ("api/test_x.py", "def f():\n    from tests.perf.test_scan_reads import SLACK\n", "test"),
        ("pages/test_x.py", "from tests.conftest import marked_config\n", "pytest provides"),
        ("pages/test_x.py", "from tests.deploy.nginx import Nginx\n", "another test package"),
        ("pages/test_x.py", "from tests.deploy import nginx\n", "another test package"),
        ("support/x.py", "from tests.deploy.nginx import Nginx\n", "another test package"),
        ("x.py", "from tests.compat.gowire import decode\n", "another test package"),
    ],
)
def test_the_check_names_each_kind_of_wrong_import(where: str, source: str, wrong: str) -> None:
    found = violations(TESTS / where, source)
    assert len(found) == 1 and wrong in found[0], found
    assert found[0].startswith(f"tests/{where}:")


@pytest.mark.parametrize(
    ("where", "source"),
    [
        ("api/test_x.py", "from tests.support.contracts import contract\n"),
        ("api/test_x.py", "from tests.support import strategies\n"),
        ("compat/test_x.py", "from tests.compat.gowire import decode\n"),
        ("compat/conftest.py", "from .mediator import Mediator\n"),
        ("deploy/test_x.py", "from tests.deploy.nginx import Nginx\n"),
        ("support/x.py", "from tests.support.apps import TOKEN\n"),
        ("conftest.py", "from tests.support.tables import empty_tables\n"),
        ("api/test_x.py", "from app.api.common import json_body\nimport pytest\n"),
    ],
)
def test_the_check_lets_the_allowed_imports_be(where: str, source: str) -> None:
    assert violations(TESTS / where, source) == []
