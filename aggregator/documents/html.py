"""HTML -> Markdown with the standard library's html.parser (no dependency, no network, no script run): headings,
paragraphs, list items, preformatted blocks, links (http, https, mailto) and tables; script, style, head and other
invisible parts are dropped. html.parser keeps no tree and never recurses, so deep nesting costs nothing."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from aggregator.documents.markdown import Budget, table
from aggregator.manifest.model import ConvertSettings

__all__ = ["html_to_markdown"]

_HIDDEN = {"script", "style", "head", "template", "noscript", "svg", "iframe", "object", "title"}
_BLOCKS = {"p", "div", "section", "article", "main", "header", "footer", "nav", "aside", "blockquote", "ul", "ol",
           "dl", "dt", "dd", "figure", "figcaption", "form", "hr", "br", "body", "html", "address"}
_HEADINGS = {f"h{n}": n for n in range(1, 7)}
_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_-]+)""", re.I)


def html_to_markdown(data: bytes, limits: ConvertSettings) -> str:
    found = _CHARSET.search(data[:4096])
    try:
        text = data.decode(found.group(1).decode() if found else "utf-8", "replace")
    except LookupError:  # an unknown charset name
        text = data.decode("utf-8", "replace")
    writer = _Writer(Budget(limits.max_chars), limits.max_rows)
    writer.feed(text)
    writer.close()
    return writer.out.text()


class _Writer(HTMLParser):
    def __init__(self, out: Budget, max_rows: int) -> None:
        super().__init__(convert_charrefs=True)
        self.out = out
        self.max_rows = max_rows
        self.rows = 0
        self._line: list[str] = []
        self._prefix = ""
        self._hidden = 0
        self._pre = 0
        self._href: str | None = None
        self._table: list[list[str]] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _HIDDEN:
            self._hidden += 1
        elif self._hidden:
            return
        elif tag in _HEADINGS:
            self._flush()
            self._prefix = "#" * _HEADINGS[tag] + " "
        elif tag == "li":
            self._flush()
            self._prefix = "- "
        elif tag == "pre":
            self._flush()
            self._pre += 1
        elif tag == "a":
            href = dict(attrs).get("href") or ""
            self._href = href if href.startswith(("http://", "https://", "mailto:")) else None
            if self._href:
                self._text("[")
        elif tag == "table":
            self._flush()
            self._table = []
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = []
        elif tag in _BLOCKS:
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        if tag in _HIDDEN:
            self._hidden = max(0, self._hidden - 1)
        elif self._hidden:
            return
        elif tag == "a" and self._href:
            self._text(f"]({self._href})")
            self._href = None
        elif tag == "pre":
            self._pre = max(0, self._pre - 1)
            body = "".join(self._line).strip("\n")
            self._line = []
            if body:
                self._add(f"```\n{body}\n```")
        elif tag in ("td", "th") and self._table is not None and self._cell is not None:
            if self._table:
                self._table[-1].append("".join(self._cell))
            self._cell = None
        elif tag == "table" and self._table is not None:
            rows, self._table = self._table, None
            room = max(0, self.max_rows - self.rows)
            if len(rows) > room:
                self.out.note(f"[... table cut after {self.max_rows} rows: limit convert.maxRows]")
            self.rows += min(len(rows), room)
            self._add(table([r for r in rows[:room] if r]))
        elif tag in _HEADINGS or tag == "li" or tag in _BLOCKS:
            self._flush()

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self._text(data)

    def _text(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        elif self._pre:
            self._line.append(data)
        elif self._table is None:
            self._line.append(data)

    def _flush(self) -> None:
        if self._pre:
            return
        text = " ".join("".join(self._line).split())
        self._line = []
        if text:
            self._add(self._prefix + text)
        self._prefix = ""

    def _add(self, text: str) -> None:
        if text:
            self.out.add(text)  # past maxChars it adds nothing: the rest is parsed (within maxInputBytes) unwritten

    def close(self) -> None:
        super().close()
        self._flush()
