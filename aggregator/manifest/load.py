"""Load a manifest: YAML with marks -> ${ENV} -> JSON Schema -> cross-references -> the typed Manifest."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from aggregator.manifest.checks import check_references
from aggregator.manifest.convert import convert_limits, entry_convert
from aggregator.manifest.conforms import conforms
from aggregator.manifest.compose import Reads, apply_extends, include_manifests
from aggregator.manifest.files import ManifestTooLarge, read_file_at_most
from aggregator.manifest.interpolate import interpolate
from aggregator.manifest.model import (
    ConvertSettings,
    DocumentsSettings,
    DEFAULT_MAX_MANIFEST_BYTES,
    DEFAULT_PAGE_SIZE,
    Annotations,
    AuthSettings,
    ConsoleSettings,
    CollectionSpec,
    Defaults,
    Display,
    HttpSettings,
    Icon,
    JwtSettings,
    Location,
    Manifest,
    ManifestError,
    ManifestIssue,
    Render,
    RenderSettings,
    ResourceSpec,
    SearchSettings,
    ClusterSettings,
    ServerSettings,
    SourceSpec,
    StaticToken,
    TemplateSpec,
    is_url,
)
from aggregator.manifest.source_urls import url_scheme
from aggregator.manifest.schema import validation_schema
from aggregator.manifest.units import parse_duration, parse_size
from aggregator.manifest.yaml_marks import KeyPath, Marked, format_path, load_marked
from aggregator.sources.kind import SourceKind
from aggregator.sources.registry import kind_for_url, source_kinds

__all__ = ["load_manifest", "parse_manifest"]

_T = TypeVar("_T")
MIN_MANIFEST_BYTES = 1024
_SERVER_DEFAULTS = ServerSettings(name="")


def load_manifest(path: str | Path, env: Mapping[str, str] | None = None,
                  max_bytes: int = DEFAULT_MAX_MANIFEST_BYTES) -> Manifest:
    """Read and check the manifest at `path` (variables from `env`, default os.environ).

    `max_bytes` caps the file and its extends bases, read before the manifest's own settings are known: the
    default at start, the running manifest's `server.maxManifestBytes` on reload. ManifestError lists every
    located problem, naming the file as `path` was given; FileNotFoundError (an OSError) if it cannot be read.
    """
    file = str(path)
    try:
        data = read_file_at_most(path, max_bytes)
    except ManifestTooLarge as exc:
        raise ManifestError([ManifestIssue(file, 1, 1, "", f"the manifest {exc}; split it into files joined by "
                                                           "include:")]) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ManifestError([ManifestIssue(file, line, col, "", "the manifest is not UTF-8 text")]) from None
    # The folder the manifest is seen in, symlinks left alone: a mounted ConfigMap's `m.yaml -> ..data/m.yaml`
    # still means paths relative to the mount.
    base = Path(os.path.abspath(path)).parent
    return parse_manifest(text, file, base=base, env=env, chain=(os.path.normpath(os.path.abspath(path)),),
                          max_bytes=max_bytes, reads=Reads(data))


def _schema_issues(marked: Marked) -> list[ManifestIssue]:
    """What the schema refuses in `marked.data`, located; jsonschema is imported only when conforms.py does not
    say it conforms (the common case costs no jsonschema at all)."""
    if conforms(validation_schema(), marked.data):
        return []
    from aggregator.manifest.validate import validate

    return validate(marked)


def parse_manifest(text: str, file: str, base: Path, env: Mapping[str, str] | None = None,
                   chain: tuple[str, ...] = (), options: Mapping[str, Any] | None = None,
                   max_bytes: int = DEFAULT_MAX_MANIFEST_BYTES, reads: Reads | None = None) -> Manifest:
    """Check manifest `text` (named `file` in issues); relative local source paths resolve against `base`.

    `chain` holds the canonical names (absolute paths or URLs) of the manifests that include this one, then its
    own (cycle detection, and what relative includes resolve against). What a manifest read from a URL writes
    may not declare local folders or read the server's environment. `options`: fsspec options for manifests
    it names relative to its URL. `max_bytes` caps each extends base; includes are capped by the root manifest's
    own `server.maxManifestBytes` (an included manifest's `server:` never applies), passed down as `max_bytes`.
    `reads` counts the files the whole load read and digests their bytes (for a root manifest: new, over `text`
    unless load_manifest passes the bytes it read); the root's Manifest.digest is that digest.
    """
    reads = reads or Reads(text.encode("utf-8"))
    here = chain[-1] if chain else os.path.normpath(os.path.join(base, os.path.basename(file)))
    chain = chain or (here,)
    marked, issues = load_marked(text, file)
    if marked is None or not isinstance(marked.data, dict):
        raise ManifestError(issues)
    bases: tuple[str, ...] = ()
    if "extends" in marked.data:
        marked, more, bases = apply_extends(marked, here, chain, options, max_bytes, reads)
        issues += more  # reported with everything the checks below find in the merged manifest
    # Nothing below stops at the first problem: the author gets every one in a single run.
    issues += interpolate(marked, os.environ if env is None else env)
    # A refused value (bad tag, unset variable) would only echo as schema errors, and a value the schema
    # refused as a cross-reference error; an error about a whole entry says nothing about its parts.
    refused = {format_path(p) for p in marked.refused}
    issues += [i for i in _schema_issues(marked) if not _within(i.key, refused)]
    reported = {i.key for i in issues}
    issues += [i for i in check_references(marked) if i.key not in reported and not _within(i.key, refused)]
    if issues:
        raise ManifestError(issues)
    builder = _Builder(marked, Path(file), base)
    manifest = builder.build()
    if builder.issues:
        raise ManifestError(builder.issues)
    files = {Path(os.path.abspath(f)) for f in (file, *marked.origins.values()) if "://" not in f}
    manifest = replace(manifest, files=tuple(sorted(files)))
    if marked.data.get("include"):
        limit = manifest.server.max_manifest_bytes if len(chain) == 1 else max_bytes

        def load_included(text: str, name: str, chain: tuple[str, ...], options: Mapping[str, Any] | None
                          ) -> Manifest:
            # An included manifest's relative source paths resolve against its own folder.
            folder = base if is_url(chain[-1]) else Path(chain[-1]).parent
            return parse_manifest(text, name, folder, env, chain, options, limit, reads)

        manifest = include_manifests(manifest, marked, chain, bases, load_included, options, limit, reads)
    if len(chain) == 1:  # the root: every file of the load has been read
        manifest = replace(manifest, digest=reads.digest)
    return manifest


def _within(key: str, keys: set[str]) -> bool:
    """Whether `key` is one of `keys` or names a part of one's value."""
    return any(key == k or key.startswith((k + ".", k + "[")) for k in keys)


class _Builder:
    """Turns a checked tree into the typed model: units parsed, local paths resolved, defaults filled."""

    def __init__(self, marked: Marked, file: Path, base: Path) -> None:
        self.marked = marked
        self.file = file
        self.base = base
        self.issues: list[ManifestIssue] = []
        self.defaults = Defaults()
        self.sources: dict[str, SourceSpec] = {}

    def folder_of(self, path: KeyPath) -> Path:
        """Relative paths resolve against the folder of the file that wrote them (an extends base, or this one)."""
        file = self.marked.file_of(path)
        if file == self.marked.file or "://" in file:
            return self.base
        return Path(os.path.abspath(file)).parent

    def refuse_remote(self, path: KeyPath, refused: bool, what: str) -> None:
        """An issue when a manifest read from a URL wrote `path` and the value would `what` on this machine."""
        file = self.marked.file_of(path)
        if refused and is_url(file):
            self.issues.append(self.marked.issue(path, f"a manifest read from a URL ({file}) may not {what}"))

    def at(self, path: KeyPath, *, key: bool = False) -> Location:
        file, line, col = self.marked.locate(path, key=key)
        return Location(file, line, col)

    def parsed(self, parse: Callable[[Any], _T], spec: dict[str, Any], name: str, path: KeyPath, default: _T) -> _T:
        """`spec[name]` through `parse` (a unit), or `default` when absent or refused (refusals are issues)."""
        if name not in spec:
            return default
        try:
            return parse(spec[name])
        except ValueError as exc:
            self.issues.append(self.marked.issue(path + (name,), str(exc)))
            return default

    def build(self) -> Manifest:
        data = self.marked.data
        self.defaults = self.build_defaults(data.get("defaults", {}))
        sources = {sid: self.source(sid, spec) for sid, spec in data.get("sources", {}).items()}
        self.sources = sources
        return Manifest(
            path=self.file,
            server=self.server(data["server"]),
            defaults=self.defaults,
            sources=sources,
            resources=tuple(self.resource(i, spec) for i, spec in enumerate(data.get("resources", []))),
            collections=tuple(self.collection(i, spec) for i, spec in enumerate(data.get("collections", []))),
            templates=tuple(self.template(i, spec) for i, spec in enumerate(data.get("templates", []))),
            render=self.render_settings(data.get("render", {})),
        )

    def server(self, spec: dict[str, Any]) -> ServerSettings:
        http = spec.get("http", {})
        return ServerSettings(
            name=spec["name"], title=spec.get("title"), version=spec.get("version"),
            instructions=spec.get("instructions"), page_size=spec.get("pageSize", DEFAULT_PAGE_SIZE),
            max_subscriptions=spec.get("maxSubscriptions", _SERVER_DEFAULTS.max_subscriptions),
            reload_settle=self.parsed(parse_duration, spec, "reloadSettle", ("server",),
                                      _SERVER_DEFAULTS.reload_settle),
            http=HttpSettings(
                allowed_hosts=tuple(http.get("allowedHosts", ())),
                allowed_origins=tuple(http.get("allowedOrigins", ())),
                max_body_bytes=self.parsed(parse_size, http, "maxBodyBytes", ("server", "http"),
                                           HttpSettings().max_body_bytes),
                header_timeout=self.parsed(_positive_duration, http, "headerTimeout", ("server", "http"),
                                           HttpSettings().header_timeout),
                body_timeout=self.parsed(_positive_duration, http, "bodyTimeout", ("server", "http"),
                                         HttpSettings().body_timeout),
                keep_alive_timeout=self.parsed(_positive_duration, http, "keepAliveTimeout", ("server", "http"),
                                               HttpSettings().keep_alive_timeout),
                max_connections=http.get("maxConnections", HttpSettings().max_connections),
            ),
            auth=self.auth(spec["auth"]) if "auth" in spec else None,
            tools=spec.get("tools", False),
            max_manifest_bytes=self.max_manifest_bytes(spec),
            search=self.search_settings(spec.get("search", {})),
            documents=self.documents_settings(spec.get("documents", {})),
            cluster=self.cluster_settings(spec["cluster"]) if "cluster" in spec else None,
            console=_console_settings(spec.get("console", False)),
        )

    def cluster_settings(self, spec: dict[str, Any]) -> ClusterSettings:
        path: KeyPath = ("server", "cluster")
        base = ClusterSettings(redis="")
        timeout = self.parsed(parse_duration, spec, "timeout", path, base.timeout)
        if timeout <= 0:
            self.issues.append(self.marked.issue(path + ("timeout",), "a Redis timeout must be longer than 0s"))
        return ClusterSettings(
            redis=spec["redis"], prefix=spec.get("prefix", base.prefix),
            shared_cache=spec.get("sharedCache", base.shared_cache),
            shared_max_bytes=self.parsed(parse_size, spec, "sharedCacheMaxBytes", path, base.shared_max_bytes),
            single_flight=spec.get("singleFlight", base.single_flight), timeout=timeout, secret=spec.get("secret"))

    def search_settings(self, spec: dict[str, Any]) -> SearchSettings:
        path: KeyPath = ("server", "search")
        index_file = spec.get("indexFile")
        if index_file is not None:
            self.refuse_remote(path + ("indexFile",), True, "write an index file on this machine")
            index_file = Path(os.path.abspath(self.folder_of(path + ("indexFile",)) / index_file))
        return SearchSettings(index_bytes=self.parsed(parse_size, spec, "indexBytes", path,
                                                      SearchSettings().index_bytes), index_file=index_file)

    def documents_settings(self, spec: dict[str, Any]) -> DocumentsSettings:
        path: KeyPath = ("server", "documents")
        cache_dir = spec.get("cacheDir")
        if cache_dir is not None:
            self.refuse_remote(path + ("cacheDir",), True, "write converted documents on this machine")
            cache_dir = Path(os.path.abspath(self.folder_of(path + ("cacheDir",)) / cache_dir))
        return DocumentsSettings(cache_dir=cache_dir, cache_bytes=self.parsed(
            parse_size, spec, "cacheBytes", path, DocumentsSettings().cache_bytes))

    def render_settings(self, spec: dict[str, Any]) -> RenderSettings:
        base, path = RenderSettings(), ("render",)
        timeout = self.parsed(parse_duration, spec, "timeout", path, base.timeout)
        if timeout <= 0:  # the schema allows 0 for every duration; a render with no time at all never succeeds
            self.issues.append(self.marked.issue(path + ("timeout",), "a render timeout must be longer than 0s"))
        return RenderSettings(timeout=timeout, max_iterations=spec.get("maxIterations", base.max_iterations))

    def max_manifest_bytes(self, spec: dict[str, Any]) -> int:
        size = self.parsed(parse_size, spec, "maxManifestBytes", ("server",), DEFAULT_MAX_MANIFEST_BYTES)
        if size < MIN_MANIFEST_BYTES:  # smaller, the next reload could not even read the manifest itself
            self.issues.append(self.marked.issue(("server", "maxManifestBytes"), "must be at least 1KiB"))
            return DEFAULT_MAX_MANIFEST_BYTES
        return size

    def auth(self, spec: dict[str, Any]) -> AuthSettings:
        jwt = spec.get("jwt")
        return AuthSettings(
            resource=spec.get("resource"), required_scopes=tuple(spec.get("requiredScopes", ())),
            tokens=tuple(StaticToken(t["name"], _token_digest(t), tuple(t.get("scopes", ())))
                         for t in spec.get("tokens", ())),
            jwt=None if jwt is None else JwtSettings(
                issuer=jwt["issuer"], jwks_url=jwt["jwksUrl"], audience=jwt.get("audience"),
                algorithms=tuple(jwt.get("algorithms", ("RS256", "ES256"))),
                scopes_claim=jwt.get("scopesClaim", "scope"),
                leeway=self.parsed(parse_duration, jwt, "leeway", ("server", "auth", "jwt"), 30.0)),
        )

    def access(self, spec: dict[str, Any], source: str | None = None) -> frozenset[str]:
        """The entry's own `access.scopes` plus those of the source it reads from."""
        own = frozenset(spec.get("access", {}).get("scopes", ()))
        inherited = self.sources[source].access if source in self.sources else frozenset()
        return own | inherited

    def build_defaults(self, spec: dict[str, Any]) -> Defaults:
        base, path = Defaults(), ("defaults",)
        return Defaults(
            ttl=self.parsed(parse_duration, spec, "ttl", path, base.ttl),
            max_bytes=self.parsed(parse_size, spec, "maxBytes", path, base.max_bytes),
            cache_bytes=self.parsed(parse_size, spec, "cacheBytes", path, base.cache_bytes),
            timeout=self.parsed(parse_duration, spec, "timeout", path, base.timeout),
            max_concurrency=spec.get("maxConcurrency", base.max_concurrency),
            stale_if_error=self.parsed(parse_duration, spec, "staleIfError", path, base.stale_if_error),
            convert=convert_limits(self.parsed, spec.get("convert", {}), path + ("convert",), base.convert),
        )

    def source(self, sid: str, spec: dict[str, Any]) -> SourceSpec:
        path: KeyPath = ("sources", sid)
        kind = kind_for_url(spec["url"])
        protocol = kind.protocol(url_scheme(spec["url"]))
        url = kind.locate(spec["url"], self.folder_of(path + ("url",)))
        for where, what in kind.remote_refusals(url, spec):
            self.refuse_remote(path + where, True, what)
        return SourceSpec(
            id=sid, url=url, protocol=protocol, where=self.at(path, key=True), key=format_path(path),
            kind=kind.name, settings=self.kind_settings(kind, protocol, spec, path),
            ttl=self.parsed(parse_duration, spec, "ttl", path, None),
            max_bytes=self.parsed(parse_size, spec, "maxBytes", path, None),
            description=spec.get("description"),
            timeout=self.parsed(parse_duration, spec, "timeout", path, self.defaults.timeout),
            max_concurrency=spec.get("maxConcurrency", self.defaults.max_concurrency),
            stale_if_error=self.parsed(parse_duration, spec, "staleIfError", path, self.defaults.stale_if_error),
            poll=self.parsed(parse_duration, spec, "poll", path, None),
            access=frozenset(spec.get("access", {}).get("scopes", ())), optional=spec.get("optional", False),
        )

    def kind_settings(self, kind: SourceKind, protocol: str, spec: dict[str, Any], path: KeyPath) -> dict[str, Any]:
        """The kind's own keys, parsed; an issue for each key that belongs to other kinds only (the schema allows
        every kind's keys on every source) and for each value the kind's parse refuses."""
        # Imported here: `python -m aggregator.manifest.schema_build` must find it not yet imported.
        from aggregator.manifest.schema_build import COMMON_SOURCE_KEYS, source_key_owners

        owners = source_key_owners(source_kinds().values())
        for key in spec:
            if key not in COMMON_SOURCE_KEYS and key not in kind.settings and key in owners:
                shown = kind.name if protocol == kind.name else f"{kind.name} ({protocol})"
                self.issues.append(self.marked.issue(
                    path + (key,), f"{key!r} is a setting of {' and '.join(owners[key])} sources only; this source's "
                                   f"kind (from its url) is {shown}", key=True))
        settings = {}
        for key, setting in kind.settings.items():
            settings[key] = setting.default
            if key in spec:
                try:
                    settings[key] = setting.parse(spec[key])
                except ValueError as exc:
                    self.issues.append(self.marked.issue(path + (key,), str(exc)))
        return settings

    def resource(self, i: int, spec: dict[str, Any]) -> ResourceSpec:
        path: KeyPath = ("resources", i)
        return ResourceSpec(spec["uri"], spec["name"], _display(spec), self.at(path), format_path(path),
                            spec.get("source"), spec.get("path"), spec.get("text"), spec.get("size"),
                            self.access(spec, spec.get("source")), self.render(spec, path),
                            spec.get("decompress", False), self.convert(spec, path))

    def collection(self, i: int, spec: dict[str, Any]) -> CollectionSpec:
        path: KeyPath = ("collections", i)
        return CollectionSpec(spec["source"], spec["glob"], spec["uri"], spec.get("name", "{path}"), _display(spec),
                              self.at(path), format_path(path), tuple(spec.get("exclude", ())),
                              self.access(spec, spec["source"]), spec.get("hidden", False),
                              spec.get("decompress", False), self.convert(spec, path), spec.get("index", False))

    def template(self, i: int, spec: dict[str, Any]) -> TemplateSpec:
        path: KeyPath = ("templates", i)
        return TemplateSpec(spec["uriTemplate"], spec["name"], spec.get("source"), spec.get("path"), _display(spec),
                            self.at(path), format_path(path), spec.get("query"), spec.get("format", "json"),
                            self.access(spec, spec.get("source")),
                            {k: tuple(v) for k, v in spec.get("values", {}).items()}, self.render(spec, path),
                            spec.get("hidden", False), spec.get("decompress", False), self.convert(spec, path))

    def convert(self, spec: dict[str, Any], path: KeyPath) -> ConvertSettings | None:
        return entry_convert(self.parsed, spec, path, self.defaults.convert)

    def render(self, spec: dict[str, Any], path: KeyPath) -> Render | None:
        """The entry's `render` template, checked for syntax (a located issue when it is broken)."""
        text = spec.get("render")
        if text is None:
            return None
        from aggregator.render_sandbox import check_syntax  # jinja2 is imported only by manifests that render

        problem = check_syntax(text)
        if problem is not None:
            self.issues.append(self.marked.issue(path + ("render",), problem))
        return Render(text)


def _display(spec: dict[str, Any]) -> Display:
    icons = tuple(Icon(i["src"], i.get("mimeType"), tuple(i["sizes"]) if "sizes" in i else None, i.get("theme"))
                  for i in spec.get("icons", ())) or None
    notes = spec.get("annotations")
    annotations = None if notes is None else Annotations(
        tuple(notes["audience"]) if "audience" in notes else None, notes.get("priority"), notes.get("lastModified"))
    return Display(spec.get("title"), spec.get("description"), spec.get("mimeType"), icons, annotations)


def _positive_duration(value: Any) -> float:
    """A duration that must not be zero: a zero timeout would close every connection at once."""
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"must be longer than 0 seconds, got {value!r}")
    return seconds


def _token_digest(spec: dict[str, Any]) -> str:
    """The SHA-256 hex digest a static token is kept as: given, or computed from the token (then forgotten)."""
    if "sha256" in spec:
        return str(spec["sha256"]).lower()
    return hashlib.sha256(str(spec["token"]).encode("utf-8")).hexdigest()


def _console_settings(value: bool | dict[str, Any]) -> ConsoleSettings | None:
    """`server.console`: false (off), true, or `{adminScope: ..., maxStreams: ...}` (the schema allows nothing
    else)."""
    if value is False:
        return None
    if not isinstance(value, dict):
        return ConsoleSettings()
    default = ConsoleSettings()
    return ConsoleSettings(admin_scope=value.get("adminScope"),
                           max_streams=value.get("maxStreams", default.max_streams),
                           max_streams_per_caller=value.get("maxStreamsPerCaller", default.max_streams_per_caller),
                           admin_streams=value.get("adminStreams", default.admin_streams))
