"""With `--json-response`, a client that goes away while a long read is under way frees the server's work and its
upstream's, as an SSE client that goes away does (tests/test_http_fast_observed.py): the read is cancelled (outcome
error) and an upstream MCP source is sent `notifications/cancelled`, on both wires, on the fast path and on the
SDK's (a session's first legacy read, and every read of a server with `AGGREGATOR_HTTP_FAST=0`), with sessions and
stateless. Real servers whose `up` source is tests/upstream_server.py, where `test://hang` never answers and
`test://hanging` counts the reads of it still waiting; the client is a socket that sends the read and closes."""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from tests.served import Server, serve_http, wait_until
from tests.test_http_fast import LEGACY, MODERN, _headers, _modern, _open, _post, _read
from tests.test_upstream import ENV, HERE

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
