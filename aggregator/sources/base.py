"""The one interface every source kind implements, and the errors it may raise.

Sources know files and bytes, nothing of MCP. Paths are '/'-separated and relative to the source root;
callers pass them through `aggregator.paths.safe_relpath` first.
"""

from __future__ import annotations

import builtins  # `builtins.list` in annotations below the class's own `list` method
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import anyio


@dataclass(frozen=True, slots=True)
class FileInfo:
    path: str
    """Relative to the source root, '/'-separated."""
    size: int | None = None
    mtime: float | None = None
    """Seconds since the epoch, UTC."""
    version: str | None = None
    """ETag, object id or mtime+size: equal versions mean equal bytes (None when the backend gives none)."""
    mime_type: str | None = None
    """The type the backend knows the file to have (a SQL table's schema document is JSON), if any."""


class TextBytes:
    """Bytes held as `raw`, or (`raw` None) as the UTF-8 of `text`, encoded only if `data` is asked for: a relayed
    text is served as the text it came as."""

    __slots__ = ()
    raw: bytes | None
    text: str | None

    @property
    def data(self) -> bytes:
        """The bytes (the text's UTF-8, encoded once, when `raw` is None)."""
        raw = self.raw
        if raw is None:
            raw = self.raw = (self.text or "").encode("utf-8")  # type: ignore[misc]  # a subclass's slot
        return raw


@dataclass(slots=True)
class Blob(TextBytes):
    """A file's bytes as read, with what the backend said about them."""

    raw: bytes | None
    """The bytes; None when they are the UTF-8 of `text`, not encoded until `data` is asked for (a relayed text is
    served as the text it came as)."""
    mime_type: str | None = None
    """The type the backend declared (an HTTP Content-Type), if any."""
    version: str | None = None
    max_age: float | None = None
    """Seconds the backend says the bytes may be kept, if it says (an MCP upstream's ttlMs)."""
    private: bool = False
    """The backend says the bytes depend on who asked (an MCP upstream's cacheScope: private)."""
    text: str | None = None
    """The bytes as the text the backend sent, when it sent text (an MCP upstream's): `data` is its UTF-8, which a
    read need not decode again."""


@dataclass(frozen=True, slots=True)
class PublishedResource:
    """A resource a backend publishes itself (another MCP server), at the URI the catalog lists it under."""

    uri: str
    path: str
    """What `read` takes to read it."""
    name: str
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    size: int | None = None
    mtime: float | None = None


@dataclass(frozen=True, slots=True)
class PublishedTemplate:
    """A URI template a backend publishes itself: URIs matching `uri_template` read the path `path` expands to
    (an RFC 6570 template with the same variables)."""

    uri_template: str
    path: str
    name: str
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None


@runtime_checkable
class LocatedResources(Protocol):
    """Published resources kept as columns (`upstream.records.PublishedRecords`): where each is, without building
    it."""

    def locations(self, paths: Collection[str] | None = None) -> Iterable[tuple[str, str]]:
        """(URI, path) of each resource (only those at `paths`, when given)."""


@dataclass(frozen=True, slots=True)
class Published:
    resources: Sequence[PublishedResource] = ()
    templates: Sequence[PublishedTemplate] = ()

    def locations(self, paths: Collection[str] | None = None) -> Iterable[tuple[str, str]]:
        """(URI, path) of each published resource (only those at `paths`, when given), in no set order: over columns
        without building a resource each (a million: a change to a few paths looks up those paths)."""
        resources = self.resources
        if isinstance(resources, LocatedResources):
            return resources.locations(paths)
        return ((r.uri, r.path) for r in resources if paths is None or r.path in paths)


class SourceError(Exception):
    """A backend failure. Its message is for the server log only, never for a client."""


class SourceNotFound(SourceError):
    """No such file in the source (or the path was refused as unsafe)."""


class SourceTooLarge(SourceError):
    """The file is bigger than the read limit."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"{size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class SourceUnsupported(SourceError):
    """The source cannot do what was asked (a query on a source that runs none)."""


FileSink = Callable[[str, int | None, float | None, str | None], None]
"""What `Source.scan` tells of each file: its path, size, mtime and the type the backend knows it to have."""
ChangeCallback = Callable[[frozenset[str] | None], Awaitable[None]]
"""Told of a backend's own change events: the paths that may have changed, or None when the listing may have."""

POLL_CONCURRENCY = 8
"""Version checks one `poll` runs at once by default."""


class RelayRoute(Protocol):
    """Reads of one path of a source sent without a task (`Source.relay_route`). `sent` is the read's own object
    (the upstream's `lane.Sent`: the route's kind names what it must be), told its answer where it arrives."""

    def send(self, sent: Any) -> bool:
        """Send a read now, a slot of the source's concurrency cap held for it; False: nothing sent (read it the
        usual way)."""

    def settle(self, sent: Any, answer: Any) -> Blob | None:
        """The blob `read` returns of `sent`'s answer (its slot freed), None when the connection was lost under it
        (read again the usual way); raises what `read` raises."""

    def release(self, sent: Any) -> None:
        """Free the slot of a read given up before its answer."""


class Source(ABC):
    """A place files come from: list them, stat one, read one (in the spirit of httpx's `AsyncBaseTransport`).

    A kind implements the four abstract methods; the others have defaults a kind overrides when its backend can do
    better (a SQL source versions its data, a local folder has change events, an HTTP client holds a pool to close).
    """

    id: str
    url_paths: ClassVar[bool] = False
    """True when paths become URL paths and queries (HTTP): template values are percent-encoded into them."""
    byte_names: ClassVar[bool] = False
    """True when names are bytes (local folders): a %XX that is not UTF-8 in a URI names those bytes."""

    @abstractmethod
    async def list(self, pattern: str, exclude: Sequence[str] = (), hidden: bool = False) -> list[FileInfo]:
        """Every file whose relative path matches the glob `pattern` and none of `exclude` (wildcards match
        hidden names only when `hidden`)."""

    async def scan(self, pattern: str, exclude: Sequence[str], hidden: bool, sink: FileSink) -> None:
        """`sink(path, size, mtime, mime_type)` for each file `list` gives, maybe in the source's own thread as it
        lists (a local folder: no list of a million FileInfo first). By default `list`, then each."""
        for info in await self.list(pattern, exclude, hidden=hidden):
            sink(info.path, info.size, info.mtime, info.mime_type)

    @abstractmethod
    async def stat(self, path: str) -> FileInfo:
        """Size and modification time of one file; SourceNotFound if absent."""

    @abstractmethod
    async def read(self, path: str, max_bytes: int) -> Blob:
        """The whole file; SourceTooLarge if it holds more than `max_bytes`."""

    def relay_route(self, path: str, max_bytes: int) -> RelayRoute | None:
        """Where reads of `path` (at most `max_bytes`) can be sent without a task, their outcomes handed over in a
        callback; None when the source cannot (the caller awaits `read`). Only a source whose reads cross a pipe it
        holds can."""
        return None

    @abstractmethod
    def describe(self) -> str:
        """A short label for logs (no credentials)."""

    async def stat_many(self, paths: Iterable[str], folders: bool = False) -> tuple[builtins.list[FileInfo], set[str]]:
        """The stat of each of `paths` that is a file now, and the others (gone, not a regular file, or a name the
        source refuses). With `folders`, every file under each of them that is a folder now is found too (a
        watcher names a folder moved in, not its files). One `stat` after another by default, and no folders (only
        a kind with folders on this machine is watched); a kind whose calls hop to a thread does one hop."""
        found: builtins.list[FileInfo] = []
        missing: set[str] = set()
        for path in paths:
            try:
                found.append(await self.stat(path))
            except SourceError:
                missing.add(path)
        return found, missing

    async def aclose(self) -> None:
        """Release what the source holds open (connection pools); called once, after its last read."""

    async def probe(self) -> None:
        """Reach the backend once (validate); SourceError if it cannot be reached. Nothing to check by default."""

    async def version(self, path: str | None) -> str | None:
        """The current version of file `path` (None when it is gone), or with None, of the data queries read (None
        when the backend keeps none): equal versions mean equal bytes. By default a stat's version, else
        mtime and size."""
        if path is None:
            return None
        try:
            info = await self.stat(path)
        except SourceNotFound:
            return None
        return info.version or f"{info.mtime}:{info.size}"

    async def poll(self, paths: Collection[str | None]) -> Mapping[str | None, str | None]:
        """The current `version` of each of `paths` (what a `poll:` interval compares), a few at a time."""
        found: dict[str | None, str | None] = {}
        slots = anyio.Semaphore(POLL_CONCURRENCY)

        async def one(path: str | None) -> None:
            async with slots:
                found[path] = await self.version(path)

        async with anyio.create_task_group() as tg:
            for path in paths:
                tg.start_soon(one, path)
        return found

    async def query(self, sql: str, params: Mapping[str, str | None], fmt: str, max_bytes: int) -> Blob:
        """Run a template's query with `params` bound; SourceUnsupported unless the kind runs queries."""
        raise SourceUnsupported(f"{self.describe()} runs no queries")

    def watch_root(self) -> str | None:
        """The local folder whose file events say what changed, or None: such a source is watched, not polled."""
        return None

    def plain_folders(self) -> Mapping[str, int]:
        """Folders under `watch_root()` that its last full listing found holding neither subfolders nor links, with
        their modification time (ns) then: while that is still their time they still hold none, and a watcher
        setting up needs not read them again (`folder_watch.folders_under`). Empty when unknown."""
        return {}

    def folder_times(self) -> Mapping[str, int]:
        """Every folder under `watch_root()` that its last full listing read a while after it last changed, with
        its modification time (ns) then: a watcher that comes up later looks again at those whose time moved since
        (a change between the listing and the watch). Empty when unknown."""
        return {}

    @property
    def publishes(self) -> bool:
        """True when the backend publishes its own resources and templates (`published`), which the catalog lists
        beside the manifest's collections."""
        return False

    async def published(self) -> Published:
        """What the backend publishes itself, under the URIs it is to be listed at; nothing by default."""
        return Published()

    @property
    def forwarded_prefix(self) -> str | None:
        """A URI prefix under which URIs the backend did not publish still read from it (what follows the prefix
        is the path), or None: only what it publishes. A namespaced upstream forwards its whole namespace, since
        its listing may have been cut at its cap."""
        return None

    @property
    def uri_paths(self) -> bool:
        """True when paths are another server's URIs: a published template's path is expanded by its own RFC 6570
        template and judged by that server (no file-path rules apply)."""
        return False

    pushes_changes: ClassVar[bool] = False
    """True when the backend tells of its own changes (`changes`): such a source is neither watched nor polled."""

    def changes(self, callback: ChangeCallback | None) -> None:
        """Deliver the backend's change events to `callback` (None: stop). The callback only takes note (it may run
        inside the backend's own connection): the work it causes runs elsewhere. Nothing by default."""

    def want(self, paths: Collection[str]) -> None:
        """The paths whose content changes are wanted (what clients subscribed to), replacing the previous set;
        listing changes are always wanted. Nothing to do by default."""

    async def complete_path(self, path_template: str, name: str, value: str,
                            context: Mapping[str, str] | None = None) -> Sequence[str] | None:
        """Values the backend itself offers for variable `name` (starting with `value`) of a template's `path`
        (another MCP server completes its own templates), or None: complete from the listing (the default)."""
        return None

    def health(self) -> Mapping[str, object] | None:
        """The backend connection's state for /healthz and /metrics (`state`, `reconnects`...), or None when the
        source keeps no connection of its own."""
        return None
