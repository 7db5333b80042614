"""Bearer auth over Streamable HTTP: static tokens, JWTs against a JWKS, RFC 9728 metadata, access scopes on
entries, private cache scope, /metrics and the JSON access log. A real server process, the official client."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from tests import http_server
from tests.isolation import free_port
from tests.served import serve_http

ALICE = "alice-token-0123456789abcdef"  # scopes docs + secret
BOB = "bob-token-0123456789abcdef"  # scope docs
CAROL = "carol-token-0123456789abcdef"  # no scopes: fails requiredScopes? no, none required in the main manifest
ISSUER = "https://issuer.test"

MANIFEST = """\
version: 1
server:
  name: guarded
  auth:
    resource: {resource}
    tokens:
      - {{name: alice, token: "${{ALICE}}", scopes: [docs, secret]}}
      - {{name: bob, sha256: "{bob_digest}", scopes: [docs]}}
    jwt: {{issuer: "{issuer}", jwksUrl: "{jwks}", leeway: 0s}}
sources:
  docs: {{url: ./docs}}
  secret: {{url: ./secret, access: {{scopes: [secret]}}}}
  web: {{url: "http://127.0.0.1:{upstream}/base/", allowPrivateNetwork: true}}
collections:
  - {{source: docs, glob: "*.md", uri: "docs://{{path}}"}}
  - {{source: secret, glob: "*.md", uri: "secret://{{path}}"}}
resources:
  - {{uri: "web://a", name: web-a, source: web, path: docs/a.md}}
templates:
  - {{uriTemplate: "secret://by-name/{{name}}", name: secret-by-name, source: secret, path: "{{name}}.md"}}
  - {{uriTemplate: "docs://by-name/{{name}}", name: docs-by-name, source: docs, path: "{{name}}.md"}}
"""


class Keys:
    """An RSA signing key published as a JWKS on a loopback HTTP server."""

    def __init__(self) -> None:
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key()))
        self.jwks = {"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}
        self.fetches = 0

    def token(self, audience: str, scope: str = "docs", *, expires_in: int = 300, issuer: str = ISSUER,
              key: Any = None, kid: str = "k1") -> str:
        now = int(time.time())
        claims = {"iss": issuer, "aud": audience, "sub": "user-1", "client_id": "app-1", "scope": scope,
                  "iat": now, "exp": now + expires_in}
        return jwt.encode(claims, key or self.private, algorithm="RS256", headers={"kid": kid})


@contextmanager
def jwks_server(keys: Keys) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            keys.fetches += 1
            if keys.jwks is None:
                self.send_error(500)
                return
            body = (keys.jwks if isinstance(keys.jwks, str) else json.dumps(keys.jwks)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    finally:
        server.shutdown()
        server.server_close()


class Served:
    def __init__(self, base: str, folder: Path, keys: Keys, upstream: http_server.Upstream, log: Path) -> None:
        self.base, self.url, self.folder, self.keys, self.upstream, self.log = base, base + "/mcp", folder, keys, \
            upstream, log


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("auth")
    (folder / "docs").mkdir()
    (folder / "docs" / "a.md").write_text("# public A\n")
    (folder / "secret").mkdir()
    (folder / "secret" / "plan.md").write_text("# the secret plan\n")
    keys = Keys()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    import hashlib

    with jwks_server(keys) as jwks, http_server.serve() as upstream:
        manifest = folder / "manifest.yaml"
        manifest.write_text(MANIFEST.format(resource=base + "/mcp", issuer=ISSUER, jwks=jwks, upstream=upstream.port,
                                            bob_digest=hashlib.sha256(BOB.encode()).hexdigest()))
        with serve_http(manifest, folder, port=port, env={"ALICE": ALICE}, global_args=["--log-format", "json"]
                        ) as server:
            yield Served(base, folder, keys, upstream, server.log)


def _client(url: str, token: str | None, mode: str) -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = create_mcp_http_client(headers=headers)
    return Client(streamable_http_client(url, http_client=http), mode=mode, cache=None)


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _post(served: Served, token: str | None) -> httpx.Response:
    headers = {**HEADERS, **({"Authorization": f"Bearer {token}"} if token else {})}
    return httpx.post(served.url, json=INIT, headers=headers)


def _challenge(response: httpx.Response) -> str:
    return response.headers.get("www-authenticate", "")


def test_missing_and_bad_tokens_get_401_with_resource_metadata(served: Served) -> None:
    keys = served.keys
    metadata = served.base + "/.well-known/oauth-protected-resource/mcp"
    refused = {
        "missing": None,
        "unknown static token": "not-a-known-token-at-all",
        "expired JWT": keys.token(served.url, expires_in=-60),
        "wrong audience": keys.token("https://other.example/mcp"),
        "wrong issuer": keys.token(served.url, issuer="https://evil.example"),
        "signed by another key": keys.token(served.url, key=keys.other),
        "unknown key id": keys.token(served.url, kid="k9"),
        "unsigned (alg none)": jwt.encode({"iss": ISSUER, "aud": served.url, "exp": int(time.time()) + 60},
                                          None, algorithm="none"),
    }
    for why, token in refused.items():
        response = _post(served, token)
        assert response.status_code == 401, why
        assert f'resource_metadata="{metadata}"' in _challenge(response), why
        assert token is None or token not in response.text
    assert _post(served, ALICE).status_code == 200
    assert _post(served, BOB).status_code == 200  # stored as its sha256 digest only
    assert _post(served, keys.token(served.url)).status_code == 200


def test_protected_resource_metadata(served: Served) -> None:
    for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
        document = httpx.get(served.base + path).json()
        assert document["resource"] == served.url
        assert document["authorization_servers"] == [ISSUER]
        assert document["bearer_methods_supported"] == ["header"]
    assert httpx.get(served.base + "/healthz").status_code == 200  # outside /mcp: no token needed


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_access_scopes_hide_entries_and_refuse_reads(served: Served, mode: str) -> None:
    async def main() -> None:
        async with _client(served.url, ALICE, mode) as alice:
            listed = await alice.list_resources()
            assert {r.uri for r in listed.resources} == {"docs://a.md", "secret://plan.md", "web://a"}
            templates = await alice.list_resource_templates()
            assert len(templates.resource_templates) == 2
            read = await alice.read_resource("secret://plan.md")
            assert read.contents[0].text == "# the secret plan\n"
            by_name = await alice.read_resource("secret://by-name/plan")
            assert by_name.contents[0].text == "# the secret plan\n"
        # Bob reads after Alice: the content is cached, and still never reaches him.
        async with _client(served.url, BOB, mode) as bob:
            listed = await bob.list_resources()
            assert {r.uri for r in listed.resources} == {"docs://a.md", "web://a"}
            templates = await bob.list_resource_templates()
            assert [t.uri_template for t in templates.resource_templates] == ["docs://by-name/{name}"]
            for uri in ("secret://plan.md", "secret://by-name/plan"):
                with pytest.raises(MCPError) as refused:
                    await bob.read_resource(uri)
                missing = pytest.raises(MCPError)
                with missing as unknown:
                    await bob.read_resource("secret://no-such-file.md")
                # Hidden and missing look the same.
                assert (refused.value.error.code, refused.value.error.message) == \
                       (unknown.value.error.code, unknown.value.error.message)
            if mode == "legacy":
                with pytest.raises(MCPError):
                    await bob.subscribe_resource("secret://plan.md")
                await bob.subscribe_resource("docs://a.md")
            assert (await bob.read_resource("docs://by-name/a")).contents[0].text == "# public A\n"

    anyio.run(main)


def test_cache_scope_private_for_caller_dependent_results(served: Served) -> None:
    def call(token: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        body = {"jsonrpc": "2.0", "id": 2, "method": method, "params": {
            **params, "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                                "io.modelcontextprotocol/clientCapabilities": {}}}}
        headers = {**HEADERS, "Authorization": f"Bearer {token}", "MCP-Protocol-Version": "2026-07-28",
                   "Mcp-Method": method}
        if "uri" in params:
            headers["Mcp-Name"] = params["uri"]
        response = httpx.post(served.url, json=body, headers=headers)
        assert response.status_code == 200, response.text
        return response.json()["result"]

    assert call(ALICE, "resources/list", {})["cacheScope"] == "private"
    assert call(ALICE, "resources/read", {"uri": "secret://plan.md"})["cacheScope"] == "private"
    assert call(ALICE, "resources/read", {"uri": "docs://a.md"})["cacheScope"] == "public"


def test_client_token_never_reaches_a_source(served: Served) -> None:
    async def main() -> None:
        async with _client(served.url, ALICE, "auto") as alice:
            assert (await alice.read_resource("web://a")).contents[0].text.startswith("# A")

    served.upstream.seen_headers.clear()
    anyio.run(main)
    assert served.upstream.seen_headers, "the HTTP source was not read"
    for headers in served.upstream.seen_headers:
        assert "Authorization" not in headers and ALICE not in json.dumps(headers)


def test_metrics_and_json_access_log(served: Served) -> None:
    async def main() -> None:
        async with _client(served.url, BOB, "auto") as bob:
            for _ in range(3):
                await bob.read_resource("docs://a.md")
            with pytest.raises(MCPError):
                await bob.read_resource("secret://plan.md")

    anyio.run(main)
    text = httpx.get(served.base + "/metrics").text
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line and not line.startswith("#")}
    assert samples['aggregator_requests_total{method="resources/read",outcome="ok"}'] >= 3
    assert samples['aggregator_requests_total{method="resources/read",outcome="not_found"}'] >= 1
    assert samples["aggregator_read_seconds_count"] >= 4
    assert samples["aggregator_cache_hits_total"] >= 2 and samples["aggregator_cache_misses_total"] >= 1
    assert samples['aggregator_reloads_total{outcome="ok"}'] == 0
    assert samples["aggregator_catalog_generation"] == 1
    lines = [json.loads(line) for line in served.log.read_text().splitlines() if line.startswith("{")]
    reads = [e for e in lines if e["logger"] == "aggregator.access" and e["caller"] == "bob"]
    assert {"caller", "method", "uri", "outcome", "ms", "time", "level"} <= set(reads[-1])
    assert any(e["uri"] == "secret://plan.md" and e["outcome"] == "not_found" for e in reads)
    assert ALICE not in served.log.read_text() and BOB not in served.log.read_text()


def test_required_scopes_answer_403(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    manifest = tmp_path / "m.yaml"
    manifest.write_text('version: 1\nserver:\n  name: s\n  auth:\n    requiredScopes: [mcp]\n    tokens:\n'
                        '      - {name: a, token: "${A}", scopes: [mcp]}\n      - {name: b, token: "${B}"}\n'
                        'sources: {docs: {url: ./docs}}\ncollections: [{source: docs, glob: "*", uri: "d://{path}"}]\n')
    with serve_http(manifest, tmp_path, env={"A": ALICE, "B": BOB}) as server:
        headers = {**HEADERS, "Authorization": f"Bearer {BOB}"}
        response = httpx.post(server.url, json=INIT, headers=headers)
        assert response.status_code == 403 and 'error="insufficient_scope"' in _challenge(response)
        assert httpx.post(server.url, json=INIT,
                          headers={**HEADERS, "Authorization": f"Bearer {ALICE}"}).status_code == 200


def test_jwks_outage_keeps_the_keys_fetched_before() -> None:
    """A JWKS that fails (500, then not JSON) neither logs valid tokens out nor gets fetched on every request."""
    from aggregator.auth import JwtTokens
    from aggregator.manifest.model import JwtSettings

    keys, audience = Keys(), "https://docs.test/mcp"
    good = keys.token(audience)
    with jwks_server(keys) as url:
        tokens = JwtTokens(JwtSettings(issuer=ISSUER, jwks_url=url), audience)

        async def main() -> None:
            assert await tokens.verify_token(good) is not None
            assert keys.fetches == 1
            keys.jwks = None  # the JWKS server now fails: 500
            tokens._fetched_at = tokens._tried_at = -1e9  # noqa: SLF001 - the keys are long past their refresh age
            for _ in range(5):
                assert await tokens.verify_token(good) is not None  # still verified with the keys fetched before
            assert keys.fetches == 2  # one failed refresh, not one per request
            keys.jwks = "not json"
            tokens._tried_at = -1e9  # noqa: SLF001 - the refetch interval has passed
            unknown = keys.token(audience, key=keys.other, kid="k2")
            assert await tokens.verify_token(unknown) is None  # refused, not an exception
            assert await tokens.verify_token(good) is not None
            assert keys.fetches == 3
            keys.jwks = "[]"  # JSON, but not a JWK Set
            tokens._tried_at = -1e9  # noqa: SLF001 - the refetch interval has passed
            assert await tokens.verify_token(unknown) is None
            assert await tokens.verify_token(good) is not None
            assert keys.fetches == 4

        anyio.run(main)
