"""Any fsspec filesystem as a source: S3 (s3fs), git (pygit2), memory, gcs, azure ... chosen by URL protocol.

The bucket or repository and root prefix come from the manifest; a request only ever adds a relative path that
passed `safe_relpath`, so it cannot change protocol, bucket or host. Calls run in worker threads, bounded
by the source's `maxConcurrency` and `timeout`. Filesystems are opened without a listings cache, so `stat`
(what revalidation calls) asks the store about the object itself, e.g. an S3 HEAD, never an earlier listing.
"""

from __future__ import annotations

import builtins  # `builtins.list` in annotations below the class's own `list` method
import gc
import hashlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import fsspec
import fsspec.asyn

from aggregator.globs import glob_prefix, path_filter
from aggregator.manifest.source_urls import S3_SCHEMES
from aggregator.paths import UnsafePath, safe_relpath
from aggregator.sources.base import Blob, FileInfo, Source, SourceError, SourceNotFound, SourceTooLarge
from aggregator.sources.progress import ListingProgress

__all__ = ["FsspecSource", "info_version"]

T = TypeVar("T")
_READ_CHUNK = 1024 * 1024


def info_version(info: Mapping[str, Any]) -> str | None:
    """A version string from an fsspec info dict: ETag, object id, or modification time with size."""
    for key in ("ETag", "etag", "hex", "md5Hash", "generation", "VersionId"):
        value = info.get(key)
        if value:
            return f"{key}:{str(value).strip(chr(34))}"
    mtime = _mtime(info)
    return f"mtime:{mtime!r}:{info.get('size')}" if mtime is not None else None


def _mtime(info: Mapping[str, Any]) -> float | None:
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, (int, float)):
            return float(value)
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
    return None


class FsspecSource(Source):
    """Files under `root` of an fsspec filesystem."""


    def __init__(self, id: str, fs: fsspec.AbstractFileSystem, root: str, *, label: str,
                 timeout: float = 30.0, max_concurrency: int = 8) -> None:
        self.id = id
        self.fs = fs
        self.root = root.rstrip("/")
        self._label = label
        self._timeout = timeout
        self._limiter = anyio.CapacityLimiter(max_concurrency)

    @classmethod
    def from_url(cls, id: str, protocol: str, url: str, options: Mapping[str, Any], **limits: Any) -> FsspecSource:
        """Open `url` with fsspec's `protocol` implementation; SourceError if the protocol is unknown or fails."""
        try:
            fs_class = fsspec.get_filesystem_class(protocol)
        except (ValueError, ImportError) as exc:
            raise SourceError(f"no filesystem for protocol {protocol!r}: {exc}") from None
        if protocol in S3_SCHEMES:
            # botocore's retries: bounded, none for a refused connection, and not retried again by s3fs
            from aggregator.s3_client import OneRetryLoopS3, s3_options

            fs_class, options = OneRetryLoopS3, s3_options(options)
        # No listings cache: s3fs and others answer info() from the last listing, so an updated object would
        # keep its old version (and a store that went down would look fine) for as long as the process lives.
        # Revalidation must ask the store for the object itself.
        fs, failure = _construct(fs_class, {**options, "use_listings_cache": False})
        if fs is None:
            raise SourceError(f"cannot open a {protocol} filesystem: {failure}")
        root = fs_class._strip_protocol(url)
        return cls(id, fs, root, label=f"{protocol}://{root}", **limits)

    def describe(self) -> str:
        return self._label

    def full_path(self, path: str) -> str:
        try:
            safe_relpath(path)
        except UnsafePath as exc:
            raise SourceNotFound(f"refused path: {exc}") from None
        return f"{self.root}/{path}" if self.root else path

    async def _call(self, func: Callable[..., T], *args: Any, timeout: float | None = -1) -> T:
        """Run a blocking backend call in a thread, under the source's concurrency limit and timeout."""
        limit = self._timeout if timeout == -1 else timeout
        async with self._limiter:
            try:
                with anyio.fail_after(limit):
                    return await anyio.to_thread.run_sync(func, *args, abandon_on_cancel=True)
            except TimeoutError:
                raise SourceError(f"{self._label}: no answer within {limit:g}s") from None

    async def probe(self) -> None:
        """Reach the store once (its root folder or bucket); SourceError saying why not."""
        await self._call(self._probe)

    def _probe(self) -> None:
        try:
            self.fs.info(self.root or "/")
        except FileNotFoundError:
            raise SourceError("no such bucket or folder") from None
        except Exception as exc:
            raise SourceError(f"{type(exc).__name__}: {_short(exc)}") from None

    async def stat(self, path: str) -> FileInfo:
        full = self.full_path(path)
        info = await self._call(self._info, full)
        if info.get("type") not in ("file", None):
            raise SourceNotFound("not a file")
        return FileInfo(path, _int_or_none(info.get("size")), _mtime(info), info_version(info))

    def _info(self, full: str) -> dict[str, Any]:
        try:
            return self.fs.info(full)
        except FileNotFoundError:
            raise SourceNotFound("no such file") from None
        except (IsADirectoryError, NotADirectoryError):
            raise SourceNotFound("not a file") from None
        except Exception as exc:
            raise SourceError(f"stat failed: {type(exc).__name__}: {_short(exc)}") from None

    async def read(self, path: str, max_bytes: int) -> Blob:
        full = self.full_path(path)
        return await self._call(self._read, full, max_bytes)

    def _read(self, full: str, max_bytes: int) -> Blob:
        info: Mapping[str, Any] = self._info(full)
        if info.get("type") not in ("file", None):
            raise SourceNotFound("not a file")
        size = _int_or_none(info.get("size"))
        if size is not None and size > max_bytes:
            raise SourceTooLarge(size, max_bytes)
        chunks: list[bytes] = []
        total = 0
        try:
            with self.fs.open(full, "rb") as handle:
                # Count while reading: the object may be bigger than its listing said.
                while chunk := handle.read(min(_READ_CHUNK, max_bytes + 1 - total)):
                    chunks.append(chunk)
                    total += len(chunk)
                    if total > max_bytes:
                        raise SourceTooLarge(total, max_bytes)
                # The file's own metadata describes the bytes read (s3fs pins them with If-Match): prefer it
                # to the earlier info, which an update in between would have made stale.
                details = getattr(handle, "details", None)
                if isinstance(details, Mapping) and info_version(details):
                    info = details
        except FileNotFoundError:
            raise SourceNotFound("no such file") from None
        except (SourceTooLarge, SourceNotFound):
            raise
        except Exception as exc:
            raise SourceError(f"read failed: {type(exc).__name__}: {_short(exc)}") from None
        return Blob(b"".join(chunks), version=info_version(info))

    async def list(self, pattern: str, exclude: Sequence[str] = (), hidden: bool = False) -> list[FileInfo]:
        # A listing is many paged requests: `timeout` bounds each read, the backend's own timeouts each page.
        return await self._call(self._list, pattern, tuple(exclude), hidden, timeout=None)

    def _list(self, pattern: str, exclude: tuple[str, ...], hidden: bool = False) -> builtins.list[FileInfo]:
        wanted = path_filter(pattern, exclude, hidden)
        prefix = glob_prefix(pattern)
        start = f"{self.root}/{prefix}" if prefix else self.root
        progress = ListingProgress(self.id, "objects")
        try:
            found = self._find(start, progress)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise SourceError(f"listing failed: {type(exc).__name__}: {_short(exc)}") from None
        files: list[FileInfo] = []
        cut = len(self.fs._strip_protocol(self.root).rstrip("/")) + 1 if self.root else 0
        for name, info in found.items():
            if info.get("type", "file") != "file":
                continue
            rel = self.fs._strip_protocol(name)[cut:]
            if not rel or not wanted(rel):
                continue
            try:
                safe_relpath(rel)
            except UnsafePath:
                continue  # a key no request could name safely is not listed either
            files.append(FileInfo(rel, _int_or_none(info.get("size")), _mtime(info), info_version(info)))
        progress.done(len(files))
        return files

    def _find(self, start: str, progress: ListingProgress) -> Mapping[str, Mapping[str, Any]]:
        """Every file under `start` with its info, as `fs.find(detail=True)` gives it; S3 listings count their
        objects as the pages arrive (s3fs's own find returns only once the last page is in)."""
        if any(cls.__name__ == "S3FileSystem" for cls in type(self.fs).__mro__) and hasattr(self.fs, "_iterdir"):
            return fsspec.asyn.sync(self.fs.loop, _s3_find, self.fs, start, progress)
        found = self.fs.find(start, detail=True)
        progress.add(len(found))
        return found


async def _s3_find(fs: Any, start: str, progress: ListingProgress) -> dict[str, Mapping[str, Any]]:
    """s3fs's flat listing of `start` (one list_objects_v2 request per 1,000 keys), counted as it goes."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    bucket, key, _ = fs.split_path(start)
    prefix = key.strip("/") + "/" if key.strip("/") else ""
    found: dict[str, Mapping[str, Any]] = {}
    try:
        # s3fs's own (private) paginated listing: tests/test_sdk_compat.py checks it is still there.
        async for info in fs._iterdir(bucket, delimiter="", prefix=prefix):
            if info.get("type") == "file":
                found[info["name"]] = info
            progress.add()
    except ClientError as exc:
        raise translate_boto_error(exc) from None
    progress.check()
    return found


def _construct(fs_class: type, options: Mapping[str, Any]) -> tuple[Any, str]:
    """An instance of `fs_class`, or None and why not: the exception's class and first line, with no option
    value in it (options carry credentials).

    A constructor that fails part-way leaves an object whose destructor may fail in turn (ftp's closes a
    connection it never opened): such complaints about `fs_class` are silenced while it is built and dropped,
    rather than printed as "Exception ignored" whenever the object goes.
    """
    previous = sys.unraisablehook

    def ignore_its_destructor(unraisable: Any) -> None:
        if getattr(unraisable.object, "__qualname__", "") != f"{fs_class.__qualname__}.__del__":
            previous(unraisable)

    sys.unraisablehook = ignore_its_destructor
    try:
        try:
            return fs_class(**options), ""
        except Exception as exc:  # backend constructors raise anything
            failure = f"{type(exc).__name__}: {_short(exc)}" if str(exc) else type(exc).__name__
            exc.__traceback__ = None  # the frames holding the half-built object go now, not later
        gc.collect()
    finally:
        sys.unraisablehook = previous
    for value in options.values():
        if isinstance(value, str) and len(value) >= 4:
            failure = failure.replace(value, "***")
    return None, failure


def _int_or_none(value: Any) -> int | None:
    """A backend's size field (of whatever type it reports) as an int, or None."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _short(exc: BaseException) -> str:
    # Backend messages may quote request URLs with signatures: keep the first line, bounded.
    return str(exc).splitlines()[0][:200] if str(exc) else ""


def cache_dir(kind: str, key: str) -> str:
    """A per-user cache folder for `kind` (clones and the like), unique per `key`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "aggregator", kind, hashlib.sha256(key.encode()).hexdigest()[:16])
    os.makedirs(folder, exist_ok=True)
    return folder
