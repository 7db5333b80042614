"""How to reach one upstream MCP server: a child process over stdio, or a Streamable HTTP endpoint.

Each target builds a fresh `mcp` client transport per connection attempt (`open()`), wrapped so that the connection
owner learns when the stream ends, and why (`on_lost`): a child that exits or a transport that crashes is a lost
connection. A message past the cap fails the one call it answered; the connection stays (on stdio, a line that
names no call, or does not end, ends it).

- stdio: `stdio.bounded_stdio` runs the command in its own process group (the whole tree is ended on close), caps
  one message at `max_message_bytes`, and logs the child's stderr line by line (cut, escaped, rate limited), never
  inherited raw, so a chatty child cannot flood or interleave with our own stderr.
- HTTP: an `httpx2` client whose connections go only to addresses the `AddressPolicy` allows (the same SSRF guard as
  HTTP sources: names are resolved here, every address checked, and the connection made to an approved address; TLS
  still verifies the name), no proxies from the environment, redirects only within the endpoint's origin (the SDK's
  rule), one JSON answer capped at `max_message_bytes` and one SSE event too.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpcore2
import httpx2
from anyio.abc import ObjectReceiveStream
from mcp.client.streamable_http import streamable_http_client

from aggregator.sources.addresses import AddressPolicy
from aggregator.sources.base import SourceError
from aggregator.upstream.failures import too_big
from aggregator.upstream.http_session import SessionWatch
from aggregator.upstream.lane import Lane
from aggregator.upstream.stdio import bounded_stdio

__all__ = ["HttpTarget", "StdioTarget", "Target"]

@dataclass(frozen=True)
class StdioTarget:
    """A command started as a child process speaking MCP on its stdin/stdout."""

    command: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Merged over the SDK's minimal environment (HOME, PATH ...): nothing else of ours is inherited."""
    cwd: str | None = None

    def __post_init__(self) -> None:
        if not self.command or not all(isinstance(part, str) and part and "\0" not in part for part in self.command):
            raise SourceError("an mcp+stdio upstream needs a command: a non-empty list of strings")

    def describe(self) -> str:
        return f"MCP upstream (stdio) {os.path.basename(self.command[0])}"

    @asynccontextmanager
    async def open(self, name: str, on_lost: Callable[[str], None], max_message_bytes: int,
                   timeout: float = 30.0, session: SessionWatch | None = None,
                   lanes: Callable[[Lane], None] | None = None) -> AsyncIterator[Any]:
        """A stdio transport to a new child (`stdio.bounded_stdio`): lines capped, stderr into our log; `lanes` is
        given the connection's read lane (`lane.Lane`)."""
        del timeout, session
        async with bounded_stdio(self.command, self.env, self.cwd, name, max_message_bytes, on_lost) as (
                read, write, lane):
            if lanes is not None:
                lanes(lane)
            yield _EofWatch(read, on_lost), write


@dataclass(frozen=True)
class HttpTarget:
    """A Streamable HTTP endpoint; the client negotiates the wire (2026-07-28 or the initialize handshake)."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Sent on every request (a static `Authorization: Bearer ...` from the manifest); never logged."""
    allow_private_network: bool | Sequence[str] = False
    oauth: Mapping[str, str] | None = field(default=None, repr=False)
    """OAuth client credentials (`clientId`, `clientSecret`, `issuer`, `scope`): tokens from the upstream's
    authorization server, which must be `issuer` (the SDK's client_credentials provider), kept across connections."""
    _auth: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            url = httpx2.URL(self.url)
        except Exception:
            raise SourceError("an MCP upstream URL must be an http(s)://host/... URL") from None
        if url.scheme not in ("http", "https") or not url.host or url.userinfo:
            raise SourceError("an MCP upstream URL must be an http(s)://host/... URL without credentials in it")
        policy = AddressPolicy(self.allow_private_network)
        literal = _literal_ip(url.host)
        if literal is not None and (reason := policy.refusal(literal)) is not None:
            raise SourceError(f"refused: {reason}; allowPrivateNetwork lists the networks an upstream may reach")

    def _oauth_provider(self) -> Any:
        """The client_credentials provider (made once: it holds the tokens), or None without `oauth`."""
        if not self.oauth:
            return None
        if "provider" not in self._auth:
            try:
                from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
            except ImportError as exc:
                raise SourceError(f"OAuth client credentials need {exc.name}: pip install "
                                  "'mcp-aggregator[auth]'") from None
            self._auth["provider"] = ClientCredentialsOAuthProvider(
                self.url, _TokenMemory(), self.oauth["clientId"], self.oauth["clientSecret"],
                scope=self.oauth.get("scope"), issuer=self.oauth["issuer"])
        return self._auth["provider"]

    def describe(self) -> str:
        url = httpx2.URL(self.url)
        return f"MCP upstream {url.scheme}://{url.netloc.decode('ascii', 'replace')}"

    @asynccontextmanager
    async def open(self, name: str, on_lost: Callable[[str], None], max_message_bytes: int,
                   timeout: float = 30.0, session: SessionWatch | None = None,
                   lanes: Callable[[Lane], None] | None = None) -> AsyncIterator[Any]:
        """The SDK's Streamable HTTP transport over a guarded `httpx2` client; `session` sees every response (no
        read lane: `lanes` is not called)."""
        del name, lanes
        transport = _GuardedTransport(AddressPolicy(self.allow_private_network), max_message_bytes, session)
        client = httpx2.AsyncClient(headers=dict(self.headers), transport=transport, trust_env=False,
                                    auth=self._oauth_provider(),
                                    follow_redirects=False,
                                    # Reads wait long: a listen stream (SSE) stays open between events.
                                    timeout=httpx2.Timeout(timeout, read=None))
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(client)
            read, write = await stack.enter_async_context(
                streamable_http_client(self.url, http_client=client, max_sse_event_size=max_message_bytes))
            yield _EofWatch(read, on_lost), write


Target = StdioTarget | HttpTarget


class _TokenMemory:
    """The SDK's TokenStorage, in memory: tokens live as long as the target (across reconnections)."""

    def __init__(self) -> None:
        self.tokens: Any = None
        self.client_info: Any = None

    async def get_tokens(self) -> Any:
        return self.tokens

    async def set_tokens(self, tokens: Any) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> Any:
        return self.client_info

    async def set_client_info(self, client_info: Any) -> None:
        self.client_info = client_info


class _EofWatch(ObjectReceiveStream[Any]):
    """A transport's read stream that tells `on_lost` when it ends (EOF, closed or broken)."""

    def __init__(self, inner: Any, on_lost: Callable[[str], None]) -> None:
        self._inner = inner
        self._on_lost = on_lost

    def _on_eof(self) -> None:
        self._on_lost("the upstream closed the connection")

    @property
    def last_context(self) -> Any:
        # The dispatcher runs handlers in the sender's context when the stream carries one (HTTP).
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_eof()
            raise

    async def aclose(self) -> None:
        self._on_eof()
        await self._inner.aclose()


def _literal_ip(host: str) -> str | None:
    import ipaddress

    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


class _GuardedBackend(httpcore2.AsyncNetworkBackend):
    """Connects only to addresses the policy allows: resolves the name itself and dials an approved address."""

    def __init__(self, policy: AddressPolicy) -> None:
        self._inner = httpcore2.AnyIOBackend()
        self._policy = policy

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore2.AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except TimeoutError:
            raise httpcore2.ConnectTimeout(f"resolving {host} timed out") from None
        except OSError as exc:
            raise httpcore2.ConnectError(f"DNS name not resolved: {host} ({exc.strerror or exc})") from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        reasons = {a: self._policy.refusal(a) for a in addresses}
        allowed = [a for a in addresses if reasons[a] is None]
        if not allowed:
            raise httpcore2.ConnectError(f"refused: {host} resolves only to refused addresses "
                                         f"({'; '.join(sorted({str(r) for r in reasons.values()}))})")
        failure: Exception | None = None
        for address in allowed:
            try:
                return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.ConnectError("refused: unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _GuardedTransport(httpx2.AsyncHTTPTransport):
    """httpx2's HTTP transport over the guarded backend; a non-streamed (JSON) answer holds at most `max_bytes`."""

    def __init__(self, policy: AddressPolicy, max_bytes: int, session: SessionWatch | None = None) -> None:
        super().__init__(trust_env=False)
        # httpx2 takes no network backend; its pool is replaced by one that dials through the guard.
        self._pool = httpcore2.AsyncConnectionPool(ssl_context=httpx2.create_ssl_context(trust_env=False),
                                                   network_backend=_GuardedBackend(policy), http1=True, http2=False)
        self._max_bytes = max_bytes
        self._session = session

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        if self._session is not None:
            response = await self._session.observe(request, response)
        if response.headers.get("content-type", "").lower().startswith("text/event-stream"):
            return response  # SSE events are capped one by one by the SDK
        return httpx2.Response(status_code=response.status_code, headers=response.headers,
                               stream=_CappedStream(response.stream, self._max_bytes),
                               extensions=response.extensions)


class AnswerTooBig(httpx2.StreamError):
    """A response body past the cap. A StreamError, so the SDK fails the one call it answered with this message
    (as an answer it could not parse) and keeps the connection; `failures.past_cap` knows it by its end."""


class _CappedStream(httpx2.AsyncByteStream):
    """A response body that fails (AnswerTooBig) once it has given more than `limit` bytes."""

    def __init__(self, inner: Any, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        async for chunk in self._inner:
            total += len(chunk)
            if total > self._limit:
                raise AnswerTooBig(too_big(self._limit))
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()
