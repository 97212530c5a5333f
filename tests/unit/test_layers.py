"""Dependencies inside ``app/`` run one way: no import cycle (also none hidden in a function-level
import), the store never imports the services or the API, the services never import the API, the
API never reaches the store or the models, and the pure decision modules import neither the
database nor the web framework.

The graph is read from the source with :mod:`ast`, so a cycle fails here even when a lazy import
keeps it from failing at start-up."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "app"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(APP.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(APP.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``app`` that the module imports anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for a in node.names:
                # ``from app.store import leases`` names a module; ``from app.store import X`` a name.
                target = f"{base}.{a.name}"
                if target in known:
                    out.add(target)
                elif base in known:
                    out.add(base)
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imported(name, path, known) for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path ``a -> b -> … -> a``, or None (depth-first, three colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_graph_sees_the_modules_and_their_imports():
    edges = graph()
    assert "app.store.runs" in edges and "app.services.queue" in edges
    assert "app.store.runs" in edges["app.services.queue"]


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_app_has_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("app.store", ("app.services", "app.api")),
        ("app.services", ("app.api",)),
        # A view calls a service; only services open transactions and reach the store.
        ("app.api", ("app.store", "app.models")),
    ],
)
def test_a_lower_layer_never_imports_a_higher_one(layer, forbidden):
    wrong = sorted(
        f"{name} imports {dep}"
        for name, deps in graph().items()
        if name == layer or name.startswith(layer + ".")
        for dep in deps
        if any(dep == f or dep.startswith(f + ".") for f in forbidden)
    )
    assert wrong == []


# The pure decision modules take plain data: no session, no request (docs/design.md#code-layout).
PURE = (
    "app.match",
    "app.contract",
    "app.verdict",
    "app.reserve",
    "app.states",
    "app.wire",
    "app.pages.askform",
    "app.teamchart",
    "app.teams",
    "app.names",
    "app.estimate",
)
FRAMEWORKS = ("sqlalchemy", "flask", "werkzeug", "psycopg")


def third_party(path: Path) -> set[str]:
    """The top-level packages outside ``app`` that a module imports anywhere in its body."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out - {"app"}


def test_pure_modules_never_import_the_database_or_the_web_framework():
    wrong = sorted(
        f"{name} imports {package}"
        for name, path in modules().items()
        if any(name == p or name.startswith(p + ".") for p in PURE)
        for package in third_party(path) & set(FRAMEWORKS)
    )
    assert wrong == []


def test_pure_modules_import_only_pure_modules_of_the_app():
    pure = lambda n: any(n == p or n.startswith(p + ".") for p in PURE)  # noqa: E731
    wrong = sorted(
        f"{name} imports {dep}"
        for name, deps in graph().items()
        if pure(name)
        for dep in deps
        if not pure(dep) and dep not in {"app.errors"}
    )
    assert wrong == []
