"""With `--json-response`, a client that goes away while a long read is under way frees the server's work and its
upstream's, as an SSE client that goes away does (tests/test_http_fast_observed.py): the read is cancelled (outcome
error) and an upstream MCP source is sent `notifications/cancelled`, on both wires, on the fast path and on the
SDK's (a session's first legacy read, and every read of a server with `AGGREGATOR_HTTP_FAST=0`), with sessions and
stateless. Real servers whose `up` source is tests/upstream_server.py, where `test://hang` never answers and
`test://hanging` counts the reads of it still waiting; the client is a socket that sends the read and closes."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import pytest

from aggregator.http_gone import JsonGone

from tests.served import Server, serve_http, wait_until
from tests.test_http_fast import LEGACY, MODERN, _headers, _modern, _open, _post, _read
from tests.test_upstream import ENV, HERE

if TYPE_CHECKING:
    from starlette.types import Message, Receive, Scope, Send

UPSTREAM = [sys.executable, str(HERE / "upstream_server.py"), "stdio"]
MANIFEST = f"""\
version: 1
server: {{name: gone}}
defaults: {{ttl: 0s}}
sources:
  up: {{url: "mcp+stdio:", namespace: up, timeout: 120s, command: {UPSTREAM!r}, env: {dict(ENV, UPSTREAM_HANGING="1")!r}}}
"""
"""The upstream's own timeout (120 s) is far past the waits below: only a cancellation frees its read in time."""
HANG, HANGING = "up+test://hang", "up+test://hanging"
MODES = {"sessions": (), "stateless": ("--stateless",)}
FREED_WITHIN = 20.0
"""Seconds a cancelled read may take to be let go upstream (a loaded machine; it takes milliseconds)."""


@pytest.fixture(scope="module", params=list(MODES))
def servers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Server,
                                                                                                       Server]]:
    """(mode, the --json-response server with the fast path, the one without)."""
    mode = request.param
    folder = tmp_path_factory.mktemp(f"gone-{mode}")
    (folder / "m.yaml").write_text(MANIFEST)
    with ExitStack() as stack:
        fast, slow = (stack.enter_context(serve_http(
            folder / "m.yaml", folder, "--json-response", *MODES[mode], log_name=f"{name}.log",
            global_args=["--log-level", "DEBUG", "--log-format", "json"], env={**ENV, "AGGREGATOR_HTTP_FAST": on}))
            for name, on in (("fast", "1"), ("slow", "0")))
        yield mode, fast, slow


def _hanging(server: Server) -> str:
    """How many reads of test://hang the upstream is still waiting on (asked on the modern wire: JSON)."""
    answer = _post(server, _modern(1, HANGING), _headers(None, MODERN, **{"Mcp-Method": "resources/read",
                                                                          "Mcp-Name": HANGING}))
    assert answer.status_code == 200, answer.text
    text: str = answer.json()["result"]["contents"][0]["text"]
    return text


def _abandon(server: Server, body: dict[str, Any], headers: dict[str, str]) -> None:
    """POST `body` on a connection of its own, wait until its read is waiting upstream, then close the connection."""
    payload = json.dumps(body).encode()
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    request = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Length: {len(payload)}\r\n{head}\r\n"
               ).encode() + payload
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
        conn.sendall(request)
        wait_until(lambda: _hanging(server) == "1", "the read waiting upstream", timeout=30)
        conn.shutdown(socket.SHUT_RDWR)


def _freed(server: Server) -> bool:
    """Whether the upstream let go of every read of test://hang within FREED_WITHIN seconds."""
    deadline = time.monotonic() + FREED_WITHIN
    while _hanging(server) != "0":
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _log(server: Server) -> list[dict[str, Any]]:
    return [json.loads(line) for line in server.output().splitlines() if line.startswith("{")]


def _hang_outcomes(server: Server) -> list[str]:
    return [e["outcome"] for e in _log(server) if e["logger"] == "aggregator.access" and e.get("uri") == HANG]


def _fast_hangs(server: Server, wire: str) -> int:
    return sum(e["message"] == f"fast path: {wire} read of {HANG}" for e in _log(server))


def _modern_hang(request_id: int) -> tuple[dict[str, Any], dict[str, str]]:
    return _modern(request_id, HANG), _headers(None, MODERN, **{"Mcp-Method": "resources/read", "Mcp-Name": HANG})


@pytest.mark.parametrize("path", ["fast", "slow"])
def test_a_modern_read_whose_client_goes_away_is_cancelled(servers: tuple[str, Server, Server], path: str) -> None:
    _, fast, slow = servers
    server = fast if path == "fast" else slow
    before = _hang_outcomes(server)
    _abandon(server, *_modern_hang(7))
    assert _freed(server), server.output()[-3000:]
    wait_until(lambda: len(_hang_outcomes(server)) > len(before), "the access log line", timeout=10)
    assert _hang_outcomes(server)[len(before):] == ["error"]
    assert _fast_hangs(server, "modern") == (1 if server is fast else 0)


@pytest.mark.parametrize("path", ["fast", "slow"])
def test_a_legacy_read_whose_client_goes_away_is_cancelled(servers: tuple[str, Server, Server], path: str) -> None:
    """In a session once the SDK has served a read there (the fast path's then), and stateless."""
    _, fast, slow = servers
    server = fast if path == "fast" else slow
    session = _open(server, None)
    headers = _headers(None, LEGACY, session)
    warm = _post(server, _read(1, HANGING), headers)  # with sessions, the SDK's: the path serves the session's next
    assert warm.status_code == 200 and '"0"' in warm.text, warm.text
    before, fast_before = _hang_outcomes(server), _fast_hangs(server, "legacy")
    _abandon(server, _read(2, HANG), headers)
    assert _freed(server), server.output()[-3000:]
    wait_until(lambda: len(_hang_outcomes(server)) > len(before), "the access log line", timeout=10)
    assert _hang_outcomes(server)[len(before):] == ["error"]
    assert _fast_hangs(server, "legacy") - fast_before == (1 if server is fast else 0)


@pytest.mark.parametrize("servers", ["sessions"], indirect=True)  # stateless has no sessions (a skip fails CI)
def test_a_sessions_first_read_whose_client_goes_away_is_cancelled(servers: tuple[str, Server, Server]) -> None:
    """The first read in a legacy session is the SDK's on either server: its client going away cancels it too."""
    _, fast, _ = servers
    session = _open(fast, None)
    before, fast_before = _hang_outcomes(fast), _fast_hangs(fast, "legacy")
    _abandon(fast, _read(1, HANG), _headers(None, LEGACY, session))
    assert _freed(fast), fast.output()[-3000:]
    wait_until(lambda: len(_hang_outcomes(fast)) > len(before), "the access log line", timeout=10)
    assert _hang_outcomes(fast)[len(before):] == ["error"]
    assert _fast_hangs(fast, "legacy") == fast_before


# In process: `JsonGone` in front of a stand-in for the SDK's app, with the client's `receive` and `send` made here.

class _App:
    """Stands in for the SDK's app: takes the body, then answers at once, waits until cancelled (a long handler), or
    (`listens`) watches its own `receive` for the client going away, as the SDK's listen stream does. Records each
    body it was posted and whether its request was cancelled."""

    def __init__(self, *, long: bool = False, listens: bool = False) -> None:
        self.long, self.listens = long, listens
        self.bodies: list[bytes] = []
        self.started, self.cancelled, self.saw_disconnect = asyncio.Event(), False, False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        self.bodies.append(message["body"])
        if len(self.bodies) > 1:  # the session told of a cancellation (JsonGone._tell): answered 202
            return
        self.started.set()
        try:
            if self.listens:
                self.saw_disconnect = (await receive())["type"] == "http.disconnect"
                return
            if self.long:
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def _post_to(app: _App, body: bytes, *, session: bool = False) -> None:
    """POST `body` to /mcp through `JsonGone` in front of `app`; the client goes away once `app` has the request."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if session:
        headers += [(b"mcp-session-id", b"s-1"), (b"mcp-protocol-version", LEGACY.encode())]
    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers}
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        if pending:
            return pending.pop()
        await app.started.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        pass

    async with asyncio.timeout(30):
        await JsonGone(app, max_body=1 << 20)(scope, receive, send)


def _parses_of(body: bytes, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The bodies equal to `body` that `json.loads` is given from now on (it still parses them)."""
    parsed: list[bytes] = []
    loads = json.loads

    def counting(text: Any, **kwargs: Any) -> Any:
        if text == body:
            parsed.append(text)
        return loads(text, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    return parsed


def test_a_request_answered_at_once_is_parsed_by_the_app_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """JsonGone needs a request's id only once it watches it (WATCH_AFTER on): a request answered before is parsed
    by the SDK alone, not first here too."""
    body = json.dumps(_read(7, "docs://a.md")).encode()
    parsed, app = _parses_of(body, monkeypatch), _App()
    asyncio.run(_post_to(app, body))
    assert app.bodies == [body] and not app.cancelled
    assert parsed == [], "JsonGone parsed the body of a request that never needed watching"


@pytest.mark.parametrize("session", [True, False], ids=["session", "stateless"])
def test_a_long_request_whose_client_goes_away_is_cancelled(session: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """...and in a legacy session the session is sent `notifications/cancelled` for it. Its body is parsed here once,
    when it is watched."""
    body = json.dumps(_read(7, "docs://a.md")).encode()
    parsed, app = _parses_of(body, monkeypatch), _App(long=True)
    asyncio.run(_post_to(app, body, session=session))
    assert app.cancelled and parsed == [body]
    told = [json.loads(b) for b in app.bodies[1:]]
    assert told == ([{"jsonrpc": "2.0", "method": "notifications/cancelled",
                      "params": {"requestId": 7, "reason": "the client went away"}}] if session else [])


@pytest.mark.parametrize("method", ["subscriptions/listen", "initialize", None])
def test_what_is_not_a_watched_request_is_left_to_the_app(method: str | None) -> None:
    """A listen stream (the SDK watches it itself), the handshake and a notification are not watched here: the app
    hears the client go away itself, and nothing is cancelled."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method or "notifications/progress", "params": {}}
    if method is not None:
        message["id"] = 3
    app = _App(listens=True)
    asyncio.run(_post_to(app, json.dumps(message).encode(), session=True))
    assert app.saw_disconnect and not app.cancelled and len(app.bodies) == 1
