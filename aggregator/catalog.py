"""The catalog: an immutable snapshot of what a manifest lists and which templates it answers.

Entries are kept sorted by URI. A cursor names the last URI a page returned, so listing costs O(page)
and a cursor keeps working after the catalog is rebuilt (it resumes at the next URI in the new order).
"""

from __future__ import annotations

import base64
import binascii
import copy
import logging
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Generic, TypeVar

from aggregator.catalog_rows import Rows
from aggregator.path_index import PathIndex
from aggregator.chunked import find_left, find_right
from aggregator.content import QUERY_FORMATS, file_mime_type, is_gzip_name
from aggregator.documents.formats import CONVERTED_MIME_TYPES, converted
from aggregator.entry import FILE_MTIME, Entry, iso_time, listed_fields
from aggregator.errors import InvalidCursor, ResourceNotFound
from aggregator.listing_change import EVERYONE, ListingChange, compare
from aggregator.manifest.model import CollectionSpec, ConvertSettings, Render, ResourceSpec, TemplateSpec
from aggregator.manifest.placeholders import PLACEHOLDER
from aggregator.paths import UnsafePath, has_raw_bytes, safe_relpath, uri_path
from aggregator.templates import UriTemplate, Value

__all__ = ["FILE_MTIME", "Catalog", "Entry", "FileTarget", "Page", "QueryTarget", "RenderTarget", "RowsPage", "Target",
           "TemplateEntry", "TextTarget", "iso_time", "listed_fields"]

logger = logging.getLogger("aggregator.catalog")

_CURSOR_PREFIX = b"c1:"
Param = str | tuple[str, ...] | None
"""A URI variable's value as a Target holds it: absent (None), one string, or an exploded list as a tuple."""
RENDERED_TYPE = "text/markdown"  # what rendered resources are unless the manifest says otherwise
_MAX_VIEWS = 64  # distinct caller scope sets whose filtered listing is kept per catalog
_MAX_TARGETS = 4096  # listed URIs whose targets a catalog keeps (a client's working set), then it starts again


@dataclass(frozen=True, slots=True)
class TemplateEntry:
    template: UriTemplate
    spec: TemplateSpec

    @property
    def uri_template(self) -> str:
        return self.template.text


@dataclass(frozen=True, slots=True)
class TextTarget:
    """Inline text the manifest spells."""

    uri: str
    mime_type: str | None
    text: str
    access: frozenset[str] = frozenset()
    """Scopes a caller needs to read it."""


@dataclass(frozen=True, slots=True)
class RenderTarget:
    """A Jinja2 template producing the content, with `params` (a template URI's values) as its variables."""

    uri: str
    mime_type: str | None
    render: Render
    params: tuple[tuple[str, object], ...] = ()
    access: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class QueryTarget:
    """A SQL source's query, run with `params` bound (never spliced)."""

    uri: str
    mime_type: str | None
    source: str
    query: str
    params: tuple[tuple[str, str | None], ...] = ()
    format: str = "json"
    access: frozenset[str] = frozenset()


@dataclass(slots=True)
class FileTarget:
    """A file of a source: listed, or a template's path filled in."""

    uri: str
    mime_type: str | None
    source: str
    path: str
    mime_declared: bool = False
    """True when the manifest names the type; otherwise it was guessed and a backend's Content-Type wins."""
    decompress: bool = False
    """The read decompresses: the entry says `decompress: true` and the file's name ends in `.gz`."""
    convert: ConvertSettings | None = None
    """The read converts the file (to Markdown) within these limits."""
    access: frozenset[str] = frozenset()


Target = TextTarget | RenderTarget | QueryTarget | FileTarget
"""What a URI resolves to: each kind of read gets exactly the fields it needs."""


_Item = TypeVar("_Item", Entry, TemplateEntry)


@dataclass(frozen=True, slots=True)
class Page(Generic[_Item]):
    items: Sequence[_Item]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class RowsPage:
    """A listing page as rows [start, stop) of the caller's view: what a page encodes without building entries."""

    rows: Rows
    start: int
    stop: int
    next_cursor: str | None


class Catalog:
    """Listed entries in URI order, templates in match order, and lookup of both."""

    def __init__(self, entries: Sequence[Entry], templates: Sequence[TemplateEntry], generation: int = 1,
                 url_sources: Mapping[str, bool] | None = None, byte_sources: frozenset[str] = frozenset(),
                 uri_sources: frozenset[str] = frozenset(),
                 forwards: Mapping[str, tuple[str, frozenset[str]]] | None = None) -> None:
        self.generation = generation
        # URI prefixes whose unlisted URIs still read from a source: prefix -> (source, access); longest first.
        self._forwards = sorted((forwards or {}).items(), key=lambda item: -len(item[0]))
        # Sources whose paths are another server's URIs: a template's path is its own RFC 6570 template.
        self._uri_sources = uri_sources
        # Sources whose paths are URL paths: template values get percent-encoded into them.
        self._url_sources = dict(url_sources or {})
        # Sources whose names are bytes (local folders): a %XX that is not UTF-8 in a URI names those bytes.
        self._byte_sources = byte_sources
        # Entries each collection produced (by collection_key) and when they were listed (time.monotonic()),
        # for reloads that can reuse them.
        self.collections: dict[CollectionSpec, Collection[Entry]] = {}
        self.listed_at: dict[CollectionSpec, float] = {}
        # What sources published themselves (MCP upstreams with a namespace), by source id, and when: kept while
        # such a source is unreachable, for up to its staleIfError.
        self.published: dict[str, Any] = {}
        self.published_at: dict[str, float] = {}
        # When the files of manifest resources were last stat'ed (by `resource_key`): a reload reuses an entry
        # younger than its source's ttl.
        self.stated_at: dict[ResourceSpec, float] = {}
        # Columns (catalog_rows): a listed file costs its URI and a few bytes, and its Entry is built when asked.
        # URIs are found by bisection rather than a dict: O(log n) string compares per read, and a change copies
        # one list, not a hash table.
        self.entries: Rows = entries if isinstance(entries, Rows) else Rows.of(entries)
        self._uris: Sequence[str] = self.entries.uris
        self._views: dict[frozenset[str], tuple[Rows, Sequence[str]]] = {}
        self._access_count: int | None = None
        self._by_path: dict[CollectionSpec, PathIndex] = {}
        # What listed URIs read lately resolved to: the catalog never changes, so neither does a URI's target.
        self._targets: dict[str, Target] = {}
        self._index_templates(templates)

    def _index_templates(self, templates: Iterable[TemplateEntry]) -> None:
        """Hold `templates` and the tables that match URIs against them (new objects: a successor shares none)."""
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

    def with_templates(self, templates: Iterable[TemplateEntry]) -> None:
        """Hold these templates instead (O(templates)): only on a successor not yet served (an upstream relisted
        published others); what is derived from the templates is derived again."""
        self._index_templates(templates)
        for derived in ("listing_signature", "restricted"):
            self.__dict__.pop(derived, None)

    def __len__(self) -> int:
        return len(self.entries)

    def targets(self) -> set[tuple[str, str]]:
        """(source, path) of every listed file."""
        return self.entries.files()

    @cached_property
    def listing_signature(self) -> tuple[object, ...]:
        """Everything resources/list and resources/templates/list show: equal signatures, equal listings."""
        return tuple(listed_fields(e) for e in self.entries), self.templates_shown()

    def templates_shown(self) -> tuple[object, ...]:
        """What resources/templates/list shows (the templates' part of `listing_signature`)."""
        return tuple(map(_shown_template, self.templates))

    def templates_change(self, new: Catalog) -> ListingChange:
        """What `new`'s templates do to each caller's resources/templates/list against this catalog's (O(templates)):
        templates that came, went or show otherwise, or whose access or console detail changed; every caller is told
        of a reordering."""
        before, after = ({t.uri_template: t for t in catalog.templates} for catalog in (self, new))
        change = compare(before, after, _shown_template, _template_access, _template_detail)
        if not change.shown and self.templates_shown() != new.templates_shown():
            return EVERYONE  # the same templates in another order (or one spelt twice)
        return change

    def get(self, uri: str) -> Entry | None:
        return self.entries.get(uri)

    @cached_property
    def restricted(self) -> bool:
        """Whether any entry or template needs scopes (then listings depend on who asks)."""
        return self.access_count > 0 or any(t.spec.access for t in self.templates)

    @property
    def access_count(self) -> int:
        """How many entries need scopes: counted once (C-level), then kept by incremental successors."""
        if self._access_count is None:
            self._access_count = self.entries.count_needing_scopes()
        return self._access_count

    def paths_of(self, key: CollectionSpec) -> PathIndex:
        """A collection's entries (by `collection_key`) by file path: a view of its rows (`PathIndex`, O(log n) a
        lookup), kept by incremental successors."""
        found = self._by_path.get(key)
        if found is None:
            listed = self.collections.get(key, ())
            found = self._by_path[key] = PathIndex(listed if isinstance(listed, Rows) else Rows.of(listed))
        return found

    def successor(self, entries: Rows, uris: Sequence[str], generation: int, access_count: int) -> Catalog:
        """This catalog with other entries (sorted by URI, with their URIs, made by the caller) and
        the same templates and sources: O(collections) here. Derived views start empty; the caller may carry
        them (`_views`) and fill `collections`, `listed_at` and `paths_of` for what it changed."""
        new = copy.copy(self)  # shallow: shares the template tables, which do not depend on entries
        for derived in ("listing_signature", "restricted"):
            new.__dict__.pop(derived, None)
        new.generation, new.entries, new._uris = generation, entries, uris
        new._views, new._access_count, new._by_path, new._targets = {}, access_count, dict(self._by_path), {}
        new.collections, new.listed_at = dict(self.collections), dict(self.listed_at)
        new.published, new.published_at = dict(self.published), dict(self.published_at)
        new.stated_at = dict(self.stated_at)
        return new

    def page(self, cursor: str | None, limit: int, scopes: frozenset[str] | None = None) -> Page[Entry]:
        """Up to `limit` entries after `cursor` that a caller holding `scopes` may see (None: every entry);
        InvalidCursor if the cursor was not made by a catalog."""
        page = self.page_rows(cursor, limit, scopes)
        return Page(page.rows[page.start:page.stop], page.next_cursor)

    def page_rows(self, cursor: str | None, limit: int, scopes: frozenset[str] | None = None) -> RowsPage:
        """`page` as rows of the caller's view: O(log n), nothing built per row."""
        entries, uris = self.visible(scopes)
        start, stop, next_cursor = _bounds(uris, cursor, limit)
        return RowsPage(entries, start, stop, next_cursor)

    def template_page(self, cursor: str | None, limit: int, scopes: frozenset[str] | None = None
                      ) -> Page[TemplateEntry]:
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
        entries, uris = self.visible(scopes)
        start, end = prefix_range(uris, prefix)
        return entries[start:end]

    def visible(self, scopes: frozenset[str] | None = None) -> tuple[Rows, Sequence[str]]:
        """The entries a caller holding `scopes` may see, in URI order, and their URIs (for bisecting); filtered
        once per catalog and scope set, so pages stay O(page)."""
        if scopes is None or not self.restricted:
            return self.entries, self._uris
        view = self._views.get(scopes)
        if view is None:
            if len(self._views) >= _MAX_VIEWS:
                self._views.pop(next(iter(self._views)))
            visible = self.entries.visible_to(scopes)
            view = self._views[scopes] = (visible, visible.uris)
        return view

    def resolve_each(self, uris: Iterable[str]) -> Iterator[tuple[str, Target]]:
        """(uri, target) for each of `uris` this catalog resolves; unknown and refused ones are left out."""
        for uri in uris:
            try:
                yield uri, self.resolve(uri)
            except ResourceNotFound:
                continue

    def resolve(self, uri: str) -> Target:
        """What `uri` names; ResourceNotFound for unknown URIs and for any refused as unsafe. A listed URI's target
        is kept (up to `_MAX_TARGETS` of them): a URI read again resolves in one dict lookup."""
        target = self._targets.get(uri)
        if target is not None:
            return target
        entry = self.entries.get(uri)
        if entry is not None:
            # Only listed URIs: their number and size are the catalog's own, not whatever a client sends.
            if len(self._targets) >= _MAX_TARGETS:
                self._targets.clear()  # not an LRU: a hit then costs nothing more than the lookup
            target = self._targets[uri] = self._entry_target(entry)
            return target
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
                return RenderTarget(uri, spec.display.mime_type or RENDERED_TYPE, spec.render, params, spec.access)
            assert spec.source is not None  # only render templates have none
            if spec.query is not None:
                # Values are bound as query parameters, never spliced into SQL or paths.
                bound = tuple((name, _joined(values.get(name))) for name in candidate.template.variables)
                return QueryTarget(uri, spec.display.mime_type or QUERY_FORMATS[spec.format], spec.source,
                                   spec.query, bound, spec.format, spec.access)
            # A match refused for safety never falls through to a looser template.
            url_path = self._url_sources.get(spec.source, False)
            if spec.source in self._uri_sources:
                # Another server's URI: its own template expands the values, and that server judges them.
                path: str | None = UriTemplate.parse(spec.path or "", for_matching=False).expand(values)
            else:
                path = expand_path(candidate, values, url_path, spec.source in self._byte_sources)
            if path is None:
                raise ResourceNotFound(uri)
            declared = spec.display.mime_type
            named = self._file_name(spec.source, path)
            convert = converted(named, spec.decompress, spec.convert)
            mime = CONVERTED_MIME_TYPES[convert.to] if convert else file_mime_type(named, declared, spec.decompress)
            return FileTarget(uri, mime, spec.source, path, mime_declared=declared is not None or convert is not None,
                              decompress=spec.decompress and is_gzip_name(named), access=spec.access,
                              convert=convert)
        forwarded = self._forwarded(uri)
        if forwarded is not None:
            return forwarded
        raise ResourceNotFound(uri)

    def _forwarded(self, uri: str) -> FileTarget | None:
        """An unlisted URI under a source's forwarded prefix (a namespaced upstream): read from it as it is; the
        type it gives wins over the guess from its name."""
        for prefix, (source, access) in self._forwards:
            if uri.startswith(prefix) and len(uri) > len(prefix):
                path = uri[len(prefix):]
                return FileTarget(uri, file_mime_type(path, None, False), source, path, access=access)
        return None

    def _entry_target(self, entry: Entry) -> Target:
        """What a listed entry reads: its text, its render, or its file."""
        if entry.text is not None:
            return TextTarget(entry.uri, entry.mime_type, entry.text, entry.access)
        if entry.render is not None:
            return RenderTarget(entry.uri, entry.mime_type, entry.render, access=entry.access)
        assert entry.source is not None and entry.path is not None, entry.uri
        # Positional: keyword arguments take the slower way into `__init__`, and every read of a listed file is here.
        return FileTarget(entry.uri, entry.mime_type, entry.source, entry.path,
                          entry.display.mime_type is not None or entry.convert is not None,
                          entry.decompress and is_gzip_name(self._file_name(entry.source, entry.path)),
                          entry.convert, entry.access)

    def _file_name(self, source: str | None, path: str) -> str:
        """The file a source path names: only a URL path has a query to leave out (in a folder `what?#frag.md` is
        a file name)."""
        return path.split("?", 1)[0] if self._url_sources.get(source or "", False) else path


def _joined(value: Value | None) -> str | None:
    """A matched value as one string: exploded lists are comma-joined (SQL binds scalars)."""
    return ",".join(value) if isinstance(value, list) else value


def _hashable(value: Value | None) -> Param:
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
        for m in PLACEHOLDER.finditer(spec.path):
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


def prefix_range(keys: Sequence[str], prefix: str) -> tuple[int, int]:
    """The slice of sorted `keys` that start with `prefix`, found by bisection: O(log n)."""
    start = find_left(keys, prefix)
    # Keys cut to the prefix's length stay sorted; those equal to it are the run that starts with it.
    return start, find_right(keys, prefix, start, lambda key: key[: len(prefix)])


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


def _paginate(items: Sequence[_Item], keys: Sequence[str], cursor: str | None, limit: int) -> Page[_Item]:
    start, stop, next_cursor = _bounds(keys, cursor, limit)
    return Page(items[start:stop], next_cursor)


def _bounds(keys: Sequence[str], cursor: str | None, limit: int) -> tuple[int, int, str | None]:
    """[start, stop) of the page of sorted `keys` after `cursor`, and the next page's cursor (None: none)."""
    start = find_right(keys, decode_cursor(cursor)) if cursor else 0
    more = start + limit < len(keys)
    return start, min(start + limit, len(keys)), encode_cursor(keys[start + limit - 1]) if more else None


def _shown_template(template: TemplateEntry) -> tuple[object, ...]:
    """What resources/templates/list shows of `template`."""
    return template.uri_template, template.spec.name, template.spec.display


def _template_detail(template: TemplateEntry) -> tuple[object, ...]:
    """What the console shows of `template` beside its listing: its source, enumerated values and kind."""
    spec = template.spec
    return spec.source, dict(spec.values), "render" if spec.render is not None else spec.query is not None


def _template_access(template: TemplateEntry) -> frozenset[str]:
    """The scopes a caller needs to see `template`."""
    return template.spec.access
