"""Every package that app/ imports is declared in setup.cfg: a module that is only there because
another dependency happens to bring it (apispec through flask-smorest) breaks when that one
changes its own requirements."""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imported_top_levels() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "app").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "app"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options"]["install_requires"].splitlines()
    for extra in ("s3", "demo"):  # the extras app/ imports from when they are installed
        lines += cfg["options.extras_require"][extra].splitlines()
    found = set()
    for line in lines:
        line = line.split("#")[0].strip()
        if line:
            found.add(_canonical(re.split(r"[\[<>=!~ ;]", line, maxsplit=1)[0]))
    return found


def test_every_package_app_imports_is_a_declared_dependency():
    providers = importlib.metadata.packages_distributions()
    declared = _declared()
    missing = {}
    for module in sorted(_imported_top_levels()):
        dists = {_canonical(d) for d in providers.get(module, [])}
        assert dists, f"{module} is imported by app/ and installed by no distribution"
        if not dists & declared:
            missing[module] = sorted(dists)
    assert missing == {}
