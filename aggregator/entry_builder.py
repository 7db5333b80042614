"""A collection's entry for one file (`EntryBuilder`): its URI, name and title from the collection's patterns, its
type from its name. The builder is also the `RowMaker` of the collection's compact rows (`catalog_rows`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from aggregator.catalog_rows import NO_SIZE
from aggregator.content import file_mime_type, served_name
from aggregator.documents.formats import CONVERTED_MIME_TYPES, converted
from aggregator.entry import Entry
from aggregator.manifest.model import CollectionSpec
from aggregator.manifest.placeholders import FILE_PLACEHOLDERS, PLACEHOLDER
from aggregator.paths import display_text, has_raw_bytes, is_servable, uri_path
from aggregator.sources import FileInfo

__all__ = ["EntryBuilder"]


_URI_SAFE = re.compile(r"[A-Za-z0-9._~/-]*")


def _uri_quote(value: str, safe: str) -> str:
    return value if _URI_SAFE.fullmatch(value) and (safe or "/" not in value) else uri_path(value, safe)


class _Pattern:
    """A collection pattern over {path}, {name}, {stem} and {ext}, compiled once for all of its files."""

    __slots__ = ("template", "keys")

    def __init__(self, text: str) -> None:
        keys = [k for k in PLACEHOLDER.findall(text) if k in FILE_PLACEHOLDERS]
        # Any brace that is not a known placeholder is literal text: double it for str.format.
        escaped = re.sub(r"\{(?:path|name|stem|ext)\}|[{}]", lambda m: m.group(0) if len(m.group(0)) > 1 else m.group(0) * 2, text)
        self.template = escaped
        self.keys = frozenset(keys)

    def fill(self, values: Mapping[str, str]) -> str:
        return self.template.format_map(values)

    def around_path(self) -> tuple[str, str] | tuple[None, None]:
        """(prefix, suffix) when the pattern is `prefix{path}suffix` ({path} once, no other placeholder), so a
        path's text sits unchanged between the two; else (None, None)."""
        if self.keys != {"path"}:
            return None, None
        parts = self.fill({"path": "\0"}).split("\0")
        return (parts[0], parts[1]) if len(parts) == 2 else (None, None)




def _file_values(path: str, keys: frozenset[str], encode: bool) -> dict[str, str]:
    """The placeholder values of one file, percent-encoded for URIs when `encode` (only the keys needed)."""
    name = path.rsplit("/", 1)[-1]
    values = {"path": path, "name": name}
    if "stem" in keys or "ext" in keys:
        stem, dot, ext = name.rpartition(".")
        values["stem"], values["ext"] = (stem, ext) if dot and stem else (name, "")
    if encode:
        return {k: _uri_quote(v, "/" if k == "path" else "") for k, v in values.items() if k in keys}
    return values


class EntryBuilder:
    """Builds a collection's entry for one file; its patterns are compiled once for all of the collection's files.
    It is also the `RowMaker` of the collection's compact rows (`catalog_rows`): when the URI pattern is
    `prefix{path}suffix`, a file whose path needs no percent-encoding is kept as its URI, size and mtime, and its
    entry is built again from them by the same code."""

    __slots__ = ("spec", "source", "access", "_uri", "_name", "_title", "_raw_keys", "_mime_by_ext", "_prefix",
                 "_suffix", "_compact", "_plain_name", "_plain", "row_formats")

    def __init__(self, spec: CollectionSpec) -> None:
        self.spec = spec
        self.source, self.access = spec.source, spec.access
        self._uri, self._name = _Pattern(spec.uri), _Pattern(spec.name)
        self._title = _Pattern(spec.display.title) if spec.display.title else None
        self._raw_keys = self._name.keys | (self._title.keys if self._title else frozenset())
        self._mime_by_ext: dict[str, str | None] = {}
        prefix, suffix = self._uri.around_path()
        self._compact = prefix is not None
        self._prefix: str = prefix or ""
        self._suffix: str = suffix or ""
        self._plain_name = self._title is None and self._name.template == "{path}"
        # A compact row's entry is then its path, the type its extension says and the collection's constants.
        self._plain = self._plain_name and not spec.decompress and spec.convert is None
        self.row_formats: dict[tuple[str | None, bool, bool], Any] = {}
        """Each kind of compact row's item, encoded with slots (made and read by `listing_json`): they live as long
        as the collection's builder, a handful a collection."""

    @property
    def listing_key(self) -> tuple[object, ...]:
        """What a compact row's listed fields depend on besides its columns (`RowMaker.listing_key`)."""
        spec = self.spec
        return spec.source, spec.uri, spec.name, spec.display, spec.access, spec.decompress, spec.convert

    @property
    def uri_space(self) -> tuple[str, str, str] | None:
        """(source, prefix, suffix) of its compact rows, or None when its URI pattern makes none (`RowMaker`)."""
        return (self.source, self._prefix, self._suffix) if self._compact else None

    def entry(self, info: FileInfo) -> Entry | None:
        """The entry `info` lists; None when its name could never be read back (listing it would promise what
        reads refuse)."""
        return self.file_entry(info.path, info.size, info.mtime, info.mime_type)

    def file_entry(self, path: str, size: int | None, mtime: float | None, mime: str | None = None) -> Entry | None:
        """`entry` of a file's facts."""
        if not is_servable(path):
            return None
        return self._made(self._uri.fill(_file_values(path, self._uri.keys, encode=True)), path, size, mtime, mime)

    def compact_uri(self, path: str) -> str | None:
        """The URI of `path` when its row is compact: the pattern is `prefix{path}suffix` and the path is servable
        and needs no percent-encoding (then the URI gives the path back). None otherwise."""
        if self._compact and len(path) <= _MAX_COMPACT and _COMPACT_PATH.fullmatch(path):
            return f"{self._prefix}{path}{self._suffix}"
        return None

    def path_of(self, uri: str) -> str:
        """The path of a compact row's URI."""
        return uri[len(self._prefix): len(uri) - len(self._suffix)]

    def row_entry(self, uri: str, size: int | None, mtime: float | None) -> Entry:
        """The entry of a compact row: what `entry` built for that file when it was listed. Every page and read
        of a listed file builds one: the common case is kept to a few C calls."""
        path = uri[len(self._prefix): len(uri) - len(self._suffix)]
        if not self._plain:
            return self._made(uri, path, size, mtime, None)
        spec = self.spec
        # The named tuple's fields in order (`_make` skips its keyword-taking __new__): a compact path is ASCII, so
        # it is its own display name.
        return Entry._make((uri, path, spec.display, None, self.row_mime(path), size, mtime, spec.source, path, None,
                            spec.access, None, False, None))

    def plain_bounds(self) -> tuple[str, str] | None:
        """(prefix, suffix) around the path in a compact row's URI when the row's entry is *plain*: named by its path
        (unreserved ASCII, `_COMPACT_PATH`), untitled, typed by `row_mime`, and otherwise only its size, its mtime
        and what every entry of the collection shares; None when it is not."""
        return (self._prefix, self._suffix) if self._plain and self._compact else None

    def row_mime(self, path: str) -> str | None:
        """The type of a plain compact row's entry (`plain_bounds`) at `path`: the declared one, else its name's."""
        mime = self.spec.display.mime_type
        if mime is None:
            dot = path.rfind(".")
            ext = path[dot:] if dot > path.rfind("/") else ""
            mime = self._mime_by_ext[ext] if ext in self._mime_by_ext else self._mime_of(path, ext)
        return mime

    def row_entries(self, uris: Sequence[str], sizes: Sequence[int], mtimes: Sequence[float]) -> list[Entry]:
        """`row_entry` of each compact row (columns as `catalog_rows` keeps them): a page's worth in one loop."""
        if not self._plain:
            return [self.row_entry(uri, None if size == NO_SIZE else size, None if mtime != mtime else mtime)
                    for uri, size, mtime in zip(uris, sizes, mtimes)]
        spec = self.spec
        display, declared, source, access = spec.display, spec.display.mime_type, spec.source, spec.access
        start, end, by_ext = len(self._prefix), len(self._suffix), self._mime_by_ext
        make = Entry._make
        out: list[Entry] = []
        add = out.append
        last_ext, last_mime = "\0", declared  # a page's files mostly share one extension: one endswith each
        for uri, size, mtime in zip(uris, sizes, mtimes):
            path = uri[start: len(uri) - end]
            mime = declared
            if mime is None:
                if path.endswith(last_ext):  # ".md": then its dot is the last one, after the last '/'
                    mime = last_mime
                else:
                    dot = path.rfind(".")
                    ext = path[dot:] if dot > path.rfind("/") else ""
                    mime = by_ext[ext] if ext in by_ext else self._mime_of(path, ext)
                    if ext:
                        last_ext, last_mime = ext, mime
            add(make((uri, path, display, None, mime, None if size == NO_SIZE else size,
                      None if mtime != mtime else mtime, source, path, None, access, None, False, None)))
        return out

    def _mime_of(self, path: str, ext: str) -> str | None:
        mime = self._mime_by_ext[ext] = file_mime_type(path, None, False)
        return mime

    def _made(self, uri: str, path: str, size: int | None, mtime: float | None, mime: str | None) -> Entry:
        spec = self.spec
        if self._plain_name:
            name, title = display_text(path), None
        else:
            raw = _file_values(path, self._raw_keys, encode=False)
            if has_raw_bytes(path):
                raw = {k: display_text(v) for k, v in raw.items()}
            name, title = self._name.fill(raw), self._title.fill(raw) if self._title else None
        decompress = spec.decompress
        mime = spec.display.mime_type or mime
        if mime is None:
            # file_mime_type is the one decision; its answer depends only on the last suffix of the served name.
            named = served_name(path, decompress)
            ext = named[named.rfind("."):] if "." in named.rsplit("/", 1)[-1] else ""
            if ext in self._mime_by_ext:
                mime = self._mime_by_ext[ext]
            else:
                mime = self._mime_by_ext[ext] = file_mime_type(path, None, decompress)
        convert = converted(path, decompress, spec.convert) if spec.convert is not None else None
        if convert is not None:  # served as Markdown; its size is known only once converted
            mime = CONVERTED_MIME_TYPES[convert.to]
        return Entry(uri, name, spec.display, title, mime, None if convert else size, mtime, spec.source, path,
                     access=spec.access, decompress=decompress, convert=convert)


_MAX_COMPACT = 4096  # safe_relpath's longest path
_SEGMENT = r"(?!\.\.?(?:/|$))[A-Za-z0-9._~-]+"
_COMPACT_PATH = re.compile(f"{_SEGMENT}(?:/{_SEGMENT})*")
"""Paths a compact row can hold: `safe_relpath` accepts them (no empty, '.' or '..' segment, no control character,
backslash, colon or percent sign) and percent-encoding leaves them as they are (only unreserved characters)."""
