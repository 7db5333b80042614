"""How an S3 source meets a failing endpoint: one that cannot be connected to (refused, unresolvable) is reported
after one attempt; resets, connections closed unanswered, throttling and 5xx answers are retried a bounded number
of times, by botocore alone (s3fs's own loop around it multiplied the attempts).

Real parts throughout: s3fs and botocore against a closed loopback port, a listener that resets every connection,
and a proxy in front of moto's threaded S3 server that answers some requests with an error, or closes their
connection without answering, first.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from aggregator.errors import ResourceUnavailable
from aggregator.manifest.files import read_manifest_bytes
from aggregator.service import ResourceService
from aggregator.sources.base import SourceError
from aggregator.sources.filesystem import FsspecSource
from tests.conftest import MODES, connect, write_manifest
from tests.isolation import free_port
from tests.test_sources_s3 import Store, start_store

pytest.importorskip("s3fs", reason="s3fs is not installed")

CREDENTIALS = {"key": "test-key", "secret": "test-secret-value"}
MAX_BYTES = 1 << 20
METHODS = frozenset({"GET", "HEAD", "PUT", "POST", "DELETE"})
THROTTLED = "Please reduce your request rate."  # what S3 says with a SlowDown, and s3fs's loop looks for


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
    """Answers the next `failures` requests of `methods` with `answer`, forwards the others to moto. `answer`: a
    status and S3 error code; None, the connection closed without an answer; "cut", moto's answer with half its
    body, then the connection closed."""

    upstream = ""
    answer: tuple[int, str] | Literal["cut"] | None = (503, "SlowDown")
    methods = METHODS
    failures = 0
    delay = 0.0  # seconds each error answer waits before it is sent
    failed = 0
    forwarded = 0

    def _handle(self) -> None:
        cls = type(self)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if cls.failures > 0 and self.command in cls.methods:
            cls.failures -= 1
            cls.failed += 1
            if cls.answer is None:
                self.close_connection = True  # not a byte written: the client meets a closed connection
                return
            if cls.answer == "cut":
                self.close_connection = True
                return self._forward(body, cut=True)
            status, code = cls.answer
            time.sleep(cls.delay)
            payload = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{THROTTLED}" \
                      f"</Message></Error>".encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
            return
        cls.forwarded += 1
        self._forward(body)

    def _forward(self, body: bytes, cut: bool = False) -> None:
        """The request sent on to moto and its answer passed back (with half its body when `cut`)."""
        upstream = http.client.HTTPConnection(type(self).upstream, timeout=10)
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
            self.wfile.write(data[:len(data) // 2] if cut else data)

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


@pytest.fixture
def proxy(store: Store) -> Iterator[str]:
    """FailingFirst in front of `store` (answering every request as it is, until a test sets `failures`)."""
    FailingFirst.upstream = store.endpoint.removeprefix("http://")
    FailingFirst.answer, FailingFirst.methods = (503, "SlowDown"), METHODS
    FailingFirst.failures = FailingFirst.failed = 0
    FailingFirst.delay = 0.0
    server = ThreadingHTTPServer(("127.0.0.1", 0), FailingFirst)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    FailingFirst.failures = 0
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("answer", [(503, "SlowDown"), (500, "InternalError"), None],
                         ids=["throttled", "5xx", "closed-unanswered"])
def test_throttling_server_errors_and_closed_connections_are_still_retried(proxy: str,
                                                                           answer: tuple[int, str] | None) -> None:
    """Each call first meets an error answer (or a connection closed unanswered), then the real store: it
    succeeds, having asked twice."""
    FailingFirst.answer = answer
    source = open_source(proxy, bucket="flaky")
    results = []

    async def main() -> None:
        for call in calls(source).values():
            FailingFirst.failures, FailingFirst.failed = 1, 0
            results.append((await call(), FailingFirst.failed))

    anyio.run(main)
    assert [failed for _, failed in results] == [1, 1, 1, 1]
    assert results[2][0].data == b"# A\n" and [f.path for f in results[3][0]] == ["a.md"]


def flaky_manifest(folder: Path, proxy: str, timeout: str) -> Path:
    """A manifest whose source `flaky` is the bucket `flaky` (prefix x) behind `proxy`, read through the template
    `flaky://{+key}`."""
    return write_manifest(folder, f"""
        version: 1
        server: {{name: flaky}}
        sources:
          flaky: {{url: "s3://flaky/x", timeout: {timeout},
                   options: {{key: test-key, secret: test-secret-value, endpoint_url: "{proxy}"}}}}
        templates:
          - {{uriTemplate: "flaky://{{+key}}", name: file, source: flaky, path: "{{key}}"}}
        """)


async def failed_read(path: Path) -> tuple[ResourceUnavailable, float]:
    """The error reading flaky://a.md with the manifest at `path` gives, and how long that took."""
    service = await ResourceService.open(path)
    try:
        started = time.monotonic()
        with pytest.raises(ResourceUnavailable) as err:
            await service.read("flaky://a.md")
        return err.value, time.monotonic() - started
    finally:
        await service.aclose()


THROTTLING = [(503, "SlowDown"), (429, "ThrottlingException"), (503, "ServiceUnavailable")]


@pytest.mark.parametrize("answer", THROTTLING, ids=["slowdown", "throttling-429", "unavailable"])
@pytest.mark.parametrize("methods", [METHODS, {"GET"}], ids=["every-request", "gets"])
def test_an_endpoint_that_keeps_throttling_is_asked_three_times_per_call(proxy: str, answer: tuple[int, str],
                                                                         methods: set[str]) -> None:
    """Throttling that does not stop: botocore's 3 attempts and no more, for each call that meets it. s3fs's own
    loop retried what botocore gave up on 5 times over when the answer's text said SlowDown or "reduce your
    request rate" (a GET's or a listing's answer has a body; a HEAD's has none): 15 requests and ~10 s."""
    FailingFirst.answer, FailingFirst.methods = answer, frozenset(methods)
    source = open_source(proxy, bucket="flaky")
    failed = {}

    async def main() -> None:
        for name, call in calls(source).items():
            FailingFirst.failures, FailingFirst.failed = 10_000, 0
            try:
                await call()
            except SourceError:
                pass
            failed[name] = FailingFirst.failed

    anyio.run(main)
    if methods == METHODS:
        head = 1 if answer[0] == 429 else 3  # a HEAD's 429 has no body, so no code botocore counts as throttling
        assert failed == {"probe": head, "stat": head, "read": head, "list": 3}
    else:  # HEADs answered: the stat succeeds; the read's GET, the listing and the probe's (x is a folder) do not
        assert failed == {"probe": 3, "stat": 0, "read": 3, "list": 3}


@pytest.mark.parametrize("mode", MODES)
def test_a_throttled_read_fails_naming_the_uri_within_the_timeout(tmp_path: Path, proxy: str, mode: str) -> None:
    """Through the MCP client: a read whose GETs meet SlowDown after SlowDown fails after 3 requests, before the
    source's timeout, with an error naming the URI and nothing of the store (its endpoint, bucket, answer or the
    secret); the server goes on serving, and reads the object once the store answers again."""
    FailingFirst.methods = frozenset({"GET"})
    path = flaky_manifest(tmp_path, proxy, "10s")

    async def main() -> None:
        async with connect(path, mode) as client:
            FailingFirst.failures = 10_000
            started = time.monotonic()
            with pytest.raises(MCPError) as err:
                await client.read_resource("flaky://a.md")
            elapsed, failed = time.monotonic() - started, FailingFirst.failed
            FailingFirst.failures = 0
            assert (await client.read_resource("flaky://a.md")).contents[0].text == "# A\n"
        assert failed == 3, failed
        assert elapsed < 10, elapsed  # botocore's waits between its attempts: at most 1 s, then 2 s
        assert err.value.message == "Resource flaky://a.md could not be read right now"
        assert err.value.data == {"uri": "flaky://a.md"}
        shown = f"{err.value.message} {err.value.data}"
        for hidden in (proxy.removeprefix("http://"), "flaky/x", "test-secret-value", THROTTLED, "SlowDown"):
            assert hidden not in shown, hidden

    anyio.run(main)


def test_a_read_slower_than_the_timeout_fails_at_the_timeout(tmp_path: Path, proxy: str) -> None:
    """The source's timeout bounds a read, botocore's attempts and waits included: answers that each take 3 s (3
    of them and botocore's waits of up to 3 s) end the read at 1 s, naming the URI and the timeout."""
    FailingFirst.methods, FailingFirst.failures, FailingFirst.delay = frozenset({"GET"}), 10_000, 3.0
    path = flaky_manifest(tmp_path, proxy, "1s")
    error, elapsed = anyio.run(failed_read, path)
    assert error.message == "Resource flaky://a.md could not be read right now"
    assert "no answer within 1s" in (error.reason or ""), error.reason
    assert 1 <= elapsed < 6, elapsed  # not the 9 s or more the store's answers take (slack for a loaded machine)


def test_a_manifest_on_a_throttling_store_is_asked_three_times(proxy: str) -> None:
    """An included manifest's client is a source's: its GET meets throttling 3 times, then its error."""
    FailingFirst.methods, FailingFirst.failures = frozenset({"GET"}), 10_000
    with pytest.raises(OSError, match="reduce your request rate"):
        read_manifest_bytes("s3://flaky/x/a.md", {**CREDENTIALS, "endpoint_url": proxy})
    assert FailingFirst.failed == 3


@pytest.mark.parametrize("methods", [{"GET", "HEAD"}, {"GET"}], ids=["every-request", "the-body's-request"])
def test_a_read_whose_connections_close_unanswered_fails_within_seconds(tmp_path: Path, proxy: str,
                                                                        methods: set[str]) -> None:
    """A store that accepts and closes without answering: the read is ResourceUnavailable naming the URI (neither
    the endpoint nor the secret) after botocore's 3 attempts, each resent once at once by aiohttp. s3fs's own loop
    ran botocore's 5 times around (and 5 times around that for a ranged GET): 15 requests and ~10 s when the stat
    met it, 75 and ~50 s when only the body's GET did."""
    FailingFirst.answer, FailingFirst.methods, FailingFirst.failures = None, frozenset(methods), 10_000
    path = flaky_manifest(tmp_path, proxy, "20s")
    error, elapsed = anyio.run(failed_read, path)
    assert error.message == "Resource flaky://a.md could not be read right now"
    assert "Connection was closed before" in (error.reason or ""), error.reason  # not the source's timeout
    assert 3 <= FailingFirst.failed <= 6, FailingFirst.failed
    assert elapsed < 6, elapsed  # botocore's backoff between its 3 attempts: at most 1 s, then 2 s


@pytest.mark.parametrize("answer", ["cut", (429, "TooManyRequests")], ids=["body-cut-short", "429-slow-down-text"])
def test_what_botocore_does_not_retry_is_asked_for_again(proxy: str, answer: tuple[int, str] | Literal["cut"]) -> None:
    """A GET whose body stops half-way (botocore's attempts end with the headers), or an error answer botocore
    does not retry (a 429 whose code it does not count as throttling) but whose text asks to slow down: s3fs's own
    loop asks again, as often as it did; only failures botocore retried itself are no longer retried around it."""
    FailingFirst.answer, FailingFirst.methods, FailingFirst.failures = answer, frozenset({"GET"}), 2
    source = open_source(proxy, bucket="flaky")
    blob = anyio.run(source.read, "a.md", MAX_BYTES)
    assert blob.data == b"# A\n" and FailingFirst.failed == 2
