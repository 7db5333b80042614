"""How an S3 source meets a failing endpoint: one that cannot be connected to (refused, unresolvable) is reported
after one attempt; resets, throttling and 5xx answers are retried a bounded number of times.

Real parts throughout: s3fs and botocore against a closed loopback port, a listener that resets every connection,
and a proxy in front of moto's threaded S3 server that answers some requests with an error first.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import pytest

from aggregator.sources.base import SourceError
from aggregator.sources.filesystem import FsspecSource
from tests.isolation import free_port
from tests.test_sources_s3 import Store, start_store

pytest.importorskip("s3fs", reason="s3fs is not installed")

CREDENTIALS = {"key": "test-key", "secret": "test-secret-value"}
MAX_BYTES = 1 << 20


def open_source(endpoint: str, bucket: str = "bucket", **options: Any) -> FsspecSource:
    return FsspecSource.from_url("s", "s3", f"s3://{bucket}/x", {**CREDENTIALS, "endpoint_url": endpoint, **options},
                                 timeout=60)


def count_sends(source: FsspecSource) -> list[int]:
    """A counter of the requests botocore sends for `source` (its `before-send` event fires once per attempt)."""
    sent = [0]

    def one_more(**_: Any) -> None:
        sent[0] += 1

    source.fs.s3.meta.events.register("before-send.s3", one_more)
    return sent


def calls(source: FsspecSource) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Each way a source reaches its store: probe, stat, read and list."""
    return {"probe": source.probe, "stat": lambda: source.stat("a.md"),
            "read": lambda: source.read("a.md", MAX_BYTES), "list": lambda: source.list("*.md")}


@pytest.mark.parametrize("endpoint", [f"http://127.0.0.1:{free_port()}", "http://no-such-host.invalid:9000"],
                         ids=["refused", "unresolvable"])
def test_an_endpoint_that_cannot_be_connected_to_is_tried_once_per_call(endpoint: str) -> None:
    """A refused connection or an unknown name is no transient failure: retrying it only delays the report."""
    source = open_source(endpoint)
    sent = count_sends(source)
    attempts = {}

    async def main() -> None:
        for name, call in calls(source).items():
            sent[0] = 0
            with pytest.raises(SourceError, match="Could not connect to the endpoint URL"):
                await call()
            attempts[name] = sent[0]

    anyio.run(main)
    assert attempts == {"probe": 1, "stat": 1, "read": 1, "list": 1}


class ResettingListener:
    """A TCP listener on 127.0.0.1 that reads each request and then resets the connection, counting them."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            self.connections += 1
            threading.Thread(target=self._reset, args=(conn,), daemon=True).start()

    @staticmethod
    def _reset(conn: socket.socket) -> None:
        conn.settimeout(5)
        received = b""
        try:
            while b"\r\n\r\n" not in received and (chunk := conn.recv(65536)):
                received += chunk
        except OSError:
            pass
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, not FIN
        conn.close()


@pytest.fixture
def resetting() -> Iterator[ResettingListener]:
    listener = ResettingListener()
    yield listener
    listener.sock.close()


@pytest.mark.parametrize(("options", "requests"), [
    ({}, 3),
    ({"config_kwargs": {"retries": {"mode": "standard", "total_max_attempts": 2}, "connect_timeout": 2}}, 2),
], ids=["default", "manifest-retries"])
def test_a_reset_connection_is_retried_a_bounded_number_of_times(resetting: ResettingListener, options: dict[str, Any],
                                                                 requests: int) -> None:
    """A reset after the request went out may be transient: retried, 3 requests in all unless the manifest's
    `options.config_kwargs.retries` says otherwise (aiohttp resends an idempotent request once on a reset)."""
    source = open_source(f"http://127.0.0.1:{resetting.port}", **options)
    sent = count_sends(source)

    async def main() -> None:
        with pytest.raises(SourceError, match="listing failed"):
            await source.list("*.md")

    anyio.run(main)
    assert sent[0] == requests
    assert requests <= resetting.connections <= 2 * requests


class FailingFirst(BaseHTTPRequestHandler):
    """Answers the next `failures` requests with `answer` (status, S3 error code), forwards the others to moto."""

    upstream = ""
    answer = (503, "SlowDown")
    failures = 0
    failed = 0
    forwarded = 0

    def _handle(self) -> None:
        cls = type(self)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if cls.failures > 0:
            cls.failures -= 1
            cls.failed += 1
            status, code = cls.answer
            payload = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>try again</Message>" \
                      f"</Error>".encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
            return
        cls.forwarded += 1
        upstream = http.client.HTTPConnection(cls.upstream, timeout=10)
        try:
            upstream.request(self.command, self.path, body=body or None, headers=dict(self.headers.items()))
            response = upstream.getresponse()
            data = response.read()
        finally:
            upstream.close()
        self.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in ("connection", "transfer-encoding", "content-length", "server", "date"):
                self.send_header(name, value)
        self.send_header("Content-Length", response.getheader("Content-Length") or str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the test reads the counters, not a log


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    store = start_store()
    store.client.create_bucket(Bucket="flaky")
    store.client.put_object(Bucket="flaky", Key="x/a.md", Body=b"# A\n")
    yield store
    store.stop()


@pytest.mark.parametrize("answer", [(503, "SlowDown"), (500, "InternalError")], ids=["throttled", "5xx"])
def test_throttling_and_server_errors_are_still_retried(store: Store, answer: tuple[int, str]) -> None:
    """Each call first meets an error answer, then the real store: it succeeds, having asked twice."""
    FailingFirst.upstream = store.endpoint.removeprefix("http://")
    FailingFirst.answer = answer
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), FailingFirst)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    source = open_source(f"http://127.0.0.1:{proxy.server_address[1]}", bucket="flaky")
    results = []

    async def main() -> None:
        for call in calls(source).values():
            FailingFirst.failures, FailingFirst.failed = 1, 0
            results.append((await call(), FailingFirst.failed))

    try:
        anyio.run(main)
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert [failed for _, failed in results] == [1, 1, 1, 1]
    assert results[2][0].data == b"# A\n" and [f.path for f in results[3][0]] == ["a.md"]
