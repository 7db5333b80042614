"""The typed manifest: what the loader produces and the catalog compiles.

Every entry keeps where it was written (`where`) and its key path (`key`), so later stages
(URI collisions, unreadable sources) can report `file:line:col: key: message` too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Location:
    """A 1-based line and column in a manifest file."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True, slots=True)
class Icon:
    src: str
    mime_type: str | None = None
    sizes: tuple[str, ...] | None = None
    theme: str | None = None


@dataclass(frozen=True, slots=True)
class Annotations:
    audience: tuple[str, ...] | None = None
    priority: float | None = None
    last_modified: str | None = None


@dataclass(frozen=True, slots=True)
class Display:
    """What a client is shown of an entry, in MCP's own field names."""

    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    icons: tuple[Icon, ...] | None = None
    annotations: Annotations | None = None


DEFAULT_PAGE_SIZE = 500
"""Resources per resources/list page unless the manifest says otherwise: ~75 KB of JSON, few round trips."""


DEFAULT_MAX_MANIFEST_BYTES = 4 * 1024 * 1024
"""Largest manifest file read (the root, extends bases, includes) unless `server.maxManifestBytes` says otherwise."""


@dataclass(frozen=True, slots=True)
class HttpSettings:
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    max_body_bytes: int = 4 * 1024 * 1024
    header_timeout: float = 10.0
    """Seconds a connection has to send a request's line and headers (from connecting, or from its first byte)."""
    body_timeout: float = 30.0
    """Seconds a request's whole body has to arrive once its headers have."""
    keep_alive_timeout: float = 5.0
    """Seconds an idle connection is kept open after a response for the next request."""
    max_connections: int = 1000
    """Open connections one server process holds; past it new ones get 503 and are closed."""


@dataclass(frozen=True, slots=True)
class StaticToken:
    """A static bearer token, kept only as the SHA-256 hex digest of its text."""

    name: str
    sha256: str
    scopes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class JwtSettings:
    """JWT access tokens: signed by a key of `jwks_url`, issued by `issuer`, for `audience` (None: the resource)."""

    issuer: str
    jwks_url: str
    audience: str | None = None
    algorithms: tuple[str, ...] = ("RS256", "ES256")
    scopes_claim: str = "scope"
    leeway: float = 30.0


@dataclass(frozen=True, slots=True)
class AuthSettings:
    """Bearer-token auth for HTTP serving; `resource` None means the bind address's /mcp URL."""

    resource: str | None = None
    required_scopes: tuple[str, ...] = ()
    tokens: tuple[StaticToken, ...] = ()
    jwt: JwtSettings | None = None


DEFAULT_INDEX_BYTES = 256 * 1024 * 1024
"""Text the full-text search index holds unless `server.search.indexBytes` says otherwise."""


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """The full-text index of collections that say `index: true`."""

    index_bytes: int = DEFAULT_INDEX_BYTES
    """Bytes of text indexed at most (documents past it are found by their metadata only)."""
    index_file: Path | None = None
    """An SQLite file that keeps the index across restarts; None: in memory, built at each start."""


@dataclass(frozen=True, slots=True)
class DocumentsSettings:
    """`server.documents`: where converted documents are kept across restarts (`convert:` entries)."""

    cache_dir: Path | None = None
    """A folder that keeps converted text across restarts, keyed by the document's bytes and the conversion's
    settings; None: converted text lives in the content cache only."""
    cache_bytes: int = 1024 * 1024 * 1024
    """Bytes `cache_dir` holds at most; the least recently written files go first."""


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """Replicas sharing one Redis (`server.cluster`): change events, poll leases, interests and a content cache."""

    redis: str = field(repr=False)
    """redis://, rediss:// or unix:// URL; it may hold a password, so it is never logged or shown."""
    prefix: str = "aggregator"
    """Prefix of every Redis key and channel: one per deployment sharing a Redis."""
    shared_cache: bool = True
    """Keep remote sources' bodies in Redis too, so a cold read on one replica is warm on the others."""
    shared_max_bytes: int = 1024 * 1024
    """Largest body put in the shared cache; bigger ones stay in each replica's own cache."""
    single_flight: bool = True
    """One replica loads a cold remote body while the others wait for it (a Redis lock around the load)."""
    timeout: float = 0.5
    """Seconds one Redis call may take; past it the replica goes on alone (local cache, local detection)."""
    secret: str | None = field(default=None, repr=False)
    """Key material for the HMAC sealing what replicas write to Redis (cluster/seal.py); None: nothing sealed.
    Never logged or shown."""


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    """The operator's web console at /console (`server.console`), served by `serve --http` only."""

    admin_scope: str | None = None
    """A caller whose token holds this scope may view the console as other scopes ("view as"); None: nobody."""
    max_streams: int = 32
    """Event streams open at once, every caller together."""
    max_streams_per_caller: int = 4
    """Event streams one caller (principal) may hold at once."""
    admin_streams: int = 4
    """Of `max_streams`, those only holders of `admin_scope` may open (none without an admin scope)."""


@dataclass(frozen=True, slots=True)
class ServerSettings:
    name: str
    title: str | None = None
    version: str | None = None
    instructions: str | None = None
    page_size: int = DEFAULT_PAGE_SIZE
    max_subscriptions: int = 1000
    reload_settle: float = 0.5
    """Seconds the manifest files must stay unchanged before a reload reads them (a save may come in chunks)."""
    http: HttpSettings = field(default_factory=HttpSettings)
    auth: AuthSettings | None = None
    tools: bool = False
    """Expose resources as tools too, for clients that cannot use resources."""
    max_manifest_bytes: int = DEFAULT_MAX_MANIFEST_BYTES
    """Cap on each manifest file a load reads: its includes (and, on reload, the manifest itself and its bases)."""
    search: SearchSettings = field(default_factory=SearchSettings)
    documents: DocumentsSettings = field(default_factory=DocumentsSettings)
    """Where the full-text index lives and how much text it holds."""
    cluster: ClusterSettings | None = None
    """Off (None): one process on its own, as without a cluster."""
    console: ConsoleSettings | None = None
    """Off (None) unless `server.console` is true or an object."""


@dataclass(frozen=True, slots=True)
class RenderSettings:
    """The budget of one render (and of the renders it reads): wall-clock seconds, reads included, and loop
    iterations across all its loops."""

    timeout: float = 2.0
    max_iterations: int = 1_000_000


@dataclass(frozen=True, slots=True)
class ConvertSettings:
    """`convert:` on an entry: serve its PDF, DOCX, PPTX, XLSX, CSV and HTML files as `to` (Markdown), within these
    per-document limits (`defaults.convert` sets them for every entry; an entry's own keys override those)."""

    to: str = "markdown"
    max_input_bytes: int = 64 * 1024 * 1024
    """Largest document read for conversion (the source's maxBytes does not apply to it)."""
    max_unzipped_bytes: int = 256 * 1024 * 1024
    """Office files are zip archives: the sum of their parts' uncompressed sizes, checked before parsing."""
    max_pages: int = 500
    """PDF pages, slides or sheets converted; the text says where it stopped."""
    max_rows: int = 10_000
    """Spreadsheet and CSV rows converted (all sheets together); the text says where it stopped."""
    max_chars: int = 200_000
    """Characters of Markdown served; the text says where it was cut."""
    timeout: float = 30.0
    """Seconds one conversion may take; past it the worker is killed and replaced."""
    max_memory: int = 1024 * 1024 * 1024
    """Address space a conversion worker may map (RLIMIT_AS); past it the conversion fails and the worker is replaced."""


@dataclass(frozen=True, slots=True)
class Defaults:
    ttl: float = 300.0
    """Seconds content stays cached (and the `ttlMs` hint given to modern clients)."""
    max_bytes: int = 10 * 1024 * 1024
    """Largest resource body served; bigger ones are refused with a clear error."""
    cache_bytes: int = 256 * 1024 * 1024
    """Memory budget of the whole content cache, shared by every source."""
    timeout: float = 30.0
    max_concurrency: int = 8
    stale_if_error: float = 0.0
    convert: ConvertSettings = field(default_factory=ConvertSettings)
    """The limits of `convert:` entries that do not set their own."""


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """A declared source: the keys every kind has, and the kind's own (`settings`, as its declaration parsed them)."""

    id: str
    url: str
    """For local folders an absolute path (resolved against the manifest's folder); otherwise the URL as written."""
    protocol: str
    """`file` for local folders, `sql` for databases, `git` for repositories, else the URL's scheme (fsspec's name)."""
    where: Location
    key: str
    kind: str = "file"
    """The registered source kind that opens it (aggregator.sources.registry), chosen by the URL's scheme."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """The kind's own keys as the manifest spells them (`headers`, `ref`, `tables`...), parsed, defaults filled."""
    ttl: float | None = None
    max_bytes: int | None = None
    description: str | None = None
    timeout: float = 30.0
    """Seconds one backend call may take."""
    max_concurrency: int = 8
    """Backend calls in flight at once for this source."""
    stale_if_error: float = 0.0
    """Seconds past expiry a cached copy may still be served when the backend fails."""
    poll: float | None = None
    """Remote sources: seconds between change checks of subscribed resources and collections."""
    access: frozenset[str] = frozenset()
    """Scopes a caller needs for every entry this source serves."""
    optional: bool = False
    """validate reports this source being unreachable (or a file it lacks) as a warning rather than an error."""


def is_url(name: str) -> bool:
    """Whether a manifest name (or a reference to one) is a URL rather than a local path."""
    return "://" in name and not name.startswith("file://")


def namespaced_uri(namespace: str | None, uri: str) -> str:
    """`docs://x` -> `team-a+docs://x`: the namespace joins the URI's scheme (`+` is allowed in schemes)."""
    if not namespace:
        return uri
    scheme, sep, rest = uri.partition(":")
    return f"{namespace}+{scheme}{sep}{rest}" if sep else f"{namespace}+{uri}"


@dataclass(frozen=True, slots=True)
class Render:
    """A `render:` Jinja2 template, and the namespace of the include that wrote it.

    Inside a namespaced include, the URIs a template names are the include's own: `read('docs://a')` means
    `team-a+docs://a`. A URI that already carries the namespace is taken as it is.
    """

    text: str
    namespace: str | None = None

    def uri(self, written: str) -> str:
        """The catalog's URI for a URI (or prefix) the template wrote."""
        if not self.namespace or written.startswith(self.namespace + "+"):
            return written
        return namespaced_uri(self.namespace, written)

    def within(self, namespace: str | None) -> Render:
        """This template as seen after its manifest is included under `namespace` (namespaces nest)."""
        if not namespace:
            return self
        return Render(self.text, f"{namespace}+{self.namespace}" if self.namespace else namespace)


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    """One listed resource: a file of a source (`source` + `path`), inline `text` or a `render` template."""

    uri: str
    name: str
    display: Display
    where: Location
    key: str
    source: str | None = None
    path: str | None = None
    text: str | None = None
    size: int | None = None
    access: frozenset[str] = frozenset()
    """Scopes a caller needs (the source's included) to list, read or subscribe."""
    render: Render | None = None
    """A Jinja2 template producing the content (sandboxed; reads other resources through `read()`)."""
    decompress: bool = False
    """A file whose name ends in `.gz` is served decompressed (bounded by maxBytes), typed by its name without `.gz`."""
    convert: ConvertSettings | None = None
    """Its PDF, DOCX, PPTX, XLSX, CSV and HTML files are served converted (to Markdown); None: as they are."""


@dataclass(frozen=True, slots=True)
class CollectionSpec:
    """Every file of `source` matching `glob` becomes a listed resource.

    `uri`, `name` and `title` are patterns over {path}, {name}, {stem} and {ext}.
    """

    source: str
    glob: str
    uri: str
    name: str
    display: Display
    where: Location
    key: str
    exclude: tuple[str, ...] = ()
    access: frozenset[str] = frozenset()
    """Scopes a caller needs (the source's included) to list, read or subscribe."""
    hidden: bool = False
    """Wildcards match hidden names (`.env`, `.git/`) too; otherwise only a glob that spells the dot does."""
    decompress: bool = False
    """A file whose name ends in `.gz` is served decompressed (bounded by maxBytes), typed by its name without `.gz`."""
    convert: ConvertSettings | None = None
    """Its PDF, DOCX, PPTX, XLSX, CSV and HTML files are served converted (to Markdown); None: as they are."""
    index: bool = False
    """The text of its files goes into the full-text search index (search_resources, search://)."""


@dataclass(frozen=True, slots=True)
class TemplateSpec:
    """An RFC 6570 `uriTemplate` whose variables fill `path` (same {var} names) inside `source`."""

    uri_template: str
    name: str
    source: str | None
    path: str | None
    display: Display
    where: Location
    key: str
    query: str | None = None
    """SQL sources: a query whose :name parameters are bound from the template's variables."""
    format: str = "json"
    access: frozenset[str] = frozenset()
    """Scopes a caller needs (the source's included) to list, read or subscribe."""
    values: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Completion values per variable name."""
    render: Render | None = None
    """A Jinja2 template producing the content (sandboxed; reads other resources through `read()`)."""
    hidden: bool = False
    """Variables may name hidden files and folders (a segment starting with '.'); refused otherwise."""
    decompress: bool = False
    """A file whose name ends in `.gz` is served decompressed (bounded by maxBytes), typed by its name without `.gz`."""
    convert: ConvertSettings | None = None
    """Its PDF, DOCX, PPTX, XLSX, CSV and HTML files are served converted (to Markdown); None: as they are."""


@dataclass(frozen=True, slots=True)
class Manifest:
    path: Path
    server: ServerSettings
    defaults: Defaults
    sources: Mapping[str, SourceSpec]
    resources: tuple[ResourceSpec, ...] = ()
    collections: tuple[CollectionSpec, ...] = ()
    templates: tuple[TemplateSpec, ...] = ()
    files: tuple[Path, ...] = ()
    """Every local file this manifest was built from (itself, extends bases, includes): what a reload watches."""
    render: RenderSettings = field(default_factory=RenderSettings)
    """Only the root manifest's `render:` counts, like its `server:`."""
    digest: str = ""
    """sha256 (hex) of the bytes of every file the manifest was built from, in load order: equal on two replicas
    exactly when they serve the same manifest (mtimes and paths play no part)."""


@dataclass(frozen=True, slots=True)
class ManifestIssue:
    """One located problem in a manifest."""

    file: str
    line: int
    col: int
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.key or '<root>'}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "col": self.col, "key": self.key, "message": self.message}


class ManifestError(Exception):
    """A manifest could not be loaded; `issues` lists every problem found, in file order."""

    def __init__(self, issues: list[ManifestIssue]) -> None:
        self.issues = sorted(issues, key=lambda i: (i.file, i.line, i.col, i.key))
        super().__init__("\n".join(str(i) for i in self.issues))

    @classmethod
    def at(cls, where: Location, key: str, message: str) -> ManifestError:
        return cls([ManifestIssue(where.file, where.line, where.col, key, message)])
