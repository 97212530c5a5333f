"""References from the code and the pages to the documentation stay true (no database needed).

Comments, docstrings and pages cite the user documentation as ``docs/<page>.md#<anchor>``, where
the anchor is the GitHub slug of a heading of that page, or as ``(docs/<page>.md, "<Heading>")``.
This test reads app/, tests/, bench/, scripts/, alembic/, wsgi.py, README.md and docs/*.md, and
fails, naming file and line, when:

- a section sign is left: the code never cites the design notes it was built from, only docs/;
- a ``docs/<page>.md#<anchor>`` names a page that does not exist or an anchor that is not the slug
  of one of its headings (and, inside docs/, a link ``(<page>.md#<anchor>)`` or ``(#<anchor>)``);
- a ``docs/<page>.md, "<Heading>"`` names a heading that the page does not have. The quoted text
  is compared without case, markdown emphasis and backticks, with the heading whole, its part
  before a colon, its part after a dash, or without its number: ``"Promotion"`` stands for
  "Promotion: the request that frees a node promotes", ``"gunicorn"`` for "6. gunicorn".
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# Written as a code point so that this file does not trip its own check.
SECTION_SIGN = chr(0xA7)

SCANNED_DIRS = ("app", "tests", "bench", "scripts", "alembic", "deploy", "examples", ".ci")
SCANNED_FILES = ("wsgi.py", "gunicorn.conf.py", "README.md", "setup.cfg", "tox.ini")
SUFFIXES = {".py", ".sh", ".sql", ".md", ".html", ".js", ".toml", ".ini", ".cfg"}

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")

_ANCHORED = re.compile(r"docs/([A-Za-z0-9_.-]+?)\.md#([A-Za-z0-9_-]*)")
_RELATIVE = re.compile(r"\]\(([A-Za-z0-9_.-]+\.md)?#([A-Za-z0-9_-]*)\)")
# ``docs/queue.md, "Lock order"``, ``docs/teams.md "Fair share"``, ``(docs/operators.md`)
# ("Quarantine")``, ``<code>docs/teams.md</code> ("Fair share")``: the quoted heading may run on
# over a line break, where a comment goes on with its marker.
_QUOTED = re.compile(
    r"docs/([A-Za-z0-9_-]+)\.md(?:`|</code>)?(?:\]\([^)]*\))?"
    r"(?:,[ \t]*\(?|[ \t]+\(?|[ \t]*\()\"([^\"\n]*(?:\n[^\"\n]*)?)\""
)
_CONTINUATION = re.compile(r"[ \t]*\n[ \t]*(?:#|//|--)?[ \t]*")


def _plain(heading: str) -> str:
    """A heading's text as GitHub renders it: links as their text, code spans as their code,
    no emphasis markers and no inline HTML."""
    heading = _LINK.sub(r"\1", heading)
    spans: list[str] = []

    def keep(m: re.Match[str]) -> str:
        spans.append(m.group(2).strip())
        return f"\x00{len(spans) - 1}\x00"

    text = _CODE_SPAN.sub(keep, heading)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"(\*{1,3})(\S(?:.*?\S)?)\1", r"\2", text)
    text = re.sub(r"(?<![\w\x00])(_{1,3})(\S(?:.*?\S)?)\1(?![\w\x00])", r"\2", text)
    return re.sub(r"\x00(\d+)\x00", lambda m: spans[int(m.group(1))], text).strip()


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, every character but letters, digits, marks,
    ``-``, ``_`` and spaces dropped, spaces as ``-`` (so "POST /v1/runs — submit a run" is
    ``post-v1runs--submit-a-run``)."""
    kept = (
        ch for ch in _plain(heading).lower() if ch in "-_ " or unicodedata.category(ch)[0] in "LNM"
    )
    return "".join(kept).replace(" ", "-")


def headings(markdown: str) -> list[str]:
    """The ATX headings of a page, outside fenced code blocks, in order."""
    found: list[str] = []
    fence: str | None = None
    for line in markdown.splitlines():
        m = _FENCE.match(line)
        if m:
            mark = m.group(1)
            if fence is None:
                fence = mark[0] * len(mark)
            elif mark.startswith(fence):
                fence = None
            continue
        if fence is None:
            h = _HEADING.match(line)
            if h:
                found.append(h.group(2))
    return found


def anchors(markdown: str) -> set[str]:
    """Every heading's anchor; a repeated slug gets ``-1``, ``-2``, … as on GitHub."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for heading in headings(markdown):
        slug = github_slug(heading)
        if slug in seen:
            seen[slug] += 1
            out.add(f"{slug}-{seen[slug]}")
        else:
            seen[slug] = 0
            out.add(slug)
    return out


def _normal(text: str) -> str:
    return " ".join(_plain(text).replace("*", "").split()).casefold()


def heading_names(markdown: str) -> set[str]:
    """The ways a quoted reference may name each heading (see the module's docstring)."""
    names: set[str] = set()
    for heading in headings(markdown):
        whole = _normal(heading)
        names.add(whole)
        names.add(whole.split(":")[0].strip())
        names.add(whole.split(" — ")[-1].strip())
        names.add(re.sub(r"^\d+\.\s+", "", whole))
    return names


@dataclass(frozen=True)
class Page:
    anchors: frozenset[str]
    names: frozenset[str]

    @classmethod
    def of(cls, markdown: str) -> Page:
        return cls(frozenset(anchors(markdown)), frozenset(heading_names(markdown)))


def pages_of(directory: Path) -> dict[str, Page]:
    return {p.stem: Page.of(p.read_text(encoding="utf-8")) for p in sorted(directory.glob("*.md"))}


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def problems(
    where: str, text: str, pages: dict[str, Page], *, page: str | None = None
) -> list[str]:
    """What is wrong with the references of ``text`` (a file shown as ``where``), as
    ``where:line: what`` lines. ``page``: the docs page ``text`` is, whose relative links are
    checked too."""
    found: list[str] = []
    for m in re.finditer(re.escape(SECTION_SIGN), text):
        before = text[max(0, m.start() - 12) : m.start()]
        what = "SPEC reference" if re.search(r"SPEC\s*$", before) else "section sign"
        snippet = text[m.start() : m.end() + 6].split("\n")[0]
        found.append(f"{where}:{_line(text, m.start())}: {what} left: {snippet}")
    for m in _ANCHORED.finditer(text):
        name, anchor = m.group(1), m.group(2)
        if name not in pages:
            found.append(f"{where}:{_line(text, m.start())}: no page docs/{name}.md")
        elif anchor not in pages[name].anchors:
            found.append(
                f"{where}:{_line(text, m.start())}: docs/{name}.md has no heading #{anchor}"
            )
    if page is not None:
        for m in _RELATIVE.finditer(text):
            name = m.group(1)[: -len(".md")] if m.group(1) else page
            if name not in pages:
                continue  # a link outside docs/ (README, a file of the tree) is not a heading's
            if m.group(2) not in pages[name].anchors:
                found.append(
                    f"{where}:{_line(text, m.start())}: {name}.md has no heading #{m.group(2)}"
                )
    for m in _QUOTED.finditer(text):
        name, quoted = m.group(1), _CONTINUATION.sub(" ", m.group(2))
        if name not in pages:
            found.append(f"{where}:{_line(text, m.start())}: no page docs/{name}.md")
        elif _normal(quoted) not in pages[name].names:
            found.append(
                f'{where}:{_line(text, m.start())}: docs/{name}.md has no heading "{quoted}"'
            )
    return found


def scanned_files() -> list[Path]:
    """The files of the tree that may cite the documentation (no hidden directory, no cache)."""
    out = [ROOT / name for name in SCANNED_FILES] + sorted(DOCS.glob("*.md"))
    for top in SCANNED_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            parts = path.relative_to(ROOT / top).parts
            if any(p.startswith(".") or p == "__pycache__" for p in parts) or not path.is_file():
                continue
            # Scripts without a suffix, and every file of what is deployed and of CI.
            whole = top in ("deploy", ".ci") or (top == "scripts" and not path.suffix)
            if path.suffix in SUFFIXES or whole:
                out.append(path)
    return out


# ---------------------------------------------------------------- the checker itself


def test_the_slug_is_githubs() -> None:
    assert github_slug("POST /v1/runs — submit a run") == "post-v1runs--submit-a-run"
    assert github_slug("What a QUEUED run's view explains") == "what-a-queued-runs-view-explains"
    assert github_slug("validate_with and max_attempts") == "validate_with-and-max_attempts"
    assert github_slug("Overview: `/`") == "overview-"
    assert github_slug("Continuous: `retention.days`") == "continuous-retentiondays"
    assert github_slug("GET /v1/runs/{run_id} — the run view") == "get-v1runsrun_id--the-run-view"
    assert github_slug("6. gunicorn") == "6-gunicorn"
    assert github_slug("**Takeover** and _emphasis_") == "takeover-and-emphasis"
    assert github_slug("[Links](other.md) count by their text") == "links-count-by-their-text"


def test_repeated_headings_get_numbered_anchors() -> None:
    md = (
        "# Page\n## Configuration\n```\n# not a heading\n```\n## Configuration\n### Configuration\n"
    )
    assert anchors(md) == {"page", "configuration", "configuration-1", "configuration-2"}


MADE_UP = Page.of(
    "# Made up\n## Lock order\n## Promotion: the request that frees a node promotes\n"
    "## 6. gunicorn\n### PUT /v1/runs/{run_id}/steps/{seq}/blob/{name} — upload an artifact\n"
)


def test_the_checker_finds_what_is_wrong() -> None:
    sign, d = SECTION_SIGN, "docs" + "/"  # so that the scan of this very file finds neither
    text = (
        f'# fine: ({d}made.md#lock-order), ({d}made.md, "Promotion"), {d}made.md "lock\n'
        f'# order", ({d}made.md, "gunicorn") and ({d}made.md, "upload an artifact")\n'
        f"# left over: (SPEC {sign}7a) and {sign}19.9's changed\n"
        f'# wrong: {d}made.md#lock-orders, {d}nowhere.md#x, ({d}made.md, "Locks")\n'
    )
    assert problems("x.py", text, {"made": MADE_UP}) == [
        f"x.py:3: SPEC reference left: {sign}7a) an",
        f"x.py:3: section sign left: {sign}19.9's",
        "x.py:4: docs/made.md has no heading #lock-orders",
        "x.py:4: no page docs/nowhere.md",
        'x.py:4: docs/made.md has no heading "Locks"',
    ]


def test_relative_links_inside_the_docs_are_checked() -> None:
    text = "[a](made.md#lock-order), [b](#6-gunicorn), [c](#nope), [d](../README.md#x)\n"
    assert problems("made.md", text, {"made": MADE_UP}, page="made") == [
        "made.md:1: made.md has no heading #nope"
    ]


# ---------------------------------------------------------------- the tree


def test_the_tree_is_scanned() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in scanned_files()}
    assert {"app/services/queue.py", "docs/design.md", "README.md", "scripts/lint"} <= files
    assert "tests/docs/test_references.py" in files
    assert not any(f.endswith(".png") for f in files)


def test_every_reference_to_the_documentation_holds() -> None:
    pages = pages_of(DOCS)
    assert {"design", "queue", "contract", "api"} <= pages.keys()
    found: list[str] = []
    for path in scanned_files():
        rel = path.relative_to(ROOT).as_posix()
        page = path.stem if path.parent == DOCS else None
        found += problems(rel, path.read_text(encoding="utf-8"), pages, page=page)
    assert found == [], "\n" + "\n".join(found)
