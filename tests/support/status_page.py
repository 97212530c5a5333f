"""Reading the status page's HTML as a person would see it: the text of each row of a kind,
by the run or node it shows."""

from __future__ import annotations

from html.parser import HTMLParser

VOID = {"br", "meta", "img", "input", "link", "hr"}


class _Rows(HTMLParser):
    def __init__(self, cls: str) -> None:
        super().__init__()
        self.cls = cls
        self.rows: dict[str, str] = {}
        self._key: str | None = None
        self._depth = 0
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in VOID:
            return
        if self._key is not None:
            self._depth += 1
            return
        a = dict(attrs)
        if self.cls in (a.get("class") or "").split():
            self._key = a.get("data-run") or a.get("data-node") or ""
            self._depth = 1
            self._text = []

    def handle_endtag(self, tag: str) -> None:
        if self._key is None or tag in VOID:
            return
        self._depth -= 1
        if self._depth == 0:
            self.rows[self._key] = " ".join(" ".join(self._text).split())
            self._key = None

    def handle_data(self, data: str) -> None:
        if self._key is not None:
            self._text.append(data)


def rows(html: str, cls: str) -> dict[str, str]:
    """``{data-run or data-node: the row's text, whitespace folded}`` of the rows of class ``cls``
    (queued-run, running-run, node, ask, finished-run), in page order."""
    parser = _Rows(cls)
    parser.feed(html)
    return parser.rows


def element_text(html: str, element_id: str) -> str:
    start = html.index(f'id="{element_id}"')
    return html[html.index(">", start) + 1 : html.index("<", start)].strip()
