"""Slow and idle HTTP clients: header, body and keep-alive timeouts and the connection cap, against a real
`aggregator serve --http` driven by raw sockets, httpx and the official client on both wires."""

from __future__ import annotations

import select
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.shared.subscriptions import ResourceUpdated

from tests.test_live import BASE, Inbox, listened
from tests.served import serve_http, wait_watched

MARGIN = 4.0  # seconds past a timeout a connection may take to be closed: generous, the machine is shared

LIMITS = "{headerTimeout: 1s, bodyTimeout: 1s, keepAliveTimeout: 1s, maxConnections: 64}"


@dataclass
class Served:
    port: int
    folder: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"


@contextmanager
def serving(folder: Path, http: str, *extra: str) -> Iterator[Served]:
    """`aggregator serve --http` over folder/docs/a.md with `server.http` set to `http`."""
    (folder / "docs").mkdir(exist_ok=True)
    (folder / "docs" / "a.md").write_text("# A\n")
    manifest = folder / "manifest.yaml"
    manifest.write_text(BASE.replace("server: {name: live}", f"server:\n  name: live\n  http: {http}"))
    with serve_http(manifest, folder, *extra, log_name="stderr.log") as server:
        wait_watched(folder, folder / "docs")
        yield Served(server.port, folder, server.log)
    log = server.log
    text = log.read_text()
    assert "Traceback" not in text and "Exception in ASGI application" not in text, text


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[Served]:
    with serving(tmp_path, LIMITS) as served:
        yield served


def closed_after(sock: socket.socket, began: float, limit: float) -> tuple[float, bytes]:
    """Seconds from `began` until the server closed `sock` (or `limit` when it did not), and what it sent."""
    received = b""
    while time.monotonic() - began < limit:
        readable, _, _ = select.select([sock], [], [], 0.1)
        if readable:
            try:
                chunk = sock.recv(4096)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return time.monotonic() - began, received
            received += chunk
    return limit, received


class Trickler(threading.Thread):
    """Sends `head` at once, then `trickle` one byte every `interval` seconds, until the server closes the
    connection; records how long that took and what the server answered."""

    def __init__(self, port: int, trickle: bytes, head: bytes = b"", interval: float = 0.25, limit: float = 30):
        super().__init__(daemon=True)
        self.port, self.head, self.trickle, self.interval, self.limit = port, head, trickle, interval, limit
        self.took: float | None = None
        self.answer = b""

    def run(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            began = time.monotonic()
            sock.sendall(self.head)
            for byte in self.trickle:
                try:
                    sock.send(bytes([byte]))
                except OSError:  # closed under us
                    break
                took, answer = closed_after(sock, time.monotonic(), self.interval)
                self.answer += answer
                if took < self.interval:
                    break
                if time.monotonic() - began > self.limit:
                    return
            self.took = time.monotonic() - began


def _request_head(port: int, method: str = "GET", path: str = "/healthz", extra: str = "") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}".encode()


def long_headers(port: int) -> bytes:
    return _request_head(port) + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"y" * 40) for i in range(40)) + b"\r\n"


def body_head(port: int) -> bytes:
    return _request_head(port, "POST", "/mcp", "Content-Type: application/json\r\n"
                         "Accept: application/json, text/event-stream\r\nContent-Length: 4000\r\n\r\n")


async def _healthy_meanwhile(served: Served) -> None:
    """While slow clients hang: /healthz and a real MCP read on both wires answer promptly."""
    import httpx2 as httpx

    async with httpx.AsyncClient(timeout=5) as http:
        assert (await http.get(f"http://127.0.0.1:{served.port}/healthz")).json()["status"] == "ok"
    for mode in ("legacy", "auto"):
        with anyio.fail_after(10):
            async with Client(served.url, mode=mode, cache=None) as client:
                assert (await client.read_resource("docs://a.md")).contents[0].text == "# A\n"


def test_trickled_headers_and_bodies_are_cut_off_while_others_are_served(limited: Served) -> None:
    headers = [Trickler(limited.port, long_headers(limited.port)) for _ in range(8)]
    bodies = [Trickler(limited.port, b"{" + b" " * 3998 + b"}", head=body_head(limited.port)) for _ in range(4)]
    for slow in headers + bodies:
        slow.start()
    time.sleep(0.3)
    anyio.run(_healthy_meanwhile, limited)
    for slow in headers + bodies:
        slow.join(30)
    for slow in headers:
        assert slow.took is not None and slow.took < 1 + MARGIN, (slow.took, slow.answer)
        assert slow.answer == b"" or slow.answer.startswith(b"HTTP/1.1 408"), slow.answer
    for slow in bodies:
        assert slow.took is not None and slow.took < 1 + MARGIN, (slow.took, slow.answer)
        assert slow.answer == b"" or slow.answer.startswith(b"HTTP/1.1 408"), slow.answer
    anyio.run(_healthy_meanwhile, limited)


def test_silent_and_idle_keep_alive_connections_are_closed(limited: Served) -> None:
    with socket.create_connection(("127.0.0.1", limited.port), timeout=5) as silent, \
            socket.create_connection(("127.0.0.1", limited.port), timeout=5) as idle:
        began = time.monotonic()
        idle.sendall(_request_head(limited.port) + b"\r\n")
        took, answer = closed_after(idle, began, 0.5)
        assert answer.startswith(b"HTTP/1.1 200") and took == 0.5  # answered, kept alive
        idle_took, _ = closed_after(idle, began, 1 + MARGIN + 1)
        silent_took, _ = closed_after(silent, began, 1 + MARGIN + 1)
    assert 0.5 < idle_took < 1 + MARGIN, idle_took
    assert 0.5 < silent_took < 1 + MARGIN, silent_took


def test_listen_and_legacy_streams_outlive_the_timeouts(limited: Served) -> None:
    """A listen stream and a legacy GET stream are responses in progress: no timeout applies to them."""
    inbox = Inbox()
    hold = 1 + MARGIN / 2  # longer than every configured timeout

    async def modern() -> None:
        async with Client(limited.url, mode="auto", cache=None) as client:
            events = await listened(client, [(lambda: (limited.folder / "docs" / "a.md").write_text("# A later\n"), 1)],
                                    settle=hold, resource_subscriptions=["docs://a.md"])
            assert events == [ResourceUpdated(uri="docs://a.md")]

    async def legacy() -> None:
        async with Client(limited.url, mode="legacy", cache=None, message_handler=inbox) as client:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                await client.subscribe_resource("docs://a.md")
            await anyio.sleep(hold)
            (limited.folder / "docs" / "a.md").write_text("# A later still\n")
            assert await inbox.next() == ("updated", "docs://a.md")

    anyio.run(modern)
    anyio.run(legacy)


def test_connections_past_the_cap_are_refused_and_served_once_slots_free(tmp_path: Path) -> None:
    import httpx2 as httpx

    with serving(tmp_path, "{headerTimeout: 3s, keepAliveTimeout: 30s, maxConnections: 4}") as served:
        base = f"http://127.0.0.1:{served.port}"
        with socket.create_connection(("127.0.0.1", served.port), timeout=5) as kept:
            kept.sendall(_request_head(served.port) + b"\r\n")
            assert closed_after(kept, time.monotonic(), 0.5)[1].startswith(b"HTTP/1.1 200")
            hogs = [socket.create_connection(("127.0.0.1", served.port), timeout=5) for _ in range(3)]
            try:
                time.sleep(0.3)
                for _ in range(3):
                    try:
                        refused = httpx.get(base + "/healthz", timeout=5)
                    except httpx.TransportError:
                        continue  # refused before the request was read: as good as a 503
                    assert refused.status_code == 503
                # The connection already open is not disturbed by the cap: its next request is served.
                kept.sendall(_request_head(served.port) + b"\r\n")
                assert closed_after(kept, time.monotonic(), 0.5)[1].startswith(b"HTTP/1.1 200")
                began = time.monotonic()
                for hog in hogs:
                    assert closed_after(hog, began, 3 + MARGIN)[0] < 3 + MARGIN  # silent: header timeout
            finally:
                for hog in hogs:
                    hog.close()
        assert httpx.get(base + "/healthz", timeout=5).status_code == 200
        anyio.run(_healthy_meanwhile, served)


def test_the_header_deadline_counts_from_connecting_not_from_the_first_byte(tmp_path: Path) -> None:
    """Staying silent and then trickling must not earn a second headerTimeout."""
    with serving(tmp_path, "{headerTimeout: 3s}") as served:
        with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
            began = time.monotonic()
            time.sleep(2.5)
            took = None
            for byte in long_headers(served.port):
                try:
                    sock.send(bytes([byte]))
                except OSError:
                    took = time.monotonic() - began
                    break
                waited, _ = closed_after(sock, time.monotonic(), 0.25)
                if waited < 0.25:
                    took = time.monotonic() - began
                    break
                if time.monotonic() - began > 3 + 2.5 + 1:  # what restarting the deadline would allow
                    break
    assert took is not None and took < 3 + 1.5, took
