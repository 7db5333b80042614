"""Markdown written within a character budget: once it is spent, the text ends with a note saying where it was cut
and which limit cut it, so a model (and its user) knows the document goes on."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["Budget", "cell", "table"]


class Budget:
    """Markdown parts joined by blank lines, at most `max_chars` characters of them (notes excluded)."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._parts: list[str] = []
        self._used = 0
        self.full = False
        self._notes: list[str] = []

    def add(self, text: str) -> bool:
        """Append a block; False once the budget is spent (the block is cut to fit and a note added)."""
        if self.full:
            return False
        text = text.strip("\n")
        if not text:
            return True
        room = self.max_chars - self._used
        if len(text) > room:
            self._parts.append(text[:room])
            self._used = self.max_chars
            self.full = True
            self._notes.append(f"[... cut at {self.max_chars} characters: limit convert.maxChars]")
            return False
        self._parts.append(text)
        self._used += len(text) + 2
        return True

    def note(self, text: str) -> None:
        """A line said after the content (where a page, slide or row limit stopped it)."""
        self._notes.append(text)

    def text(self) -> str:
        return "\n\n".join(self._parts + self._notes) + "\n"


def cell(value: object) -> str:
    """A value as one Markdown table cell: no line breaks, pipes escaped."""
    if value is None:
        return ""
    text = str(value)
    return " ".join(text.split()).replace("|", "\\|") if text else ""


def table(rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table, its first row the header; short rows padded to the widest."""
    cells = [[cell(v) for v in row] for row in rows]
    if not cells:
        return ""
    width = max(len(row) for row in cells)
    if not any(any(row) for row in cells):  # a layout grid with nothing in it says nothing
        return ""
    padded = [row + [""] * (width - len(row)) for row in cells]
    lines = ["| " + " | ".join(padded[0]) + " |", "|" + " --- |" * width]
    lines += ["| " + " | ".join(row) + " |" for row in padded[1:]]
    return "\n".join(lines)
