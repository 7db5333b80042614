"""The built-in kinds' declarations: local folders, HTTP, git, SQL databases, other MCP servers and fsspec's
filesystems.

Light on purpose (see `aggregator.sources.kind`): each names its `Source` class by string, imported when a source
opens, so a manifest validates without the kind's extra installed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aggregator.manifest.source_urls import file_url_path, is_remote_git, local_path, url_scheme
from aggregator.manifest.units import parse_size
from aggregator.paths import url_start
from aggregator.sources.kind import EMPTY, KeyPath, Setting, SourceKind

if TYPE_CHECKING:
    from aggregator.manifest.model import SourceSpec
    from aggregator.sources.base import Source

__all__ = ["FsspecKind", "GitKind", "HttpKind", "LocalKind", "McpKind", "SqlKind", "SQL_SCHEMES"]

SQL_SCHEMES = frozenset({"sqlite", "postgresql", "postgres", "mysql", "mariadb", "mssql", "oracle"})

# fsspec options that send a source's requests elsewhere (s3fs endpoint_url, client_kwargs, proxies...): from a
# manifest read from a URL they could reach this machine's private network as allowPrivateNetwork would.
_REDIRECTING_OPTION = re.compile(r"endpoint|url|host|proxy|client_kwargs|config_kwargs", re.IGNORECASE)


class LocalKind(SourceKind):
    """A folder on this machine: a path, `~/...`, a file:// URL or local:// (fsspec's other name for one, which
    must not open fsspec's own, unconfined, local filesystem)."""

    name = "file"
    schemes = frozenset({"file", "local"})
    source = "aggregator.sources.local:LocalSource"
    url_help = "a local folder (relative to this manifest's folder, or file://...)"

    def protocol(self, scheme: str) -> str:
        return "file"

    def locate(self, url: str, base: Path) -> str:
        return local_path(file_url_path(url) if url.lower().startswith(("file://", "local://")) else url, base)

    def reads_this_machine(self, url: str) -> bool:
        return True

    def open(self, spec: SourceSpec) -> Source:
        return self.load()(spec.id, spec.url, timeout=spec.timeout,  # type: ignore[call-arg]
                           max_concurrency=spec.max_concurrency)


def _networks(value: bool | list[str]) -> bool | tuple[str, ...]:
    return tuple(value) if isinstance(value, list) else bool(value)


class HttpKind(SourceKind):
    """An HTTP base URL: paths are URL paths under it."""

    name = "http"
    schemes = frozenset({"http", "https"})
    source = "aggregator.sources.http:HttpSource"
    extra = "http"
    url_help = "https://host/base"
    settings = {
        "headers": Setting({
            "description": "HTTP and mcp+https sources: request headers, e.g. Authorization: \"Bearer ${TOKEN}\". Never sent "
                           "anywhere else, never logged.",
            "type": "object", "additionalProperties": {"type": "string"}}, EMPTY, dict),
        "allowPrivateNetwork": Setting({
            "description": "HTTP and mcp+https sources: true allows loopback, link-local and private addresses; a list allows only "
                           "those networks (e.g. [\"10.0.0.0/8\"]). Refused by default.",
            "oneOf": [{"type": "boolean"},
                      {"type": "array", "items": {"type": "string", "pattern": "^[0-9A-Fa-f:.]+(/\\d{1,3})?$",
                                                  "description": "An IP network such as 10.0.0.0/8 or fd00::/8."}}],
            "default": False}, False, _networks),
    }

    def remote_refusals(self, url: str, keys: Mapping[str, Any]) -> Iterator[tuple[KeyPath, str]]:
        yield from super().remote_refusals(url, keys)
        if keys.get("allowPrivateNetwork"):
            yield ("allowPrivateNetwork",), "open private networks to HTTP sources"

    def open(self, spec: SourceSpec) -> Source:
        return self.load()(spec.id, spec.url, headers=spec.settings["headers"],  # type: ignore[call-arg]
                           allow_private_network=spec.settings["allowPrivateNetwork"], timeout=spec.timeout,
                           max_concurrency=spec.max_concurrency)


class GitKind(SourceKind):
    """A git repository's tree at a ref: git+file://, git+https://, git+ssh://."""

    name = "git"
    source = "aggregator.sources.git:open_git"
    extra = "git"
    url_help = "git+file://./repo or git+https://host/repo.git"
    settings = {
        "ref": Setting({"description": "git sources: the branch, tag or commit whose tree is served (default HEAD).",
                        "type": "string", "pattern": "^[^-\\s][^\\s]*$"}),
    }

    def claims(self, scheme: str) -> bool:
        return scheme.startswith("git+")

    def protocol(self, scheme: str) -> str:
        return "git"

    def locate(self, url: str, base: Path) -> str:
        url = url[len("git+"):]
        return local_path(file_url_path(url), base) if url.lower().startswith("file://") else url

    def reads_this_machine(self, url: str) -> bool:
        return not is_remote_git(url)

    def open(self, spec: SourceSpec) -> Source:
        open_git = self.load()  # a function: it clones or fetches before the source exists
        return open_git(spec.id, spec.url, spec.settings["ref"], timeout=spec.timeout,  # type: ignore[call-arg]
                        max_concurrency=spec.max_concurrency)


class SqlKind(SourceKind):
    """A database: its tables and views are the files, templates may run queries."""

    name = "sql"
    source = "aggregator.sources.sql:SqlSource"
    extra = "sql"
    url_help = "a database URL (sqlite:///data/app.db relative to this manifest, postgresql+psycopg://..., " \
               "mysql+pymysql://...)"
    runs_queries = True
    settings = {
        "tables": Setting({
            "description": "SQL sources: which tables and views to list and serve, by name or glob (default all).",
            "type": "array",
            "items": {"type": "string", "minLength": 1, "description": "A table or view name, or a glob of them."}},
            (), tuple),
        "sampleRows": Setting({
            "description": "SQL sources: how many sample rows each table's schema document shows (default 0).",
            "type": "integer", "minimum": 0, "maximum": 100}, 0),
        "rowLimit": Setting({
            "description": "SQL sources: most rows a query returns (default 1000); more are cut and marked "
                           "truncated.",
            "type": "integer", "minimum": 1, "maximum": 1000000}, 1000),
        "checksum": Setting({
            "description": "SQL sources: a query whose result changes when the data does (e.g. SELECT count(*), "
                           "max(updated_at) FROM t); polled with poll: to send updated.",
            "type": "string", "minLength": 1}),
    }

    def claims(self, scheme: str) -> bool:
        return scheme.split("+", 1)[0] in SQL_SCHEMES

    def protocol(self, scheme: str) -> str:
        return "sql"

    def locate(self, url: str, base: Path) -> str:
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and url != "sqlite:///:memory:":
            # sqlite:///data/app.db is relative (three slashes); sqlite:////abs/app.db is absolute.
            return "sqlite:///" + local_path(url[len("sqlite:///"):], base)
        return url

    def reads_this_machine(self, url: str) -> bool:
        return url.startswith("sqlite")

    def open(self, spec: SourceSpec) -> Source:
        s = spec.settings
        return self.load()(spec.id, spec.url, tables=s["tables"],  # type: ignore[call-arg]
                           sample_rows=s["sampleRows"], row_limit=s["rowLimit"], checksum=s["checksum"],
                           timeout=spec.timeout, max_concurrency=spec.max_concurrency)


def _message_bytes(value: Any) -> int:
    size = parse_size(value)
    if size < 1024:
        raise ValueError("maxMessageBytes must be at least 1KiB")
    return size


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(value)


MCP_STDIO = "mcp+stdio"
MCP_MAX_ENTRIES = 1_000_000
"""An upstream listing's default cap (maxEntries): the scale the catalog is built for."""
MCP_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The default cap on one upstream message (maxMessageBytes)."""
"""`mcp+stdio:` (the child runs in the manifest's folder) or `mcp+stdio:./dir` (in that folder)."""


class McpKind(SourceKind):
    """Another MCP server's resources: a command started over stdio (`mcp+stdio:` with `command`), or a Streamable
    HTTP endpoint (`mcp+https://host/mcp`, `mcp+http://...`; plain https:// is the http kind's). Paths are the
    upstream's resource URIs under `prefix`; the official client negotiates the wire."""

    name = "mcp"
    schemes = frozenset({MCP_STDIO, "mcp+https", "mcp+http"})
    source = "aggregator.sources.mcp:open_mcp"
    url_help = "mcp+stdio: (with command) or mcp+https://host/mcp (another MCP server's resources)"
    settings = {
        "command": Setting({
            "description": "mcp+stdio sources: the upstream server's command line, e.g. [\"npx\", \"some-server\"]; "
                           "it runs in the manifest's folder (or the folder after mcp+stdio:).",
            "type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}, (), _strings),
        "env": Setting({
            "description": "mcp+stdio sources: environment variables of the upstream's process (besides a minimal "
                           "HOME, PATH...; nothing else of ours is inherited). ${VAR} references are resolved.",
            "type": "object", "additionalProperties": {"type": "string"}}, EMPTY, dict),
        "headers": HttpKind.settings["headers"],
        "oauth": Setting({
            "description": "mcp+https sources: OAuth client credentials (the client_credentials grant) for an upstream "
                           "that asks for a token: the token comes from the authorization server the upstream names, "
                           "which must be `issuer`. Take the secret from the environment (${VAR}).",
            "type": "object", "additionalProperties": False, "required": ["clientId", "clientSecret", "issuer"],
            "properties": {
                "clientId": {"type": "string", "minLength": 1,
                             "description": "The client id registered with the authorization server."},
                "clientSecret": {"type": "string", "minLength": 1,
                                 "description": "The client's secret: write ${VAR}, never the secret itself."},
                "issuer": {"type": "string", "pattern": "^https?://",
                           "description": "The authorization server's issuer URL the credentials belong to."},
                "scope": {"type": "string", "description": "Scopes to ask for, space-separated."}}}, None, dict),
        "allowPrivateNetwork": HttpKind.settings["allowPrivateNetwork"],
        "prefix": Setting({
            "description": "mcp sources: the upstream URI prefix that globs and paths are relative to, e.g. "
                           "file:///docs/ (only URIs under it are listed; glob: \"**/*.md\" then matches "
                           "file:///docs/a/b.md as a/b.md). A glob or path that spells the prefix again, or an "
                           "upstream URI where nothing could match it, is refused with the spelling to use.",
            "type": "string"}, ""),
        "namespace": Setting({
            "description": "mcp sources: list every upstream resource and template (under prefix) as NS+uri "
                           "(docs://a becomes NS+docs://a), described as the upstream describes it; reads and "
                           "completion are forwarded. Collections over the source work with or without it.",
            "type": "string", "pattern": "^[a-z][a-z0-9-]{0,39}$"}),
        "maxEntries": Setting({
            "description": "mcp sources: most resources (and, apart, templates) one listing of the upstream keeps "
                           "(default 1000000); the listing stops there, following at most maxEntries/10 pages, and "
                           "says once in the log that it was cut. With a namespace, URIs past the cap still read "
                           "from the upstream.",
            "type": "integer", "minimum": 1, "maximum": 100000000, "default": MCP_MAX_ENTRIES}, MCP_MAX_ENTRIES),
        "maxMessageBytes": Setting({
            "description": "mcp sources: largest single message taken from the upstream, e.g. 64MiB (the default); "
                           "a bigger one fails that listing or read with an error naming the source, and the rest "
                           "keeps serving.",
            "$ref": "#/$defs/size"}, MCP_MAX_MESSAGE_BYTES, _message_bytes),
    }

    def protocol(self, scheme: str) -> str:
        return "mcp"

    def locate(self, url: str, base: Path) -> str:
        if url_scheme(url) != MCP_STDIO:
            return url
        folder = url.split(":", 1)[1].removeprefix("//")
        return f"{MCP_STDIO}:{local_path(folder or '.', base)}"

    def reads_this_machine(self, url: str) -> bool:
        return url_scheme(url) == MCP_STDIO

    def remote_refusals(self, url: str, keys: Mapping[str, Any]) -> Iterator[tuple[KeyPath, str]]:
        if self.reads_this_machine(url):
            yield ("url",), "run commands on this machine (mcp+stdio)"
        for key in ("command", "env"):
            if key in keys:
                yield (key,), "run commands on this machine (mcp+stdio)"
        if keys.get("allowPrivateNetwork"):
            yield ("allowPrivateNetwork",), "open private networks to MCP upstreams"

    def publishes(self, settings: Mapping[str, Any]) -> bool:
        return bool(settings.get("namespace"))

    def path_issue(self, source: str, keys: Mapping[str, Any], role: str, value: str) -> str | None:
        """A glob or path is what follows `prefix`: one that spells it again, or spells a scheme (`x://`) where
        nothing could then match, is refused with the spelling that works. A namespaced source without a prefix
        reads whole URIs (it publishes its upstream's templates that way): its templates may spell them."""
        prefix = keys.get("prefix")
        prefix = prefix if isinstance(prefix, str) else ""
        label = {"exclude": "exclude glob", "template path": "path"}.get(role, role)
        fix = {"exclude": "", "template path": "path: "}.get(role, f"{role}: ")
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        if prefix and value.startswith(prefix) and len(value) > len(prefix):
            return (f"{label} {shown} repeats the prefix of source {source!r} ({prefix!r}): paths are what follows "
                    f"it; write {fix}{_yaml_string(value[len(prefix):])}")
        if "://" not in value or role == "path" or (role == "template path" and keys.get("namespace") and not prefix):
            return None
        if prefix:
            return f"{label} {shown} spells an upstream URI; paths of source {source!r} are what follows its prefix " \
                   f"{prefix!r}"
        scheme = url_start(value)
        how = (f"set prefix: {_yaml_string(scheme)} on the source and write {fix}{_yaml_string(value[len(scheme):])}"
               if scheme else "give the source a prefix")
        return (f"{label} {shown} spells the upstream's URI; paths of source {source!r} are what follows its prefix, "
                f"and it has none: {how}")

    def open(self, spec: SourceSpec) -> Source:
        open_mcp = self.load()  # a function: it builds the upstream connection the source reads through
        return open_mcp(spec)  # type: ignore[call-arg]


def _yaml_string(text: str) -> str:
    """`text` as a double-quoted YAML (and JSON) string, for a message that says what to write."""
    return json.dumps(text)


URL_MANIFEST_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "memory"})
"""The fsspec protocols a manifest read from a URL may name: object stores behind their providers' endpoints (and
this process's memory). Others may reach this machine's files (zip, tar, dir, the caching wrappers, reference) or
any host of its network without the address guard HTTP sources have (ftp, sftp, smb, webhdfs ...)."""


class FsspecKind(SourceKind):
    """Any other protocol, opened with fsspec's implementation of that name (s3, gcs, az, memory ...): the
    registry's fallback for URLs no kind claims."""

    name = "fsspec"
    source = "aggregator.sources.filesystem:FsspecSource"
    url_help = "or any fsspec protocol://... such as s3://bucket/prefix"
    settings = {
        "options": Setting({
            "description": "Options passed to the source's backend (credentials, endpoints); ${VAR} references are "
                           "resolved.",
            "type": "object"}, EMPTY, dict),
    }

    def remote_refusals(self, url: str, keys: Mapping[str, Any]) -> Iterator[tuple[KeyPath, str]]:
        yield from super().remote_refusals(url, keys)
        scheme = url_scheme(url)
        if scheme not in URL_MANIFEST_PROTOCOLS:
            yield ("url",), (f"open the fsspec protocol {scheme!r}: from a URL manifest only object stores may be "
                             f"named ({', '.join(sorted(URL_MANIFEST_PROTOCOLS))})")
        for option in keys.get("options", {}):
            if _REDIRECTING_OPTION.search(option):
                yield ("options", option), "point a source at another endpoint (options that name a host, URL or proxy)"

    def open(self, spec: SourceSpec) -> Source:
        fsspec_source: Any = self.load()  # FsspecSource: opened by its from_url
        source: Source = fsspec_source.from_url(spec.id, spec.protocol, spec.url, spec.settings["options"],
                                                timeout=spec.timeout, max_concurrency=spec.max_concurrency)
        return source
