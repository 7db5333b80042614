"""An HTTP(S) base URL as a source, on aiohttp (the client fsspec's http filesystem uses), guarded against SSRF.

The scheme, host and port come from the manifest. Paths are relative to the base URL and built from
percent-encoded values, and every request URL is checked to stay on the base's origin. Every address a
request connects to, for the first hop and every redirect, is checked (`addresses.AddressPolicy`): loopback,
link-local, private, unspecified, multicast and reserved addresses are refused in any spelling (decimal, hex,
octal, trailing dot, and every IPv6 form that carries an IPv4 address: mapped, compatible, NAT64, 6to4,
Teredo, ISATAP), because names are resolved by a guarded resolver and the connection goes to the address it
approved. A base URL whose host is a refused IP literal cannot be opened at all. `allowPrivateNetwork` lifts
that for all such addresses (true) or for listed networks only.
"""

from __future__ import annotations

import email.utils
import ipaddress
import re
import socket
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
import anyio
import yarl
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import ThreadedResolver

from aggregator.connect_errors import connect_failure
from aggregator.paths import UnsafePath, safe_relpath
from aggregator.sources.addresses import AddressPolicy
from aggregator.sources.base import (Blob, FileInfo, Source, SourceError, SourceNotFound, SourceTooLarge,
                                    SourceUnsupported)

if TYPE_CHECKING:
    from aiohttp.abc import ResolveResult  # aiohttp 3.10+; only annotations name it

__all__ = ["AddressPolicy", "HttpSource"]

MAX_REDIRECTS = 5
_CHUNK = 64 * 1024
_REDIRECTS = {301, 302, 303, 307, 308}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # never on a request line (aiohttp would raise, not refuse)


def _literal_ip(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


class HttpSource(Source):
    """Files under one base URL; listing is not possible over HTTP (use resources and templates)."""

    url_paths = True

    def __init__(self, id: str, base_url: str, *, headers: Mapping[str, str] | None = None,
                 allow_private_network: bool | Sequence[str] = False, timeout: float = 30.0,
                 max_concurrency: int = 8) -> None:
        self.id = id
        base = yarl.URL(base_url)
        if base.scheme not in ("http", "https") or not base.host or base.user or base.password:
            raise SourceError("an HTTP source needs an http(s)://host/... URL without credentials in it")
        self.base = base.with_query(None).with_fragment(None)
        self._headers = dict(headers or {})
        self.policy = AddressPolicy(allow_private_network)
        literal = _literal_ip(self.base.host or "")
        if literal is not None and (reason := self.policy.refusal(literal)) is not None:
            # Known before any request: a manifest error rather than a failure on every read.
            raise SourceError(f"refused: {reason}; allowPrivateNetwork lists the networks a source may reach")
        self._timeout = timeout
        self._limiter = anyio.CapacityLimiter(max_concurrency)
        self._session: Any = None

    def describe(self) -> str:
        return f"HTTP source {self.base.origin()}"

    def url_for(self, path: str | None) -> Any:
        """The absolute URL of `path` (None: the base URL itself); SourceNotFound if it would leave the base URL's
        origin or folder.

        The path part must pass `safe_relpath` as it stands (percent-encoded): servers resolve `..` and decode
        `%2e%2e` and `%2f`, so a path the URL check alone admits could still name a file beside the base folder.
        """
        if path is not None and ("#" in path or "\\" in path or _CONTROL.search(path)):
            raise SourceNotFound("refused path")
        path_part, _, query = (path or "").partition("?")
        if path is not None:
            try:
                safe_relpath(path_part)
            except UnsafePath:
                raise SourceNotFound("refused path") from None
        prefix = self.base.raw_path.rstrip("/")
        try:
            url = yarl.URL(f"{self.base.origin()}{prefix}/{path_part}" + (f"?{query}" if query else ""), encoded=True)
        except ValueError:
            raise SourceNotFound("refused path") from None
        if url.origin() != self.base.origin() or not url.raw_path.startswith(prefix + "/"):
            raise SourceNotFound("refused path")
        return url

    def _client(self) -> Any:
        if self._session is None:
            connector = aiohttp.TCPConnector(resolver=_GuardedResolver(self.policy), limit=0, ttl_dns_cache=60)
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers, trust_env=False,
                                                  timeout=aiohttp.ClientTimeout(total=self._timeout))
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, path: str | None) -> Any:
        """Send `method`, following redirects hop by hop with every hop checked; the caller releases the response."""
        url = self.url_for(path)
        for _ in range(MAX_REDIRECTS + 1):
            if url.scheme not in ("http", "https"):
                raise SourceError(f"refused a request with the scheme {url.scheme!r}")
            literal = _literal_ip(url.host or "")
            if literal is not None and (reason := self.policy.refusal(literal)) is not None:
                raise SourceError(f"refused a request to {url.origin()}: {reason}")
            try:
                response = await self._client().request(method, url, allow_redirects=False)
            except _Refused as exc:
                raise SourceError(f"refused a request to {url.origin()}: {exc}") from None
            except aiohttp.ClientConnectorError as exc:
                # aiohttp wraps what the resolver raised: a refusal stays a refusal in the log.
                if isinstance(exc.os_error, _Refused):
                    raise SourceError(f"refused a request to {url.origin()}: {exc.os_error}") from None
                raise SourceError(connect_failure(exc)) from None
            except aiohttp.ClientError as exc:
                raise SourceError(f"request failed: {type(exc).__name__}") from None
            if response.status not in _REDIRECTS:
                return response
            location = response.headers.get("Location")
            response.release()
            if not location:
                raise SourceError(f"HTTP {response.status} without a Location")
            url = url.join(yarl.URL(location))
        raise SourceError("too many redirects")

    async def _guarded(self, method: str, path: str | None, body: Any) -> Any:
        async with self._limiter:
            try:
                with anyio.fail_after(self._timeout):
                    response = await self._request(method, path)
                    try:
                        return await body(response)
                    finally:
                        response.release()
            except TimeoutError:
                raise SourceError(f"no complete answer within {self._timeout:g}s") from None

    async def read(self, path: str, max_bytes: int) -> Blob:
        async def body(response: Any) -> Blob:
            _check_status(response)
            length = response.content_length
            if length is not None and length > max_bytes and not response.headers.get("Content-Encoding"):
                raise SourceTooLarge(length, max_bytes)
            chunks, total = [], 0
            # aiohttp decompresses as it streams: the limit counts what we would hold, not what was sent.
            async for chunk in response.content.iter_chunked(_CHUNK):
                total += len(chunk)
                if total > max_bytes:
                    raise SourceTooLarge(total, max_bytes)
                chunks.append(chunk)
            mime = response.headers.get("Content-Type")
            return Blob(b"".join(chunks), mime.split(";")[0].strip() if mime else None, _version(response.headers))

        try:
            return await self._guarded("GET", path, body)
        except aiohttp.ClientPayloadError as exc:
            raise SourceError(f"broken response body: {type(exc).__name__}") from None

    async def stat(self, path: str) -> FileInfo:
        async def body(response: Any) -> FileInfo:
            _check_status(response)
            headers = response.headers
            return FileInfo(path, response.content_length, _http_date(headers.get("Last-Modified")), _version(headers))

        return await self._guarded("HEAD", path, body)

    async def probe(self) -> None:
        """Reach the base URL once (a HEAD; any HTTP answer will do); SourceError saying why not."""
        async def body(response: Any) -> None:
            return None

        await self._guarded("HEAD", None, body)

    async def list(self, pattern: str, exclude: Sequence[str] = (), hidden: bool = False) -> list[FileInfo]:
        raise SourceUnsupported("an HTTP source cannot be listed: use resources or templates for it")


def _check_status(response: Any) -> None:
    if response.status in (404, 410):
        raise SourceNotFound(f"HTTP {response.status}")
    if response.status >= 400:
        raise SourceError(f"HTTP {response.status}")  # never the body: it may echo secrets


def _version(headers: Mapping[str, str]) -> str | None:
    if headers.get("ETag"):
        return "etag:" + headers["ETag"]
    if headers.get("Last-Modified"):
        return "modified:" + headers["Last-Modified"]
    return None


def _http_date(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


class _Refused(OSError):
    """Every address a name resolved to is outside the allowed networks."""


class _GuardedResolver(AbstractResolver):
    """Resolves names and keeps only allowed addresses; aiohttp then connects to exactly those."""

    def __init__(self, policy: AddressPolicy) -> None:
        self._inner = ThreadedResolver()
        self._policy = policy

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        infos = await self._inner.resolve(host, port, family)
        reasons = [self._policy.refusal(info["host"]) for info in infos]
        allowed = [info for info, reason in zip(infos, reasons, strict=True) if reason is None]
        if not allowed:
            raise _Refused(f"{host} resolves only to refused addresses ({'; '.join(sorted(set(map(str, reasons))))})")
        return allowed

    async def close(self) -> None:
        await self._inner.close()
