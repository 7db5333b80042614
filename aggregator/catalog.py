"""The catalog: an immutable snapshot of what a manifest lists and which templates it answers.

Entries are kept sorted by URI. A cursor names the last URI a page returned, so listing costs O(page)
and a cursor keeps working after the catalog is rebuilt (it resumes at the next URI in the new order).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
import time

import anyio

from aggregator.content import file_mime_type, is_gzip_name, served_name
from aggregator.errors import InvalidCursor, ResourceNotFound
from aggregator.manifest.model import (
    CollectionSpec,
    Display,
    Location,
    Manifest,
    ManifestError,
    ManifestIssue,
    Render,
    ResourceSpec,
    TemplateSpec,
)
from aggregator.paths import UnsafePath, display_text, has_raw_bytes, is_servable, safe_relpath, uri_path
from aggregator.sources import FileInfo, Source, SourceError, SourceNotFound
from aggregator.templates import UriTemplate

__all__ = ["Catalog", "Entry", "Page", "Target", "TemplateEntry", "compile_catalog"]

logger = logging.getLogger("aggregator.catalog")

_CURSOR_PREFIX = b"c1:"
_QUERY_TYPES = {"json": "application/json", "csv": "text/csv", "markdown": "text/markdown"}
_PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_.]+)\}")
FILE_MTIME = "file"  # `annotations: {lastModified: file}`: list each file's modification time
RENDERED_TYPE = "text/markdown"  # what rendered resources are unless the manifest says otherwise
_MAX_VIEWS = 64  # distinct caller scope sets whose filtered listing is kept per catalog


@dataclass(frozen=True, slots=True)
class Entry:
    """One listed resource. `display` is shared by every entry of a collection; per-file facts sit beside it."""

    uri: str
    name: str
    display: Display
    title: str | None = None
    mime_type: str | None = None
    size: int | None = None
    mtime: float | None = None
    source: str | None = None
    path: str | None = None
    text: str | None = None
    access: frozenset[str] = frozenset()
    """Scopes a caller needs to see or read this entry."""
    render: Render | None = None
    """A Jinja2 template (from the manifest) that produces the content."""
    decompress: bool = False
    """Served decompressed when the file's name ends in `.gz` (the manifest's `decompress: true`)."""

    @property
    def last_modified(self) -> str | None:
        """The manifest's `lastModified`, else the file's modification time (ISO 8601, UTC): what renders see."""
        annotations = self.display.annotations
        if annotations is not None and annotations.last_modified not in (None, FILE_MTIME):
            return annotations.last_modified
        return iso_time(self.mtime)

    @property
    def listed_last_modified(self) -> str | None:
        """The `lastModified` resources/list shows: only what the manifest asks for (a time, or `file`)."""
        annotations = self.display.annotations
        if annotations is None or annotations.last_modified is None:
            return None
        return iso_time(self.mtime) if annotations.last_modified == FILE_MTIME else annotations.last_modified


@dataclass(frozen=True, slots=True)
class TemplateEntry:
    template: UriTemplate
    spec: TemplateSpec

    @property
    def uri_template(self) -> str:
        return self.template.text


@dataclass(frozen=True, slots=True)
class Target:
    """What a URI resolves to: a file of a source, or inline text."""

    uri: str
    mime_type: str | None
    source: str | None = None
    path: str | None = None
    text: str | None = None
    mime_declared: bool = False
    """True when the manifest names the type; otherwise it was guessed and a backend's Content-Type wins."""
    query: str | None = None
    """SQL sources: the template's query, run with `params` bound."""
    params: tuple[tuple[str, str | None], ...] = ()
    format: str = "json"
    access: frozenset[str] = frozenset()
    """Scopes a caller needs to read it."""
    render: Render | None = None
    """A Jinja2 template producing the content, with `params` as its variables."""
    decompress: bool = False
    """The read decompresses: the entry says `decompress: true` and the file's name ends in `.gz`."""


@dataclass(frozen=True, slots=True)
class Page:
    items: Sequence[Entry] | Sequence[TemplateEntry]
    next_cursor: str | None


class Catalog:
    """Listed entries in URI order, templates in match order, and lookup of both."""

    def __init__(self, entries: Sequence[Entry], templates: Sequence[TemplateEntry], generation: int = 1,
                 url_sources: Mapping[str, bool] | None = None, byte_sources: frozenset[str] = frozenset()) -> None:
        self.generation = generation
        # Sources whose paths are URL paths: template values get percent-encoded into them.
        self._url_sources = dict(url_sources or {})
        # Sources whose names are bytes (local folders): a %XX that is not UTF-8 in a URI names those bytes.
        self._byte_sources = byte_sources
        # Entries each collection produced (by collection_key) and when they were listed (time.monotonic()),
        # for reloads that can reuse them.
        self.collections: dict[CollectionSpec, list[Entry]] = {}
        self.listed_at: dict[CollectionSpec, float] = {}
        self.entries: tuple[Entry, ...] = tuple(sorted(entries, key=lambda e: e.uri))
        self._uris = [e.uri for e in self.entries]
        self._index = {e.uri: e for e in self.entries}
        self._views: dict[frozenset[str], tuple[tuple[Entry, ...], list[str]]] = {}
        self.templates: tuple[TemplateEntry, ...] = tuple(sorted(templates, key=lambda t: t.uri_template))
        # The most literal template wins; ties go to the one with fewer variables, then manifest order.
        self._match_order = tuple(
            sorted(self.templates, key=lambda t: (-t.template.literal_length, len(t.template.variables)))
        )
        # Templates by the literal text before their first expression, so a URI is tried only against templates
        # it could match: the cost of a read does not grow with the number of templates.
        self._rank = {id(t): i for i, t in enumerate(self._match_order)}
        self._by_prefix: dict[str, list[TemplateEntry]] = {}
        for t in self._match_order:
            self._by_prefix.setdefault(t.uri_template.split("{", 1)[0], []).append(t)
        self._prefix_lengths = sorted({len(p) for p in self._by_prefix}, reverse=True)

    def __len__(self) -> int:
        return len(self.entries)

    def targets(self) -> set[tuple[str, str]]:
        """(source, path) of every listed file."""
        return {(e.source, e.path) for e in self.entries if e.source is not None and e.path is not None}

    def entries_for(self, source: str, paths: set[str]) -> list[Entry]:
        return [e for e in self.entries if e.source == source and e.path in paths]

    @cached_property
    def listing_signature(self) -> tuple[object, ...]:
        """Everything resources/list and resources/templates/list show: equal signatures, equal listings."""
        return (tuple((e.uri, e.name, e.title, e.display, e.mime_type, e.size, e.listed_last_modified)
                      for e in self.entries),
                tuple((t.uri_template, t.spec.name, t.spec.display) for t in self.templates))

    def get(self, uri: str) -> Entry | None:
        return self._index.get(uri)

    @cached_property
    def restricted(self) -> bool:
        """Whether any entry or template needs scopes (then listings depend on who asks)."""
        return any(e.access for e in self.entries) or any(t.spec.access for t in self.templates)

    def page(self, cursor: str | None, limit: int, scopes: frozenset[str] | None = None) -> Page:
        """Up to `limit` entries after `cursor` that a caller holding `scopes` may see (None: every entry);
        InvalidCursor if the cursor was not made by a catalog."""
        entries, uris = self._view(scopes)
        return _paginate(entries, uris, cursor, limit)

    def template_page(self, cursor: str | None, limit: int, scopes: frozenset[str] | None = None) -> Page:
        templates = [t for t in self.templates if scopes is None or t.spec.access <= scopes]
        return _paginate(templates, [t.uri_template for t in templates], cursor, limit)

    def _candidates(self, uri: str) -> list[TemplateEntry]:
        """Templates whose literal start `uri` has, in match order."""
        found: list[TemplateEntry] = []
        for length in self._prefix_lengths:
            if length <= len(uri):
                found += self._by_prefix.get(uri[:length], ())
        if len(found) > 1:
            found.sort(key=lambda t: self._rank[id(t)])
        return found

    def under(self, prefix: str, scopes: frozenset[str] | None = None) -> Sequence[Entry]:
        """Listed entries whose URI starts with `prefix` that a caller holding `scopes` may see; O(log n + found)."""
        entries, uris = self._view(scopes)
        start = bisect.bisect_left(uris, prefix)
        end = start
        while end < len(uris) and uris[end].startswith(prefix):
            end += 1
        return entries[start:end]

    def visible(self, scopes: frozenset[str] | None = None) -> tuple[Sequence[Entry], list[str]]:
        """The entries a caller holding `scopes` may see, in URI order, and their URIs (for bisecting)."""
        return self._view(scopes)

    def _view(self, scopes: frozenset[str] | None) -> tuple[Sequence[Entry], list[str]]:
        """The entries a scope set may see, filtered once per catalog and scope set, so pages stay O(page)."""
        if scopes is None or not self.restricted:
            return self.entries, self._uris
        view = self._views.get(scopes)
        if view is None:
            if len(self._views) >= _MAX_VIEWS:
                self._views.pop(next(iter(self._views)))
            visible = tuple(e for e in self.entries if e.access <= scopes)
            view = self._views[scopes] = (visible, [e.uri for e in visible])
        return view

    def resolve(self, uri: str) -> Target:
        """What `uri` names; ResourceNotFound for unknown URIs and for any refused as unsafe."""
        entry = self._index.get(uri)
        if entry is not None:
            return Target(uri, entry.mime_type, entry.source, entry.path, entry.text,
                          entry.display.mime_type is not None, access=entry.access, render=entry.render,
                          decompress=entry.decompress and entry.path is not None
                          and is_gzip_name(self._file_name(entry.source, entry.path)))
        for candidate in self._candidates(uri):
            spec = candidate.spec
            # File paths keep undecodable bytes (surrogate escapes); values that are data stay valid Unicode.
            is_file = spec.render is None and spec.query is None
            values = candidate.template.match(uri, "surrogateescape" if is_file else "replace")
            if values is None:
                continue
            if spec.render is not None:
                # Values reach the template as data only.
                params = tuple((name, _hashable(values.get(name))) for name in candidate.template.variables)
                return Target(uri, spec.display.mime_type or RENDERED_TYPE, None, None, mime_declared=True,
                              params=params, access=spec.access, render=spec.render)
            if spec.query is not None:
                # Values are bound as query parameters, never spliced into SQL or paths.
                params = tuple((name, _joined(values.get(name))) for name in candidate.template.variables)
                return Target(uri, spec.display.mime_type or _QUERY_TYPES[spec.format], spec.source, None,
                              mime_declared=True, query=spec.query, params=params, format=spec.format,
                              access=spec.access)
            # A match refused for safety never falls through to a looser template.
            url_path = self._url_sources.get(candidate.spec.source, False)
            path = expand_path(candidate, values, url_path, candidate.spec.source in self._byte_sources)
            if path is None:
                raise ResourceNotFound(uri)
            declared = candidate.spec.display.mime_type
            named = self._file_name(spec.source, path)
            return Target(uri, file_mime_type(named, declared, spec.decompress), candidate.spec.source, path,
                          mime_declared=declared is not None, access=spec.access,
                          decompress=spec.decompress and is_gzip_name(named))
        raise ResourceNotFound(uri)

    def _file_name(self, source: str | None, path: str) -> str:
        """The file a source path names: only a URL path has a query to leave out (in a folder `what?#frag.md` is
        a file name)."""
        return path.split("?", 1)[0] if self._url_sources.get(source or "", False) else path


def _joined(value: object) -> str | None:
    """A matched value as one string: exploded lists are comma-joined (SQL binds scalars)."""
    return ",".join(value) if isinstance(value, list) else value  # type: ignore[return-value]


def _hashable(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


def expand_path(entry: TemplateEntry, values: Mapping[str, str | list[str]], url_path: bool = False,
                byte_names: bool = False) -> str | None:
    """Fill a template's source path from matched values; None if any value is unsafe.

    For URL sources each value is checked as a path, then percent-encoded (raw bytes included), so it can never
    add a query parameter, a fragment or another host. A value may not start a hidden segment (`.env`, `.git/`)
    unless the template says `hidden: true`; a dot the manifest's `path` spells itself is the author's choice.
    Undecodable bytes (surrogate escapes) are kept only for sources whose names are bytes, or URL paths.
    """
    template, spec = entry.template, entry.spec
    assert spec.path is not None
    out: list[str] = []
    pos = 0
    try:
        for m in _PLACEHOLDER.finditer(spec.path):
            out.append(spec.path[pos : m.start()])
            pos = m.end()
            name = m.group(1)
            value = values.get(name)
            if isinstance(value, list):  # an exploded {/segments*}: the segments make a relative path
                value = "/".join(value)
            if not value:
                raise UnsafePath(f"missing value for {name}")
            multi = name in template.multi_segment
            if not multi and "/" in value:
                raise UnsafePath(f"'/' in single-segment variable {name}")
            if not spec.hidden and ("/." in value or (value.startswith(".") and _at_segment_start(out))):
                raise UnsafePath(f"hidden name in {name}")
            if not (byte_names or url_path) and has_raw_bytes(value):
                raise UnsafePath(f"bytes that are not UTF-8 in {name}")
            if url_path:
                safe_relpath(value)
                value = uri_path(value, "/" if multi else "")
            out.append(value)
        out.append(spec.path[pos:])
        filled = "".join(out)
        if url_path:
            path, _, query = filled.partition("?")
            return safe_relpath(path) + ("?" + query if query else "")
        return safe_relpath(filled)
    except UnsafePath:
        return None


def _at_segment_start(parts: list[str]) -> bool:
    """Whether text appended to `parts` starts a path segment."""
    for part in reversed(parts):
        if part:
            return part.endswith("/")
    return True


def encode_cursor(key: str) -> str:
    return base64.urlsafe_b64encode(_CURSOR_PREFIX + key.encode("utf-8")).decode("ascii")


def decode_cursor(cursor: str) -> str:
    try:
        raw = base64.urlsafe_b64decode(cursor.encode("ascii"))
        if not raw.startswith(_CURSOR_PREFIX):
            raise ValueError("foreign cursor")
        return raw[len(_CURSOR_PREFIX) :].decode("utf-8")
    except (ValueError, UnicodeError, binascii.Error):
        raise InvalidCursor() from None


def _paginate(items: Sequence, keys: list[str], cursor: str | None, limit: int) -> Page:
    start = bisect.bisect_right(keys, decode_cursor(cursor)) if cursor else 0
    chunk = items[start : start + limit]
    more = start + limit < len(items)
    return Page(chunk, encode_cursor(keys[start + limit - 1]) if more else None)


# --- compiling a manifest ----------------------------------------------------------------------------


def iso_time(mtime: float | None) -> str | None:
    if mtime is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mtime))


async def _resource_entry(spec: ResourceSpec, sources: Mapping[str, Source]) -> Entry:
    display = spec.display
    if spec.text is not None:
        size = spec.size if spec.size is not None else len(spec.text.encode("utf-8"))
        return Entry(spec.uri, spec.name, display, display.title, display.mime_type or "text/plain", size,
                     text=spec.text, access=spec.access)
    if spec.render is not None:
        return Entry(spec.uri, spec.name, display, display.title, display.mime_type or RENDERED_TYPE, spec.size,
                     access=spec.access, render=spec.render)
    assert spec.source is not None and spec.path is not None
    info: FileInfo | None = None
    try:
        info = await sources[spec.source].stat(spec.path)
    except SourceNotFound:
        logger.warning("%s: %s: file %r not found in source %r; listed without size", spec.where, spec.key,
                       spec.path, spec.source)
    except SourceError as exc:
        logger.warning("%s: %s: cannot stat %r: %s", spec.where, spec.key, spec.path, exc)
    size = spec.size if spec.size is not None else (info.size if info else None)
    return Entry(spec.uri, spec.name, display, display.title,
                 file_mime_type(spec.path, display.mime_type, spec.decompress), size, info.mtime if info else None,
                 source=spec.source, path=spec.path, access=spec.access, decompress=spec.decompress)


_URI_SAFE = re.compile(r"[A-Za-z0-9._~/-]*")


def _uri_quote(value: str, safe: str) -> str:
    return value if _URI_SAFE.fullmatch(value) and (safe or "/" not in value) else uri_path(value, safe)


class _Pattern:
    """A collection pattern over {path}, {name}, {stem} and {ext}, compiled once for all of its files."""

    __slots__ = ("template", "keys")

    def __init__(self, text: str) -> None:
        keys = [k for k in _PLACEHOLDER.findall(text) if k in _FILE_KEYS]
        # Any brace that is not a known placeholder is literal text: double it for str.format.
        escaped = re.sub(r"\{(?:path|name|stem|ext)\}|[{}]", lambda m: m.group(0) if len(m.group(0)) > 1 else m.group(0) * 2, text)
        self.template = escaped
        self.keys = frozenset(keys)

    def fill(self, values: Mapping[str, str]) -> str:
        return self.template.format_map(values)


_FILE_KEYS = ("path", "name", "stem", "ext")


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


def _collection_entries(spec: CollectionSpec, files: Sequence[FileInfo]) -> list[Entry]:
    entries: list[Entry] = []
    uri_pattern, name_pattern = _Pattern(spec.uri), _Pattern(spec.name)
    title_pattern = _Pattern(spec.display.title) if spec.display.title else None
    raw_keys = name_pattern.keys | (title_pattern.keys if title_pattern else frozenset())
    display, fixed_mime, access, decompress = spec.display, spec.display.mime_type, spec.access, spec.decompress
    mime_by_ext: dict[str, str | None] = {}
    append = entries.append
    refused: list[str] = []
    for info in files:
        path = info.path
        if not is_servable(path):  # it could never be read back: listing it would promise what reads refuse
            refused.append(path)
            continue
        raw = _file_values(path, raw_keys, encode=False)
        if has_raw_bytes(path):
            raw = {k: display_text(v) for k, v in raw.items()}
        mime = fixed_mime or info.mime_type
        if mime is None:
            # file_mime_type is the one decision; its answer depends only on the last suffix of the served name.
            named = served_name(path, decompress)
            ext = named[named.rfind("."):] if "." in named.rsplit("/", 1)[-1] else ""
            if ext in mime_by_ext:
                mime = mime_by_ext[ext]
            else:
                mime = mime_by_ext[ext] = file_mime_type(path, None, decompress)
        append(Entry(uri_pattern.fill(_file_values(path, uri_pattern.keys, encode=True)), name_pattern.fill(raw),
                     display, title_pattern.fill(raw) if title_pattern else None, mime, info.size, info.mtime,
                     spec.source, path, access=access, decompress=decompress))
    if refused and _first_warning((spec.where, spec.key, spec.source, tuple(refused))):
        logger.warning("%s: %s: %d file(s) of source %r not listed: their names cannot be served (control "
                       "characters, backslashes, encoded separators ...), e.g. %s", spec.where, spec.key, len(refused),
                       spec.source, ", ".join(repr(p) for p in refused[:3]))
    return entries


_warned: dict[object, None] = {}


def _first_warning(key: object) -> bool:
    """True the first time `key` is seen (bounded): a relisting after every file change does not warn again."""
    if key in _warned:
        return False
    if len(_warned) >= 1024:
        _warned.pop(next(iter(_warned)))
    _warned[key] = None
    return True


def collection_key(spec: CollectionSpec) -> CollectionSpec:
    """What makes two collections list the same entries: everything but where the manifest wrote them."""
    return replace(spec, where=_NOWHERE, key="")


_NOWHERE = Location("", 0, 0)


async def compile_catalog(manifest: Manifest, sources: Mapping[str, Source], generation: int = 1,
                          reuse: Mapping[CollectionSpec, Sequence[Entry]] | None = None,
                          reused_at: Mapping[CollectionSpec, float] | None = None) -> Catalog:
    """Build the catalog a manifest describes; ManifestError (located) for URI collisions or unlistable sources.

    `reuse` maps collections (by `collection_key`) to entries still known to be current (their folder is
    watched), so a reload does not list and build them again.
    """
    issues: list[ManifestIssue] = []
    resource_entries: list[Entry] = [None] * len(manifest.resources)  # type: ignore[list-item]
    built: list[Sequence[Entry]] = [()] * len(manifest.collections)
    reuse = reuse or {}

    async def build_resource(i: int, spec: ResourceSpec) -> None:
        resource_entries[i] = await _resource_entry(spec, sources)

    async def list_collection(i: int, spec: CollectionSpec) -> None:
        known = reuse.get(collection_key(spec))
        if known is not None:
            built[i] = known
            return
        try:
            files = await sources[spec.source].list(spec.glob, spec.exclude, hidden=spec.hidden)
        except SourceError as exc:
            issues.append(_issue(spec.where, spec.key, f"cannot list source {spec.source!r}: {exc}"))
            return
        built[i] = _collection_entries(spec, files)

    async with anyio.create_task_group() as tg:
        for i, rspec in enumerate(manifest.resources):
            tg.start_soon(build_resource, i, rspec)
        for i, cspec in enumerate(manifest.collections):
            tg.start_soon(list_collection, i, cspec)

    owners: dict[str, tuple[str, Location]] = {}
    entries: list[Entry] = []

    def claim(uri: str, key: str, where: Location) -> bool:
        previous = owners.get(uri)
        if previous is not None:
            issues.append(_issue(where, key, f"URI {uri!r} is also produced by {previous[0]} ({previous[1]})"))
            return False
        owners[uri] = (key, where)
        return True

    for rspec, entry in zip(manifest.resources, resource_entries, strict=True):
        if claim(entry.uri, rspec.key, rspec.where):
            entries.append(entry)
    for cspec, collection_entries in zip(manifest.collections, built, strict=True):
        for entry in collection_entries:
            if claim(entry.uri, f"{cspec.key} (file {entry.path!r})", cspec.where):
                entries.append(entry)

    templates: list[TemplateEntry] = []
    seen_templates: dict[str, TemplateSpec] = {}
    for tspec in manifest.templates:
        if tspec.uri_template in seen_templates:
            first = seen_templates[tspec.uri_template]
            issues.append(_issue(tspec.where, tspec.key,
                                 f"uriTemplate {tspec.uri_template!r} is also declared by {first.key} ({first.where})"))
            continue
        seen_templates[tspec.uri_template] = tspec
        templates.append(TemplateEntry(UriTemplate.parse(tspec.uri_template), tspec))

    if issues:
        raise ManifestError(issues)
    catalog = Catalog(entries, templates, generation, {sid: src.url_paths for sid, src in sources.items()},
                      frozenset(sid for sid, src in sources.items() if getattr(src, "byte_names", False)))
    now = time.monotonic()
    catalog.collections = {collection_key(c): list(b) for c, b in zip(manifest.collections, built, strict=True)}
    catalog.listed_at = {key: (reused_at or {}).get(key, now) if key in reuse else now for key in catalog.collections}
    return catalog


def _issue(where: Location, key: str, message: str) -> ManifestIssue:
    return ManifestIssue(where.file, where.line, where.col, key, message)
