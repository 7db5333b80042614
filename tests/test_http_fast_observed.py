"""What an operator observes of reads the Streamable HTTP fast path serves is what the SDK's path gives (issue 29,
"nothing lost"): /metrics (requests by method and outcome, read latency count, cache hits and misses) and the
access log count each read once with the same outcome and caller, on both wires; the bearer guard refuses an expired
JWT, a token without the required scope and a body over maxBodyBytes alike; and with tracing on every read gets the
SDK's request span (the path steps aside). Two real servers, one with `AGGREGATOR_HTTP_FAST=0`, the official client
and raw POSTs."""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from tests.conftest import PNG_BYTES
from tests.isolation import free_port
from tests.served import Server, serve_http
from tests.test_auth import ISSUER, Keys, jwks_server
from tests.test_http_fast import LEGACY, MODERN, _answer, _headers, _modern, _open, _post, _read

ALICE = "alice-token-0123456789abcdef"  # mcp + docs + secret
BOB = "bob-token-0123456789abcdef"  # mcp + docs
CAROL = "carol-token-0123456789abcdef"  # docs only: short of the required scope

MANIFEST = """\
version: 1
server:
  name: observed
  http: {{maxBodyBytes: 2KiB}}
  auth:
    resource: {resource}
    requiredScopes: [mcp]
    tokens:
      - {{name: alice, sha256: "{alice}", scopes: [mcp, docs, secret]}}
      - {{name: bob, sha256: "{bob}", scopes: [mcp, docs]}}
      - {{name: carol, sha256: "{carol}", scopes: [docs]}}
    jwt: {{issuer: "{issuer}", jwksUrl: "{jwks}", leeway: 0s}}
defaults: {{maxBytes: 1KiB}}
sources:
  docs: {{url: ./docs}}
  secret: {{url: ./secret, access: {{scopes: [secret]}}}}
collections:
  - {{source: docs, glob: "*.md", uri: "docs://{{path}}"}}
  - {{source: secret, glob: "*.md", uri: "secret://{{path}}"}}
resources:
  - {{uri: "img://logo", name: logo, source: docs, path: logo.png}}
"""


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Pair:
    """Two servers of one manifest, `fast` (its path on) and `slow` (AGGREGATOR_HTTP_FAST=0), and the JWT keys."""

    def __init__(self, fast: Server, slow: Server, keys: Keys) -> None:
        self.fast, self.slow, self.keys = fast, slow, keys
        self.servers = (fast, slow)

    def jwt(self, server: Server, scope: str, expires_in: int = 300) -> str:
        return self.keys.token(server.url, scope, expires_in=expires_in)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("observed")
    (folder / "docs").mkdir()
    (folder / "docs" / "a.md").write_text("# public A\n")
    (folder / "docs" / "b.md").write_text("# public B\n")
    (folder / "docs" / "big.md").write_text("x" * 4096)  # over maxBytes: too_large
    (folder / "docs" / "logo.png").write_bytes(PNG_BYTES)
    (folder / "secret").mkdir()
    (folder / "secret" / "plan.md").write_text("# the secret plan\n")
    return folder


@pytest.fixture(scope="module")
def pair(folder: Path) -> Iterator[Pair]:
    keys = Keys()
    with jwks_server(keys) as jwks, ExitStack() as stack:
        servers = []
        for name, on in (("fast", "1"), ("slow", "0")):
            port = free_port()
            manifest = folder / f"{name}.yaml"  # each server is its own audience (`resource`)
            manifest.write_text(MANIFEST.format(resource=f"http://127.0.0.1:{port}/mcp", alice=_digest(ALICE),
                                                bob=_digest(BOB), carol=_digest(CAROL), issuer=ISSUER, jwks=jwks))
            servers.append(stack.enter_context(serve_http(
                manifest, folder, port=port, log_name=f"{name}.log", env={"AGGREGATOR_HTTP_FAST": on},
                global_args=["--log-level", "DEBUG", "--log-format", "json"])))
        yield Pair(servers[0], servers[1], keys)


def _client(url: str, token: str, mode: str) -> Client:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    return Client(streamable_http_client(url, http_client=http), mode=mode, cache=None)


async def _session(url: str, token: str, mode: str) -> list[str]:
    """The same reads on one connection of the official client: hits, a blob, missing, hidden and too large ones,
    and a listing; each outcome as the client saw it."""
    seen = []
    async with _client(url, token, mode) as client:
        await client.list_resources()
        for uri in ("docs://a.md", "docs://a.md", "docs://b.md", "docs://a.md", "img://logo", "secret://plan.md",
                    "docs://missing.md", "nothing://here", "docs://big.md", "docs://b.md"):
            try:
                result = await client.read_resource(uri)
                seen.append(f"{uri} ok {len(result.contents)}")
            except MCPError as exc:
                seen.append(f"{uri} {exc.error.code}")
    return seen


def _samples(server: Server) -> dict[str, float]:
    text = httpx.get(server.base + "/metrics", timeout=30).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def _counted(samples: dict[str, float]) -> dict[str, float]:
    """The per-request figures a read moves: counts, not times (a latency bucket depends on the machine)."""
    counters = ("aggregator_requests_total", "aggregator_cache_hits_total", "aggregator_cache_misses_total")
    return {k: v for k, v in samples.items() if k.startswith(counters) or k == "aggregator_read_seconds_count"}


def _log(server: Server) -> list[dict[str, Any]]:
    return [json.loads(line) for line in server.output().splitlines() if line.startswith("{")]


def _accessed(server: Server) -> Counter[tuple[str, str, str, str]]:
    return Counter((e["caller"], e["method"], e["uri"], e["outcome"]) for e in _log(server)
                   if e["logger"] == "aggregator.access")


def _fast_reads(server: Server, wire: str = "") -> int:
    return sum(e["message"].startswith(f"fast path: {wire}") for e in _log(server))


def test_metrics_and_access_log_count_fast_reads_as_the_sdk_does(pair: Pair) -> None:
    seen = {}
    for server in pair.servers:
        before = _fast_reads(server)
        seen[server.port] = [anyio.run(_session, server.url, ALICE, "legacy"),
                             anyio.run(_session, server.url, BOB, "auto")]
        if server is pair.fast:  # both wires were served fast (legacy: after the SDK's first read in the session)
            assert _fast_reads(server, "legacy") >= 8 and _fast_reads(server, "modern") >= 9, server.output()[-3000:]
        else:
            assert _fast_reads(server) == before == 0
    assert seen[pair.fast.port] == seen[pair.slow.port]
    assert "docs://big.md -32603" in seen[pair.fast.port][0] and "secret://plan.md -32602" in seen[pair.fast.port][1]
    fast, slow = _counted(_samples(pair.fast)), _counted(_samples(pair.slow))
    assert fast == slow
    assert fast['aggregator_requests_total{method="resources/read",outcome="too_large"}'] == 2
    assert fast["aggregator_read_seconds_count"] == 20
    access = _accessed(pair.fast)
    assert access == _accessed(pair.slow)
    assert access[("alice", "resources/read", "docs://a.md", "ok")] == 3
    assert access[("bob", "resources/read", "secret://plan.md", "not_found")] == 1


def _same(pair: Pair, body: Any, headers: dict[str, str], session: dict[int, str | None] | None = None
          ) -> dict[str, Any]:
    """The answer both servers give to `body` (their own session id in place of `session`); asserted equal."""
    answers = []
    for server in pair.servers:
        own = dict(headers)
        if session is not None and session[server.port] is not None:
            own["Mcp-Session-Id"] = session[server.port]  # type: ignore[assignment]
        answers.append(_answer(_post(server, body, own), own.get("Mcp-Session-Id"), server.port))
    assert answers[0] == answers[1], answers
    return answers[0]


def _modern_headers(token: str, uri: str) -> dict[str, str]:
    return _headers(token, MODERN, None, **{"Mcp-Method": "resources/read", "Mcp-Name": uri})


def test_an_expired_jwt_is_refused_mid_session_as_by_the_sdk(pair: Pair) -> None:
    tokens = {s.port: pair.jwt(s, "mcp docs", expires_in=3) for s in pair.servers}
    sessions = {s.port: _open(s, tokens[s.port]) for s in pair.servers}
    started = time.time()

    def both(body: Any, wire: str) -> list[dict[str, Any]]:
        answers = []
        for server in pair.servers:
            token = tokens[server.port]
            headers = (_headers(token, LEGACY, sessions[server.port]) if wire == LEGACY
                       else _modern_headers(token, "docs://a.md"))
            answers.append(_answer(_post(server, body, headers), sessions[server.port], server.port))
        assert answers[0] == answers[1], answers
        return answers

    before = _fast_reads(pair.fast)
    for n in range(3):  # the first legacy read is the SDK's; the rest and the modern ones are the path's
        assert both(_read(n, "docs://a.md"), LEGACY)[0]["status"] == 200
        assert both(_modern(n, "docs://a.md"), MODERN)[0]["status"] == 200
    assert _fast_reads(pair.fast) - before == 5
    assert both(_read(9, "secret://plan.md"), LEGACY)[0]["body"][0]["error"]["code"] == -32002  # no secret scope
    time.sleep(max(0.0, started + 4.5 - time.time()))  # past `exp` (leeway 0)
    for wire, body in ((LEGACY, _read(10, "docs://a.md")), (MODERN, _modern(10, "docs://a.md"))):
        refused = both(body, wire)[0]
        assert refused["status"] == 401 and 'error="invalid_token"' in refused["www-authenticate"], refused


def test_required_scopes_and_oversize_bodies_are_refused_as_by_the_sdk(pair: Pair) -> None:
    sessions = {s.port: _open(s, ALICE) for s in pair.servers}
    for server in pair.servers:  # the SDK's first read in the session: the path then serves this session
        assert _post(server, _read(0, "docs://a.md"), _headers(ALICE, LEGACY, sessions[server.port])).status_code == 200
    short = _same(pair, _modern(1, "docs://a.md"), _modern_headers(CAROL, "docs://a.md"))
    assert short["status"] == 403 and 'error="insufficient_scope"' in short["www-authenticate"]
    short_jwt = _same(pair, _modern(2, "docs://a.md"), {**_modern_headers(ALICE, "docs://a.md"),
                                                        "Authorization": "Bearer " + pair.keys.token("x", "docs")})
    assert short_jwt["status"] == 401  # another audience
    big_uri = "docs://" + "a" * 3000 + ".md"  # the body is over maxBodyBytes (2 KiB)
    before = _fast_reads(pair.fast)
    for body, headers, session in ((_read(3, big_uri), _headers(ALICE, LEGACY), sessions),
                                   (_modern(4, big_uri), _modern_headers(ALICE, big_uri), None)):
        oversize = _same(pair, body, headers, session)
        assert oversize["status"] == 413, oversize
    near = "docs://" + "a" * 1500 + ".md"  # under the limit: the path answers it, not found
    missing = _same(pair, _modern(5, near), _modern_headers(ALICE, near))
    assert missing["body"]["error"]["code"] == -32602 and missing["body"]["id"] == 5
    assert _fast_reads(pair.fast) - before == 1


async def _reads(url: str, mode: str, uris: list[str]) -> None:
    async with Client(url, mode=mode, cache=None) as client:
        for uri in uris:
            try:
                await client.read_resource(uri)
            except MCPError:
                pass


def test_with_tracing_on_every_read_gets_the_sdks_span(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.proto", reason="the otel extra is not installed")
    from tests.test_tracing import collector

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    (tmp_path / "m.yaml").write_text('version: 1\nserver: {name: traced}\nsources: {docs: {url: ./docs}}\n'
                                     'collections: [{source: docs, glob: "*.md", uri: "docs://{path}"}]\n')
    uris = ["docs://a.md"] * 5 + ["docs://missing.md"]
    with collector() as (received, port):
        with serve_http(tmp_path / "m.yaml", tmp_path, global_args=["--log-level", "DEBUG"],
                        env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_BSP_SCHEDULE_DELAY": "50",
                             "AGGREGATOR_HTTP_FAST": "1"}) as server:
            for mode in ("legacy", "auto"):
                anyio.run(_reads, server.url, mode, uris)
        # Stopped: what was batched is exported at exit.
        spans = [s for r in received.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
    reads = [s for s in spans if s.name == "resources/read"]
    assert len(reads) == 2 * len(uris), [s.name for s in spans]
    assert all(s.kind == s.SPAN_KIND_SERVER for s in reads)
    versions = Counter(a.value.string_value for s in reads for a in s.attributes if a.key == "mcp.protocol.version")
    assert versions == {LEGACY: len(uris), MODERN: len(uris)}
    assert "fast path: " not in server.output() and "tracing on" in server.output()


def test_a_cancelled_legacy_read_is_stopped_and_answered_as_by_the_sdk(tmp_path: Path) -> None:
    """A read in a 2025-11-25 session held by its upstream, then `notifications/cancelled` for it on the session:
    the SDK stops the handler and ends the read's stream with -32800 (outcome error); so must the path."""
    import threading

    from tests import http_server

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    with http_server.serve() as upstream, ExitStack() as stack:
        (tmp_path / "m.yaml").write_text(
            f'version: 1\nserver: {{name: c}}\nsources:\n  docs: {{url: ./docs}}\n  web: {{url: '
            f'"http://127.0.0.1:{upstream.port}/base/", allowPrivateNetwork: true}}\nresources:\n'
            '  - {uri: "web://gated", name: g, source: web, path: gated}\n'
            '  - {uri: "docs://a.md", name: a, source: docs, path: a.md}\n')
        servers = [stack.enter_context(serve_http(tmp_path / "m.yaml", tmp_path, log_name=f"{on}.log",
                                                  global_args=["--log-level", "DEBUG", "--log-format", "json"],
                                                  env={"AGGREGATOR_HTTP_FAST": on})) for on in ("1", "0")]
        answers = []
        for server in servers:
            session = _open(server, None)
            headers = _headers(None, LEGACY, session)
            assert "# A" in _post(server, _read(1, "docs://a.md"), headers).text  # the path now serves the session
            held: dict[str, Any] = {}

            def read(server: Server = server, headers: dict[str, str] = headers, held: dict[str, Any] = held) -> None:
                started = time.monotonic()
                held["answer"] = _answer(_post(server, _read(9, "web://gated"), headers), session, server.port)
                held["seconds"] = time.monotonic() - started

            thread = threading.Thread(target=read)
            thread.start()
            time.sleep(1.0)  # the read waits on its upstream (10 s)
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9}}
            assert _post(server, cancel, headers).status_code == 202
            thread.join(30)
            assert held["seconds"] < 5, held
            answers.append(held["answer"])
            access = [(e["uri"], e["outcome"]) for e in _log(server) if e["logger"] == "aggregator.access"]
            assert access[-1] == ("web://gated", "error"), access
        assert answers[0] == answers[1]
        assert answers[0]["body"][0]["error"]["code"] == -32800
        assert _fast_reads(servers[0], "legacy") == 1  # the cancelled read (the first was the SDK's)


@pytest.fixture(scope="module")
def stalling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, list[Server]]]:
    """(the upstream, [fast, slow]): servers whose `web://sN` reads wait on an upstream that never answers once
    `upstream.stalled` names sN."""
    from tests import http_server

    folder = tmp_path_factory.mktemp("stalling")
    with http_server.serve() as upstream, ExitStack() as stack:
        (folder / "m.yaml").write_text(
            f'version: 1\nserver: {{name: s}}\nsources:\n  web: {{url: "http://127.0.0.1:{upstream.port}/base/", '
            'allowPrivateNetwork: true, timeout: 45s}\nresources:\n'
            + "".join(f'  - {{uri: "web://s{n}", name: s{n}, source: web, path: s{n}}}\n' for n in range(4)))
        servers = [stack.enter_context(serve_http(folder / "m.yaml", folder, log_name=f"{on}.log",
                                                  global_args=["--log-level", "DEBUG", "--log-format", "json"],
                                                  env={"AGGREGATOR_HTTP_FAST": on})) for on in ("1", "0")]
        upstream.stalled.update(f"s{n}" for n in range(4))  # after start-up, which looks at each once
        yield upstream, servers


def _modern_read(uri: str) -> tuple[dict[str, Any], dict[str, str]]:
    return _modern(7, uri), _modern_headers("", uri)


def _on_both(servers: list[Server], work: Any) -> list[Any]:
    """`work(server)` on each server at once (threads): each its result."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(servers)) as pool:
        return list(pool.map(work, servers))


def test_a_modern_read_whose_client_goes_away_is_cancelled_as_by_the_sdk(stalling: tuple[Any, list[Server]]) -> None:
    """The SDK's modern entry (SSE allowed) cancels the handler when the client disconnects: outcome error, at
    once, rather than a read that runs on to its source's timeout."""
    _, servers = stalling
    body, headers = _modern_read("web://s1")

    def gone(server: Server) -> list[tuple[str, str]]:
        with pytest.raises(httpx.TimeoutException):
            _post_within(server, body, headers, 1.0)
        time.sleep(1.5)
        return [(e["uri"], e["outcome"]) for e in _log(server) if e["logger"] == "aggregator.access"]

    fast, slow = _on_both(servers, gone)
    assert fast == slow == [("web://s1", "error")]
    assert _fast_reads(servers[0], "modern") == 1


def test_a_long_modern_read_turns_to_sse_with_pings_as_by_the_sdk(stalling: tuple[Any, list[Server]]) -> None:
    """A read still running after the SDK's 15 s window is committed to an SSE stream that pings, so that a proxy
    idle timeout does not close it."""
    _, servers = stalling
    body, headers = _modern_read("web://s2")

    def first(server: Server) -> tuple[int, str, bytes, float]:
        started = time.monotonic()
        with httpx.stream("POST", server.url, content=json.dumps(body).encode(), headers=headers,
                          timeout=30) as response:
            chunk = next(response.iter_raw())
            return (response.status_code, response.headers.get("content-type", ""), chunk,
                    round(time.monotonic() - started))

    fast, slow = _on_both(servers, first)
    assert fast == slow and slow[:3] == (200, "text/event-stream", b": ping\r\n\r\n") and 14 <= slow[3] <= 20, slow


def _post_within(server: Server, body: Any, headers: dict[str, str], seconds: float) -> httpx.Response:
    return httpx.post(server.url, content=json.dumps(body).encode(), headers=headers, timeout=seconds)


def test_a_long_legacy_read_streams_with_pings_as_by_the_sdk(stalling: tuple[Any, list[Server]]) -> None:
    """The 2025-11-25 transport opens a read's SSE stream at once and pings it every 15 s (a client's read timeout
    shorter than the read does not end it); the path's long reads do the same."""
    _, servers = stalling

    def first(server: Server) -> tuple[Any, ...]:
        session = _open(server, None)
        headers = _headers(None, LEGACY, session)
        warm = _post(server, _read(1, "web://none"), headers)  # the SDK's first read in the session (not found)
        assert warm.status_code == 200 and "error" in warm.text
        started = time.monotonic()
        with httpx.stream("POST", server.url, content=json.dumps(_read(2, "web://s3")).encode(), headers=headers,
                          timeout=20) as response:
            opened = time.monotonic() - started
            chunk = next(response.iter_raw())
            return (response.status_code, response.headers.get("content-type"),
                    response.headers.get("mcp-session-id") == session, opened < 2, chunk[:9],
                    round(time.monotonic() - started))

    fast, slow = _on_both(servers, first)
    assert fast == slow and slow[:5] == (200, "text/event-stream", True, True, b": ping - ") and 14 <= slow[5] <= 20
    assert _fast_reads(servers[0], "legacy") == 1
