"""What an upstream says, checked before any of it is served: its resources, templates, read types and completions.

An upstream is another party, and its values reach our clients, our log and the console's HTTP headers. An entry
whose identity cannot be served as it is (a URI or URI template with control characters or longer than
`MAX_URI_CHARS`, a URI or template listed a second time) is left out; display text (name, title, description)
loses its control characters (each becomes U+FFFD; a description keeps its line breaks and tabs) and is cut to a
bound; a mimeType that is not a media type (RFC 9110, at most `MAX_MIME_CHARS`) is dropped. Each kind of defect is
logged once per source, with one example (escaped and cut short), never once per entry.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import mcp_types as types

from aggregator.upstream.answers import ListedResource

__all__ = ["MAX_DESCRIPTION_CHARS", "MAX_MIME_CHARS", "MAX_NAME_CHARS", "MAX_URI_CHARS", "UpstreamValues",
           "is_media_type"]

logger = logging.getLogger("aggregator.upstream")

MAX_URI_CHARS = 8192
"""Longer URIs and URI templates are left out (what common HTTP servers accept in a request line)."""
MAX_NAME_CHARS = 1024
"""Names and titles are cut to this many characters."""
MAX_DESCRIPTION_CHARS = 16384
"""Descriptions are cut to this many characters."""
MAX_MIME_CHARS = 255
"""Longer mimeTypes are dropped."""
MAX_COMPLETION_CHARS = 1024
"""Longer completion values are left out."""
KEPT_MEDIA_TYPES = 64
"""Valid mimeTypes remembered per upstream, not checked again."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # \t and \n are text in a description
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[\t !#-\[\]-~]|\\[\t -~])*"'
_MEDIA_TYPE = re.compile(rf"{_TOKEN}/{_TOKEN}(?:[ \t]*;[ \t]*(?:{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))?)*")
_CUT = "\u2026"

Item = TypeVar("Item", ListedResource, types.ResourceTemplate)


def is_media_type(value: str) -> bool:
    """Whether `value` is a media type with optional parameters, as an HTTP header may carry it (RFC 9110 8.3.1)."""
    return len(value) <= MAX_MIME_CHARS and _MEDIA_TYPE.fullmatch(value) is not None


class UpstreamValues:
    """The checks for one upstream, remembering which kinds of defect it has already been logged for."""

    def __init__(self, label: str) -> None:
        self.label = label
        """Who the log names: the upstream and the source id."""
        self._said: set[str] = set()
        self._media_types: set[str] = set()
        """mimeTypes found valid already (at most `KEPT_MEDIA_TYPES`)."""

    def resources(self, items: Iterable[ListedResource]) -> list[ListedResource]:
        """The servable resources of a listing, in order: the first of each URI, display text cleaned."""
        return self._entries(items, "uri", "resource")

    def templates(self, items: Iterable[types.ResourceTemplate]) -> list[types.ResourceTemplate]:
        """The servable templates of a listing, in order: the first of each template, display text cleaned."""
        return self._entries(items, "uri_template", "template")

    def mime_type(self, value: str | None) -> str | None:
        """`value` if it is a media type, else None (the entry or content is then typed as if it gave none)."""
        if value is None or value in self._media_types:  # an upstream's reads carry a few types, again and again
            return value
        if is_media_type(value):
            if len(self._media_types) < KEPT_MEDIA_TYPES:
                self._media_types.add(value)
            return value
        self.said("mimeType(s) dropped: not a media type", value)
        return None

    def completions(self, values: Sequence[object]) -> list[str]:
        """The completion values that are short strings without control characters."""
        kept = [v for v in values if isinstance(v, str) and len(v) <= MAX_COMPLETION_CHARS and not _CONTROL.search(v)]
        if len(kept) < len(values):
            self.said("completion value(s) left out: control characters, too long or not text",
                      next(v for v in values if v not in kept))
        return kept

    def _entries(self, items: Iterable[Item], key: str, what: str) -> list[Item]:
        """`items` without those whose `key` (the URI or URI template) cannot be served, nor repeats."""
        seen: set[str] = set()
        kept: list[Item] = []
        nouns = "URIs" if what == "resource" else "URI templates"
        for item in items:
            identity: str = getattr(item, key)
            if _CONTROL.search(identity):
                self.said(f"{what}(s) left out: control characters in {nouns}", identity)
            elif len(identity) > MAX_URI_CHARS:
                self.said(f"{what}(s) left out: {nouns} longer than {MAX_URI_CHARS} characters", identity)
            elif identity in seen:
                self.said(f"{what}(s) left out: the upstream lists one twice (the first is kept)", identity)
            else:
                seen.add(identity)
                kept.append(self._cleaned(item))
        return kept

    def _cleaned(self, item: Item) -> Item:
        """`item` with its display text cleaned and bounded and its mimeType kept only if it is a media type."""
        changes: dict[str, Any] = {}
        for field, limit in (("name", MAX_NAME_CHARS), ("title", MAX_NAME_CHARS),
                             ("description", MAX_DESCRIPTION_CHARS)):
            value = getattr(item, field)
            if value is not None and (text := self._text(value, limit, field == "description")) != value:
                changes[field] = text
        mime = self.mime_type(item.mime_type)
        if mime != item.mime_type:
            changes["mime_type"] = mime
        if not changes:
            return item
        if isinstance(item, ListedResource):
            return replace(item, **changes)
        return item.model_copy(update=changes)

    def _text(self, value: str, limit: int, lines: bool) -> str:
        """`value` without control characters (but line breaks and tabs, with `lines`), cut to `limit`."""
        if lines:
            value = value.replace("\r\n", "\n")
        control = _CONTROL_BUT_LINES if lines else _CONTROL
        if control.search(value):
            self.said("control characters in names, titles or descriptions replaced by U+FFFD", value)
            value = control.sub("\ufffd", value)
        if len(value) > limit:
            self.said(f"names or titles cut to {MAX_NAME_CHARS} characters, descriptions to "
                      f"{MAX_DESCRIPTION_CHARS}", value)
            value = value[:limit - 1] + _CUT
        return value

    def said(self, defect: str, example: object = None) -> None:
        """Log `defect` (with an example, escaped and cut short) the first time this upstream shows it."""
        if defect in self._said:
            return
        self._said.add(defect)
        if example is None:
            logger.warning("%s: %s", self.label, defect)
            return
        shown = repr(example)
        logger.warning("%s: %s, e.g. %s", self.label, defect, shown if len(shown) <= 80 else shown[:77] + "...")
