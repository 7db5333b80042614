"""The Streamable HTTP fast path for `resources/read` answers exactly as the SDK does on both wires (status, the
headers that matter, the body as parsed JSON), errors, scopes and header checks included, in each response mode;
and it takes the requests it was built for (the rest it hands to the SDK). Two real servers, one with the path off."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from tests.conftest import PNG_BYTES
from tests.served import Server, serve_http

ALICE = "alice-token-0123456789abcdef"  # scopes docs + secret
BOB = "bob-token-0123456789abcdef"  # scope docs
MODERN = "2026-07-28"
LEGACY = "2025-11-25"
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}}

MANIFEST = """\
version: 1
server:
  name: fast
  auth:
    tokens:
      - {{name: alice, sha256: "{alice}", scopes: [docs, secret]}}
      - {{name: bob, sha256: "{bob}", scopes: [docs]}}
sources:
  docs: {{url: ./docs}}
  secret: {{url: ./secret, access: {{scopes: [secret]}}}}
collections:
  - {{source: docs, glob: "*.md", uri: "docs://{{path}}"}}
  - {{source: secret, glob: "*.md", uri: "secret://{{path}}"}}
resources:
  - {{uri: "img://logo", name: logo, source: docs, path: logo.png}}
  - {{uri: "note://inline", name: inline, text: "Inline content"}}
"""

MODES = {"sessions": (), "json": ("--json-response",), "stateless": ("--stateless",)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fast")
    (folder / "docs").mkdir()
    (folder / "docs" / "a.md").write_text("# public A\n")
    (folder / "docs" / "changing.md").write_text("first\n")  # test_a_changed_file_is_answered_anew's
    (folder / "docs" / "unicode.md").write_text("caf\u00e9 \u2603 \U0001f600 \u2028 end\n")
    (folder / "docs" / "logo.png").write_bytes(PNG_BYTES)
    (folder / "secret").mkdir()
    (folder / "secret" / "plan.md").write_text("# the secret plan\n")
    (folder / "manifest.yaml").write_text(MANIFEST.format(alice=hashlib.sha256(ALICE.encode()).hexdigest(),
                                                          bob=hashlib.sha256(BOB.encode()).hexdigest()))
    return folder


@pytest.fixture(scope="module", params=list(MODES))
def pair(request: pytest.FixtureRequest, folder: Path) -> Iterator[tuple[str, Server, Server]]:
    """(mode, the server with the fast path, the server without), both serving `folder`."""
    mode = request.param
    with ExitStack() as stack:
        fast, slow = (stack.enter_context(serve_http(
            folder / "manifest.yaml", folder, *MODES[mode], log_name=f"{mode}-{name}.log",
            global_args=["--log-level", "DEBUG"], env={"AGGREGATOR_HTTP_FAST": on}))
            for name, on in (("fast", "1"), ("slow", "0")))
        yield mode, fast, slow


def _headers(token: str | None, wire: str, session: str | None = None, **extra: str) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": wire}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if session:
        headers["Mcp-Session-Id"] = session
    headers.update(extra)
    return {k: v for k, v in headers.items() if v != ""}


def _post(server: Server, body: Any, headers: dict[str, str] | list[tuple[str, str]]) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url, content=content, headers=headers, timeout=30)


_COMPARED = ("content-type", "cache-control", "connection", "x-accel-buffering", "www-authenticate", "allow")


def _answer(response: httpx.Response, session: str | None, port: int) -> dict[str, Any]:
    """What must match between the two servers: status, content type, session header and the body parsed."""
    kind = response.headers.get("content-type", "")
    text = response.text
    body: Any = text
    if kind.startswith("text/event-stream"):
        lines = re.split(r"\r\n|\r|\n", text)  # SSE's line ends: not str.splitlines, which also splits at U+2028
        body = [json.loads(line[5:]) for line in lines if line.startswith("data:") and line[5:].strip()]
    elif kind.startswith("application/json") and text:
        body = json.loads(text)
    own = response.headers.get("mcp-session-id")
    headers = {k: (response.headers.get(k) or "").replace(str(port), "PORT") for k in _COMPARED}
    return {"status": response.status_code, "body": body, **headers,
            "session": None if own is None else "same" if own == session else "another"}


def _open(server: Server, token: str | None) -> str | None:
    """A legacy session for `token` (None in stateless mode, which has none)."""
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    response = _post(server, init, _headers(token, "", None))
    assert response.status_code == 200, response.text
    session = response.headers.get("mcp-session-id")
    done = _post(server, {"jsonrpc": "2.0", "method": "notifications/initialized"}, _headers(token, LEGACY, session))
    assert done.status_code == 202
    return session


def _read(request_id: Any, uri: Any, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "resources/read", "params": {"uri": uri, **params}}


def _modern(request_id: Any, uri: Any, **params: Any) -> dict[str, Any]:
    return _read(request_id, uri, _meta=ENVELOPE, **params)


def _legacy_cases(mode: str) -> list[tuple[str, Any, Any, bool | None]]:
    """(name, body, headers, whether the fast path takes it) on the legacy wire ("alice" and "bob" stand for their
    sessions, each warmed by one read before these: the path learns a session's version from the SDK's first read
    there). Stateless, there are no sessions to check; with JSON responses, JSON is all a client must accept."""
    alice, bob, stateless = "alice", "bob", mode == "stateless"
    h = _headers(ALICE, LEGACY, alice)
    return [
        ("hit", _read(1, "docs://a.md"), h, True),
        ("string id", _read("s-1", "docs://a.md"), h, True),
        ("blob", _read(2, "img://logo"), h, True),
        ("inline", _read(3, "note://inline"), h, True),
        ("unicode", _read(4, "docs://unicode.md"), h, True),
        ("scoped in", _read(5, "secret://plan.md"), h, True),
        ("missing", _read(6, "docs://missing.md"), h, True),
        ("unknown scheme", _read(7, "nothing://here"), h, True),
        ("empty uri", _read(8, ""), h, True),
        ("no version header", _read(9, "docs://a.md"), _headers(ALICE, "", alice), True),
        ("scoped out", _read(10, "secret://plan.md"), _headers(BOB, LEGACY, bob), True),
        ("uri not a string", _read(11, 42), h, False),
        ("extra param", _read(12, "docs://a.md", extra=1), h, False),
        ("progress token", _read(13, "docs://a.md", _meta={"progressToken": 5}), h, False),
        ("float id", _read(1.5, "docs://a.md"), h, False),
        ("list", [_read(14, "docs://a.md")], h, False),
        # What orjson refuses or reads otherwise than json (aggregator/codec.py), answered as the SDK answers them.
        ("lone surrogate", _read(40, "docs://\ud800.md"), h, False),
        ("id past 64 bits", _read(2**64 + 1, "docs://a.md"), h, False),
        ("non-ASCII", _read(41, "docs://caf\u00e9.md"), h, True),
        ("not json", b"{nope", h, False),
        ("escaped method", b'{"jsonrpc":"2.0","id":42,"method":"resources\\/read","params":{"uri":"docs://a.md"}}', h,
         False),  # a read all the same, the SDK's (the path looks for the method's bytes before it parses)
        ("other method", {"jsonrpc": "2.0", "id": 15, "method": "resources/list", "params": {}}, h, False),
        ("json accept only", _read(16, "docs://a.md"), {**h, "Accept": "application/json"}, mode == "json"),
        ("text content type", _read(17, "docs://a.md"), {**h, "Content-Type": "text/plain"}, False),
        ("foreign host", _read(18, "docs://a.md"), {**h, "Host": "evil.example:80"}, False),
        ("foreign origin", _read(19, "docs://a.md"), {**h, "Origin": "http://evil.example"}, False),
        ("no session", _read(20, "docs://a.md"), _headers(ALICE, LEGACY, None), stateless),
        ("unknown session", _read(21, "docs://a.md"), _headers(ALICE, LEGACY, "nope"), stateless),
        ("someone else's session", _read(22, "docs://a.md"), _headers(BOB, LEGACY, alice), stateless),
        ("no token", _read(23, "docs://a.md"), _headers(None, LEGACY, alice), False),
    ]


def _modern_cases(mode: str) -> list[tuple[str, Any, Any, bool | None]]:
    def h(uri: Any, token: str = ALICE, **extra: str) -> dict[str, str]:
        return _headers(token, MODERN, None, **{"Mcp-Method": "resources/read", "Mcp-Name": str(uri), **extra})

    return [
        ("hit", _modern(1, "docs://a.md"), h("docs://a.md"), True),
        ("string id", _modern("s-1", "docs://a.md"), h("docs://a.md"), True),
        ("blob", _modern(2, "img://logo"), h("img://logo"), True),
        ("inline", _modern(3, "note://inline"), h("note://inline"), True),
        ("scoped in", _modern(5, "secret://plan.md"), h("secret://plan.md"), True),
        ("missing", _modern(6, "docs://missing.md"), h("docs://missing.md"), True),
        ("unknown scheme", _modern(7, "nothing://here"), h("nothing://here"), True),
        ("scoped out", _modern(10, "secret://plan.md"), h("secret://plan.md", BOB), True),
        ("no client info", _read(24, "docs://a.md", _meta={k: v for k, v in ENVELOPE.items() if "Info" not in k}),
         h("docs://a.md"), True),
        ("progress token", _read(36, "docs://a.md", _meta={**ENVELOPE, "progressToken": 5}), h("docs://a.md"), None),
        ("uri not a string", _modern(11, 42), h(42), False),
        ("extra param", _modern(12, "docs://a.md", extra=1), h("docs://a.md"), False),
        ("client info not an object", _read(25, "docs://a.md", _meta={
            **ENVELOPE, "io.modelcontextprotocol/clientInfo": 5}), h("docs://a.md"), False),
        ("capabilities malformed", _read(26, "docs://a.md", _meta={
            **ENVELOPE, "io.modelcontextprotocol/clientCapabilities": {"roots": 5}}), h("docs://a.md"), False),
        ("no envelope", _read(27, "docs://a.md"), h("docs://a.md"), False),
        ("name mismatch", _modern(28, "docs://a.md"), h("docs://other.md"), False),
        ("no method header", _modern(29, "docs://a.md"), h("docs://a.md", **{"Mcp-Method": ""}), False),
        ("version mismatch", _read(30, "docs://a.md", _meta={
            **ENVELOPE, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}), h("docs://a.md"), False),
        ("unknown version", _modern(31, "docs://a.md"), h("docs://a.md", **{"MCP-Protocol-Version": "2099-01-01"}),
         False),
        ("duplicate name header", _modern(32, "docs://a.md"),
         [*h("docs://a.md").items(), ("Mcp-Name", "docs://a.md")], False),
        ("json accept only", _modern(33, "docs://a.md"), {**h("docs://a.md"), "Accept": "application/json"},
         mode == "json"),
        ("foreign host", _modern(34, "docs://a.md"), {**h("docs://a.md"), "Host": "evil.example:80"}, False),
        ("no token", _modern(35, "docs://a.md"), h("docs://a.md", ""), False),
        ("lone surrogate", _modern(37, "docs://\ud800.md"), h("docs://a.md"), False),
        ("id past 64 bits", _modern(2**64 + 1, "docs://a.md"), h("docs://a.md"), False),
        ("notification", {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}},
         h("x"), False),
    ]


def _fast_reads(server: Server) -> int:
    return server.log.read_text(errors="replace").count("fast path: ")


def _compare(fast: Server, slow: Server, cases: list[tuple[str, Any, Any, bool | None]],
             sessions: dict[int, dict[str, str | None]]) -> None:
    for name, body, headers, taken in cases:
        answers = []
        for server in (fast, slow):
            own = sessions[server.port]
            # Each server has its own session ids: put this server's in place of alice's and bob's.
            mapped = [(k, own.get(v, v) if k == "Mcp-Session-Id" else v)
                      for k, v in (headers.items() if isinstance(headers, dict) else headers)]
            mapped = [(k, v) for k, v in mapped if v is not None]
            before = _fast_reads(server)
            response = _post(server, body, mapped)
            session = dict(mapped).get("Mcp-Session-Id")
            answers.append(_answer(response, session, server.port))
            if server is fast and taken is not None:
                assert (_fast_reads(server) > before) == taken, name
        assert answers[0] == answers[1], (name, answers[0], answers[1])


def test_legacy_reads_answer_as_the_sdk_does(pair: tuple[str, Server, Server]) -> None:
    mode, fast, slow = pair
    sessions: dict[int, dict[str, str | None]] = {}
    for server in (fast, slow):
        alice, bob = _open(server, ALICE), _open(server, BOB)
        sessions[server.port] = {"alice": alice, "bob": bob}
        for token, session in ((ALICE, alice), (BOB, bob)):  # the SDK's first read in a session: the path learns
            warm = _post(server, _read(0, "docs://a.md"), _headers(token, LEGACY, session))
            assert warm.status_code == 200 and "public A" in warm.text
    _compare(fast, slow, _legacy_cases(mode), sessions)


def test_modern_reads_answer_as_the_sdk_does(pair: tuple[str, Server, Server]) -> None:
    mode, fast, slow = pair
    _compare(fast, slow, _modern_cases(mode), {fast.port: {}, slow.port: {}})


def test_a_session_is_served_fast_only_after_the_sdk_served_a_read_there(pair: tuple[str, Server, Server]) -> None:
    mode, fast, _ = pair
    session = _open(fast, ALICE)
    before = _fast_reads(fast)
    first = _post(fast, _read(1, "docs://a.md"), _headers(ALICE, LEGACY, session))
    second = _post(fast, _read(2, "docs://a.md"), _headers(ALICE, LEGACY, session))
    assert "public A" in first.text and "public A" in second.text
    # Stateless: no session to learn, every read is taken; with sessions, the first read is the SDK's.
    assert _fast_reads(fast) - before == (2 if mode == "stateless" else 1)
    if mode == "stateless":
        return
    # A second handshake in the session may negotiate another version: the SDK serves the next read again.
    init = {"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    again = _post(fast, init, _headers(ALICE, LEGACY, session))
    before = _fast_reads(fast)
    third = _post(fast, _read(4, "docs://a.md"), _headers(ALICE, LEGACY, session))
    fourth = _post(fast, _read(5, "docs://a.md"), _headers(ALICE, LEGACY, session))
    assert again.status_code == 200 and "public A" in third.text and "public A" in fourth.text
    assert _fast_reads(fast) - before == 1


def test_a_changed_file_is_answered_anew(pair: tuple[str, Server, Server], folder: Path) -> None:
    """The fast path keeps each read's encoded answer, for as long as the handler's result is the same."""
    mode, fast, _ = pair
    headers = _headers(ALICE, MODERN, None, **{"Mcp-Method": "resources/read", "Mcp-Name": "docs://changing.md"})
    deadline = time.monotonic() + 30
    answers: list[str] = []
    for text in (f"first {mode}\n", f"second {mode}\n"):
        (folder / "docs" / "changing.md").write_text(text)
        while time.monotonic() < deadline:  # until the watcher has seen the file (and then its change)
            answer = _post(fast, _modern(1, "docs://changing.md"), headers).json()
            if answer.get("result", {}).get("contents", [{}])[0].get("text") == text:
                answers.append(text)
                break
            time.sleep(0.1)
    assert answers == [f"first {mode}\n", f"second {mode}\n"]


def test_a_post_that_is_not_a_read_is_not_parsed_by_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever is not a read is parsed once, by the SDK: the path looks for the method's bytes first. A read written
    with an escaped method (no such bytes) is the SDK's, answered as a read. The real app in process (its parser
    counted), stateless with JSON answers."""
    import anyio

    from aggregator import http_fast
    from aggregator.http_app import http_app
    from aggregator.metrics import Metrics
    from aggregator.notify import Notifier
    from aggregator.server import build_server
    from aggregator.service import ResourceService
    from aggregator.supervisor import Supervisor

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# public A\n")
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text('version: 1\nserver: {name: parses}\nsources:\n  docs: {url: ./docs}\n'
                        'collections:\n  - {source: docs, glob: "*.md", uri: "docs://{path}"}\n')
    parsed: list[bytes] = []
    parse = http_fast.loads_strict

    def counted(body: bytes) -> Any:
        parsed.append(body)
        return parse(body)

    monkeypatch.setattr(http_fast, "loads_strict", counted)
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    others = [init, {"jsonrpc": "2.0", "method": "notifications/initialized"},
              {"jsonrpc": "2.0", "id": 2, "method": "resources/list", "params": {"_meta": {"pad": "x" * 65536}}},
              {"jsonrpc": "2.0", "id": 3, "method": "resources/templates/list"},
              {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}]
    escaped = b'{"jsonrpc":"2.0","id":5,"method":"resources\\/read","params":{"uri":"docs://a.md"}}'

    async def main() -> list[httpx.Response]:
        service = await ResourceService.open(manifest)
        try:
            notifier = Notifier()
            live = Supervisor(service, notifier)
            server = build_server(service, notifier, legacy_notifications=False)
            app = http_app(server, live, Metrics(live), "127.0.0.1", 8000, json_response=True, stateless=True)
            headers = _headers(None, LEGACY)
            async with server.session_manager.run(), httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8000") as http:
                answers = [await http.post("/mcp", content=json.dumps(body).encode(), headers=headers)
                           for body in others]
                answers.append(await http.post("/mcp", content=escaped, headers=headers))
                assert not parsed, [body[:80] for body in parsed]
                answers.append(await http.post("/mcp", content=json.dumps(_read(6, "docs://a.md")).encode(),
                                               headers=headers))
                return answers
        finally:
            await service.aclose()

    answers = anyio.run(main)
    assert [a.status_code for a in answers] == [200, 202, 200, 200, 200, 200, 200], [a.text for a in answers]
    assert answers[0].json()["result"]["protocolVersion"] == LEGACY
    assert [r["uri"] for r in answers[2].json()["result"]["resources"]] == ["docs://a.md"]
    for read in answers[5:]:
        assert read.json()["result"]["contents"][0]["text"] == "# public A\n"
    assert len(parsed) == 1  # the plain read: the path's own
