"""The operator's console over real HTTP (`aggregator serve --http`, server.console on): paged tree, filters, search,
templates, previews with resources/read's limits, sources, reloads and the event stream, each filtered by the
caller's token; Host/Origin checks, the CSP, and the event hub's bounds (in process)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import pytest

from aggregator.catalog import Catalog, Entry
from aggregator.console.app import RAW_CHARS, STATIC
from aggregator.console.events import HEARTBEAT_S, EventHub, EventStreamResponse, TooManyStreams
from aggregator.console.history import ReloadHistory
from aggregator.console.redact import redact, where
from aggregator.console.tree import Folder, tree_page
from aggregator.console.views import reload_view
from aggregator.manifest import load_manifest
from aggregator.manifest.model import ConsoleSettings, Display, ManifestError
from tests.console_server import ADMIN, NOBODY, READER, Served, make_folder, serve
from tests.test_live import save
from tests.served import watchers_up


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(tmp_path_factory.mktemp("console")) as running:
        yield running


def _tree(served: Served, prefix: str = "", token: str | None = ADMIN, **params: str) -> dict[str, Any]:
    response = served.get("/console/api/tree", token, prefix=prefix, **params)
    assert response.status_code == 200, response.text
    return response.json()


def _all_children(served: Served, prefix: str, token: str, limit: str) -> list[dict[str, Any]]:
    children, cursor = [], None
    while True:
        page = _tree(served, prefix, token, limit=limit, **({"cursor": cursor} if cursor else {}))
        children += page["children"]
        cursor = page["nextCursor"]
        if cursor is None:
            return children


# --- off by default, auth, headers ------------------------------------------------------------------------------


def test_console_is_off_unless_the_manifest_turns_it_on(tmp_path: Path) -> None:
    from tests.console_server import make_folder

    manifest = make_folder(tmp_path)
    manifest.write_text(manifest.read_text().replace("  console: {adminScope: admin}\n", ""))
    with serve(tmp_path, manifest) as running:
        for path in ("/console", "/console/static/app.js", "/console/api/tree"):
            assert running.get(path).status_code == 404, path


def test_without_auth_the_console_shows_what_an_anonymous_mcp_caller_sees(tmp_path: Path) -> None:
    from tests.console_server import make_folder

    manifest = make_folder(tmp_path)
    text = manifest.read_text()
    start, end = text.index("  auth:\n"), text.index("defaults:")
    manifest.write_text(text[:start] + text[end:])
    with serve(tmp_path, manifest) as running:
        root = running.get("/console/api/tree", token=None).json()
        assert [c["prefix"] for c in root["children"]] == ["docs://", "note://", "web://"]
        assert running.get("/console/api/read", token=None, uri="secret://plan.md").status_code == 404
        assert running.get("/console/api/tree", token=None, **{"as": "*"}).status_code == 403


def test_data_needs_the_token_and_the_shell_has_no_inline_code(served: Served) -> None:
    refused = served.get("/console/api/tree", token=None)
    assert refused.status_code == 401
    assert "resource_metadata" in refused.headers["www-authenticate"]
    assert served.get("/console/api/tree", token="not-a-token-at-all-000").status_code == 401
    for spelling in ("/console/api/tree/", "/console/%61pi/tree", "//console/api/tree", "/console/api/../api/tree",
                     "/console/static/../api/tree", "/CONSOLE/api/tree"):
        response = httpx.get(served.base + spelling, follow_redirects=False)
        assert response.status_code in (401, 404), (spelling, response.status_code)
        assert "children" not in response.text, spelling
    shell = served.get("/console", token=None)
    assert shell.status_code == 200
    csp = shell.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "style-src 'self'" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp and "http" not in csp.replace("'self'", "")

    class Inline(HTMLParser):
        found: list[str] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            names = {name for name, _ in attrs}
            if tag == "script" and "src" not in names or tag == "style" or "style" in names or any(
                    name.startswith("on") for name in names):
                self.found.append(tag)
            for name, value in attrs:
                if name in ("src", "href") and value and not value.startswith("/console/static/"):
                    self.found.append(f"{tag} {name}={value}")

    parser = Inline()
    parser.feed(shell.text)
    assert parser.found == []
    for name in (name for name in STATIC if name.endswith((".js", ".css"))):
        asset = served.get(f"/console/static/{name}", token=None)
        assert asset.status_code == 200 and asset.headers["x-content-type-options"] == "nosniff"
        for unwanted in (".innerHTML", "insertAdjacentHTML", "eval(", "new Function", "http://", "https://"):
            assert unwanted not in asset.text, (name, unwanted)
    assert served.get("/console/static/..%2Fapp.py", token=None).status_code == 404
    api = served.get("/console/api/whoami")
    assert api.headers["cache-control"] == "no-store" and api.headers["content-security-policy"] == csp


def test_host_and_origin_are_checked_as_for_mcp(served: Served) -> None:
    for path in ("/console", "/console/api/tree", "/console/static/app.js"):
        evil_host = httpx.get(served.base + path, headers={"Host": "evil.example", "Authorization": f"Bearer {ADMIN}"})
        assert evil_host.status_code == 421, path
        evil_origin = httpx.get(served.base + path, headers={"Origin": "http://evil.example",
                                                             "Authorization": f"Bearer {ADMIN}"})
        assert evil_origin.status_code == 403, path


# --- the catalog ------------------------------------------------------------------------------------------------


def test_tree_is_paged_level_by_level(served: Served) -> None:
    root = _tree(served)
    assert [c["prefix"] for c in root["children"]] == ["docs://", "note://", "secret://", "web://"]
    assert root["total"] == 12
    docs = _all_children(served, "docs://", ADMIN, limit="2")
    labels = [c.get("prefix") or c["uri"] for c in docs]
    assert labels == ["docs://api.json", "docs://blob.bin", "docs://guides/", "docs://huge.txt", "docs://logo.png",
                      "docs://page.html", "docs://table.csv"]
    assert docs[2] == {"kind": "folder", "prefix": "docs://guides/", "count": 3}
    assert [c["uri"] for c in _all_children(served, "docs://guides/", ADMIN, "1")] == [
        "docs://guides/deploy.md", "docs://guides/intro.md", "docs://guides/setup.md"]
    assert served.get("/console/api/tree", cursor="bm90LWEtY3Vyc29y").status_code == 400
    assert served.get("/console/api/tree", limit="many").status_code == 400


def test_filters_and_search(served: Served) -> None:
    found = served.get("/console/api/list", prefix="docs://", mimeType="text/*").json()
    assert {c["uri"] for c in found["children"]} >= {"docs://guides/intro.md", "docs://table.csv"}
    assert all(c["mimeType"].startswith("text/") for c in found["children"])
    named = served.get("/console/api/list", name="*.json").json()
    assert [c["uri"] for c in named["children"]] == ["docs://api.json"]
    hits = served.get("/console/api/search", q="setup").json()
    assert hits["children"][0]["uri"] == "docs://guides/setup.md"


def test_search_has_a_total_pages_and_the_filters(served: Served) -> None:
    """Search results say how many there are, come in pages (a cursor), and honour mimeType and name as the list
    does: no JSON row for text/csv."""
    first = served.get("/console/api/search", q="guides", limit="2").json()
    assert first["total"] == 3 and first["more"] is False and len(first["children"]) == 2
    second = served.get("/console/api/search", q="guides", limit="2", cursor=first["nextCursor"]).json()
    assert len(second["children"]) == 1 and second["nextCursor"] is None
    uris = {c["uri"] for c in first["children"] + second["children"]}
    assert uris == {f"docs://guides/{n}.md" for n in ("intro", "setup", "deploy")}
    csv = served.get("/console/api/search", q="api", mimeType="text/csv").json()
    assert csv["children"] == [] and csv["total"] == 0
    named = served.get("/console/api/search", q="guides", name="*setup*").json()
    assert [c["uri"] for c in named["children"]] == ["docs://guides/setup.md"] and named["total"] == 1
    assert served.get("/console/api/search", q="guides", cursor="x").status_code == 400


def test_templates_complete_expand_and_preview(served: Served) -> None:
    templates = served.get("/console/api/templates").json()["templates"]
    guide = next(t for t in templates if t["name"] == "guide")
    assert guide["variables"] == [{"name": "name", "values": [], "multiSegment": False}]
    values = served.get("/console/api/complete", template="guide://{name}", name="name", prefix="in").json()
    assert values["values"] == ["intro"]
    uri = served.get("/console/api/expand", template="guide://{name}", **{"v.name": "intro"}).json()["uri"]
    assert uri == "guide://intro"
    read = served.get("/console/api/read", uri=uri).json()
    assert read["text"].startswith("# Intro") and read["language"] == "markdown"


def test_preview_kinds_and_the_limits_of_resources_read(served: Served) -> None:
    as_json = served.get("/console/api/read", uri="docs://api.json").json()
    assert as_json["kind"] == "text" and as_json["language"] == "json"
    assert served.get("/console/api/read", uri="docs://table.csv").json()["language"] == "csv"
    image = served.get("/console/api/read", uri="docs://logo.png").json()
    assert image == {"uri": "docs://logo.png", "mimeType": "image/png", "ttl": 300.0, "kind": "image",
                     "size": len(Path(served.folder / "docs" / "logo.png").read_bytes())}
    raw = served.get("/console/api/raw", uri="docs://logo.png")
    assert raw.headers["content-type"] == "image/png" and raw.headers["content-disposition"].startswith("inline")
    assert "sandbox" in raw.headers["content-security-policy"]
    html = served.get("/console/api/raw", uri="docs://page.html")
    assert html.headers["content-type"] == "application/octet-stream"
    assert html.headers["content-disposition"].startswith("attachment")
    assert served.get("/console/api/read", uri="docs://blob.bin").json()["kind"] == "binary"
    huge = served.get("/console/api/read", uri="docs://huge.txt")
    assert huge.status_code == 413 and "8192" in huge.json()["error"]
    missing = served.get("/console/api/read", uri="docs://nope.md")
    assert missing.status_code == 404 and missing.json() == {"error": "Resource not found"}
    down = served.get("/console/api/read", uri="web://down")
    assert down.status_code == 502 and "hunter2" not in down.text


def test_read_with_detail_gives_the_listing_the_cache_state_and_the_raw_result(served: Served) -> None:
    note = served.get("/console/api/read", uri="note://hello", detail="1").json()["detail"]
    assert note["listed"]["title"] == "Hello note" and note["listed"]["annotations"] == {
        "audience": ["user", "assistant"], "priority": 0.8, "lastModified": "2026-01-02T03:04:05Z"}
    assert note["cache"]["state"] == "uncached"
    assert note["result"] == {"contents": [{"uri": "note://hello", "mimeType": "text/plain", "text": "hello there"}],
                              "ttlMs": 300_000, "cacheScope": "public", "resultType": "complete"}
    first = served.get("/console/api/read", uri="docs://guides/deploy.md", detail="1").json()["detail"]
    assert first["cache"]["state"] == "miss" and first["cache"]["after"]["freshFor"] > 0
    again = served.get("/console/api/read", uri="docs://guides/deploy.md", detail="1").json()["detail"]
    assert again["cache"]["state"] == "hit" and 0 < again["cache"]["freshFor"] <= 300
    assert again["cache"]["bytes"] >= len("# Deploy\n\nSee `deploy` and **more**.\n")  # and its bookkeeping
    assert again["listed"]["source"] == "docs" and again["truncated"] is False
    image = served.get("/console/api/read", uri="docs://logo.png", detail="1").json()["detail"]
    assert "blob" in image["result"]["contents"][0]
    # Through a template: nothing listed, the read's own answer still shown.
    guide = served.get("/console/api/read", uri="guide://intro", detail="1").json()["detail"]
    assert guide["listed"] is None and guide["result"]["contents"][0]["text"].startswith("# Intro")
    for token in (READER, NOBODY):
        hidden = served.get("/console/api/read", token, uri="secret://plan.md", detail="1")
        missing = served.get("/console/api/read", token, uri="secret://nope.md", detail="1")
        assert (hidden.status_code, hidden.json()) == (missing.status_code, missing.json()) == (
            404, {"error": "Resource not found"})


def test_the_detail_knows_a_querys_cache_state_that_a_render_is_never_cached_and_cuts_its_raw_text(tmp_path: Path) -> None:
    import sqlalchemy

    url = f"sqlite:///{tmp_path / 'crm.db'}"
    with sqlalchemy.create_engine(url).begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE customers (id INTEGER PRIMARY KEY, name VARCHAR(100))"))
        conn.execute(sqlalchemy.text("INSERT INTO customers VALUES (1, 'Ada')"))
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(f"""version: 1
server: {{name: detail, console: true}}
sources:
  crm: {{url: "{url}", tables: [customers]}}
resources:
  - {{uri: "report://all", name: report, render: "{{{{ resources('db://') | length }}}} customers"}}
  - {{uri: "note://big", name: big, text: "{'x' * 70_000}"}}
templates:
  - {{uriTemplate: "db://crm/customers/{{id}}", name: customer, source: crm,
     query: "SELECT id, name FROM customers WHERE id = :id"}}
""")
    with serve(tmp_path, manifest) as running:
        def detail(uri: str) -> dict[str, Any]:
            response = running.get("/console/api/read", None, uri=uri, detail="1")
            assert response.status_code == 200, response.text
            return dict(response.json()["detail"])

        assert detail("db://crm/customers/1")["cache"]["state"] == "miss"
        again = detail("db://crm/customers/1")
        assert again["cache"]["state"] == "hit" and "Ada" in again["result"]["contents"][0]["text"]
        assert detail("db://crm/customers/2")["cache"]["state"] == "miss"  # its own parameters, its own entry
        assert detail("report://all")["cache"] == {"state": "uncached", "why": "rendered on each read"}
        big = running.get("/console/api/read", None, uri="note://big", detail="1").json()
        assert len(big["text"]) == 70_000 and big["truncated"] is False  # the preview: up to PREVIEW_CHARS
        assert big["detail"]["truncated"] is True  # the raw JSON shows the shape, not the text again
        assert len(big["detail"]["result"]["contents"][0]["text"]) == RAW_CHARS


# --- access: exactly what the token may see ---------------------------------------------------------------------


def test_a_token_without_the_scope_sees_no_hidden_entry_anywhere(served: Served) -> None:
    for token in (READER, NOBODY):
        root = _tree(served, token=token)
        assert "secret://" not in json.dumps(root) and root["total"] == 11
        assert _tree(served, "secret://", token) == {"prefix": "secret://", "children": [], "nextCursor": None,
                                                     "total": 0}
        texts = [served.get(path, token, **params).text for path, params in [
            ("/console/api/list", {"prefix": "secret://"}), ("/console/api/list", {"name": "plan*"}),
            ("/console/api/search", {"q": "classified"}), ("/console/api/search", {"q": "plan"}),
            ("/console/api/templates", {}), ("/console/api/sources", {}), ("/console/api/whoami", {}),
            ("/console/api/reloads", {})]]
        for text in texts:
            assert "secret" not in text, text
        for path, params in [("/console/api/read", {"uri": "secret://plan.md"}),
                             ("/console/api/raw", {"uri": "secret://plan.md"}),
                             ("/console/api/read", {"uri": "secret://by-name/plan"}),
                             ("/console/api/expand", {"template": "secret://by-name/{name}", "v.name": "plan"}),
                             ("/console/api/complete", {"template": "secret://by-name/{name}", "name": "name"})]:
            refused = served.get(path, token, **params)
            assert refused.status_code == 404 and refused.json() == {"error": "Resource not found"}, path
        assert served.get("/console/api/tree", token, **{"as": "*"}).status_code == 403
    assert "secret://plan.md" in json.dumps(_tree(served, "secret://"))


def test_an_admin_views_the_console_as_other_scopes(served: Served) -> None:
    who = served.get("/console/api/whoami").json()
    assert who["admin"] is True and who["knownScopes"] == ["secret"] and who["caller"] == "admin"
    assert served.get("/console/api/whoami", READER).json()["admin"] is False
    assert "knownScopes" not in served.get("/console/api/whoami", READER).json()
    as_reader = _tree(served, **{"as": "docs"})
    assert as_reader == _tree(served, token=READER)
    assert _tree(served, **{"as": "*"})["total"] == 12
    assert served.get("/console/api/read", uri="secret://plan.md", **{"as": ","}).status_code == 404


def test_sources_show_health_cache_and_redacted_errors(served: Served) -> None:
    served.get("/console/api/read", uri="docs://api.json")
    served.get("/console/api/read", uri="docs://api.json")
    served.get("/console/api/read", uri="web://down")
    body = served.get("/console/api/sources").json()
    rows = {row["id"]: row for row in body["sources"]}
    assert set(rows) == {"docs", "secret", "web"}
    docs = rows["docs"]
    assert docs["kind"] == "file" and docs["resources"] == 9 and docs["change"] == "watched"
    assert docs["cache"]["hits"] >= 1 and docs["cache"]["bytes"] > 0 and docs["listedAt"] > time.time() - 3600
    web = rows["web"]
    assert web["errors"] >= 1 and "lastError" in web
    text = json.dumps(body)
    assert "hunter2" not in text and str(served.folder) not in text
    reader = served.get("/console/api/sources", READER).json()
    assert [row["id"] for row in reader["sources"]] == ["docs", "web"]
    assert "cache" not in reader and all("lastError" not in row for row in reader["sources"])


# --- reloads and live events ------------------------------------------------------------------------------------


class Events:
    """An event stream read in a thread: frames as (event, data) in arrival order."""

    def __init__(self, served: Served, token: str) -> None:
        self.frames: list[tuple[str, dict[str, Any]]] = []
        self.arrived = threading.Condition()
        self._client = httpx.Client(timeout=httpx.Timeout(30, read=60))
        self._stop = False
        self._response: httpx.Response | None = None
        self._thread = threading.Thread(target=self._read, args=(served, token), daemon=True)
        self._thread.start()

    def _read(self, served: Served, token: str) -> None:
        try:
            with self._client.stream("GET", served.base + "/console/api/events",
                                     headers={"Authorization": f"Bearer {token}"}) as response:
                self._response = response
                event = ""
                for line in response.iter_lines():
                    if self._stop:
                        return
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        with self.arrived:
                            self.frames.append((event, json.loads(line[6:])))
                            self.arrived.notify_all()
        except httpx.HTTPError:
            return

    def wait_for(self, event: str, timeout: float = 20, **data: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.arrived:
            while True:
                for name, got in self.frames:
                    if name == event and all(got.get(k) == v for k, v in data.items()):
                        return got
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {event} {data} in {self.frames}")
                self.arrived.wait(left)

    def close(self) -> None:
        """Close the connection now, as a closed tab does (the reading thread is woken; closing the client alone
        leaves the connection open until the next frame arrives)."""
        self._stop = True
        stream = self._response.extensions.get("network_stream") if self._response is not None else None
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed
        self._client.close()


@contextmanager
def _admin_and_reader(running: Served) -> Iterator[tuple[Events, Events]]:
    """The admin's and the reader's event streams, each past its `hello`; closed after the block."""
    admin, reader = Events(running, ADMIN), Events(running, READER)
    try:
        admin.wait_for("hello")
        reader.wait_for("hello")
        yield admin, reader
    finally:
        admin.close()
        reader.close()


def test_reloads_and_events_follow_saves_filtered_by_scope(tmp_path: Path) -> None:
    with serve(tmp_path) as running:
        with _admin_and_reader(running) as (admin, reader):
            text = running.manifest.read_text()
            save(running.manifest, text.replace(
                "resources:\n", 'resources:\n  - {uri: "note://new", name: new, text: "new"}\n'
                '  - {uri: "secret://note", name: hush, text: "hush", access: {scopes: [secret]}}\n'))
            assert admin.wait_for("catalog")["generation"] == 2
            assert reader.wait_for("reload", ok=True) == {"ok": True}  # no generation for a scoped caller
            lines = running.get("/console/api/reloads").json()["reloads"][0]["lines"]
            assert lines == ["+ note://new", "+ secret://note"]
            seen = running.get("/console/api/reloads", READER).json()["reloads"][0]
            assert seen["lines"] == ["+ note://new"] and seen["moreLines"] == 0
            # A broken save: refused, located, relative to the manifest's folder, no host path.
            save(running.manifest, running.manifest.read_text().replace("collections:", "collections: 7\nbad:"))
            refused = admin.wait_for("reload", ok=False)
            assert refused["generation"] == 2
            body = running.get("/console/api/reloads").json()
            last = body["reloads"][0]
            assert last["ok"] is False and last["issues"] and last["issues"][0]["file"] == "manifest.yaml"
            assert last["issues"][0]["line"] > 0 and str(tmp_path) not in json.dumps(body)
            hidden = running.get("/console/api/reloads", READER).json()["reloads"][0]
            assert hidden["issues"] == [] and "need a token" in hidden["error"]
            assert all("secret" not in json.dumps(f) for f in reader.frames)


def test_a_scoped_stream_hears_no_catalog_event_for_hidden_changes(tmp_path: Path) -> None:
    """A save that adds only a hidden entry: the admin's stream hears `catalog` and `reload`, the reader's neither,
    and the reader's Reloads list leaves it out (it would learn that, and when, something hidden changed); a later
    visible change reaches both."""
    with serve(tmp_path) as running:
        with _admin_and_reader(running) as (admin, reader):
            text = running.manifest.read_text()
            hidden = text.replace("resources:\n", 'resources:\n  - {uri: "secret://hush", name: hush, text: "h", '
                                                  "access: {scopes: [secret]}}\n")
            save(running.manifest, hidden)
            assert admin.wait_for("catalog")["generation"] == 2
            admin.wait_for("reload", generation=2)
            save(running.manifest, hidden.replace("resources:\n", 'resources:\n  - {uri: "note://new", name: new, '
                                                                  'text: "new"}\n'))
            assert admin.wait_for("catalog", generation=3) and reader.wait_for("catalog") == {}
            reader.wait_for("reload")
            assert [f for f in reader.frames if f[0] != "hello"] == [("catalog", {}), ("reload", {"ok": True})]
            listed = running.get("/console/api/reloads", READER).json()["reloads"]
            assert [r["lines"] for r in listed] == [["+ note://new"]]
            assert [r["generation"] for r in running.get("/console/api/reloads").json()["reloads"]] == [3, 2]


def test_a_stream_opened_with_a_jwt_ends_when_the_token_expires(tmp_path: Path) -> None:
    """A JWT good for a few seconds: its stream says `expired` and ends then (the page asks for a new token), while
    a static token's stream, opened at the same time, goes on."""
    from tests.test_auth import ISSUER, Keys, jwks_server

    keys = Keys()
    manifest = make_folder(tmp_path)
    with jwks_server(keys) as jwks:
        manifest.write_text(manifest.read_text().replace(
            "  auth:\n", f'  auth:\n    jwt: {{issuer: "{ISSUER}", jwksUrl: "{jwks}", leeway: 0s}}\n'))
        with serve(tmp_path, manifest) as running:
            token = keys.token(running.base + "/mcp", scope="docs", expires_in=4)
            short, static = Events(running, token), Events(running, READER)
            try:
                short.wait_for("hello")
                static.wait_for("hello")
                short.wait_for("expired", timeout=30)
                short._thread.join(10)
                assert not short._thread.is_alive()  # the server ended the response
                assert static._thread.is_alive() and not any(f[0] == "expired" for f in static.frames)
            finally:
                short.close()
                static.close()


def test_the_open_preview_hears_when_its_file_changes(tmp_path: Path) -> None:
    """With no MCP client subscribed, a page's read names its stream (from `hello`): when the previewed file
    changes, that stream hears `updated` for it, so the preview refreshes instead of going stale under "live"."""
    with serve(tmp_path) as running:
        reader = Events(running, READER)
        try:
            stream = reader.wait_for("hello")["stream"]
            read = running.get("/console/api/read", READER, uri="docs://api.json", stream=stream)
            assert read.status_code == 200
            time.sleep(0.3)  # the watcher is up
            (running.folder / "docs" / "api.json").write_text('{"version": 3}')
            reader.wait_for("updated", uri="docs://api.json")
            assert '"version": 3' in running.get("/console/api/read", READER, uri="docs://api.json").text.replace(
                '\\"', '"')
        finally:
            reader.close()


def test_updated_events_reach_only_streams_whose_token_sees_the_uri(tmp_path: Path) -> None:
    """An MCP client (the admin's token) subscribes to a public and a hidden file; both change. The admin's console
    stream hears both `updated` events, the reader's only the public one."""
    import warnings

    from tests.test_auth import _client

    with serve(tmp_path) as running:
        with _admin_and_reader(running) as (admin, reader):

            async def main() -> None:
                async with _client(running.base + "/mcp", ADMIN, "legacy") as client:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        await client.subscribe_resource("secret://plan.md")
                        await client.subscribe_resource("docs://api.json")
                    await watchers_up(running.folder / "secret", running.folder / "docs")
                    (running.folder / "secret" / "plan.md").write_text("# a new plan\n")
                    await anyio.to_thread.run_sync(lambda: admin.wait_for("updated", uri="secret://plan.md"))
                    (running.folder / "docs" / "api.json").write_text('{"version": 3}')
                    await anyio.to_thread.run_sync(lambda: reader.wait_for("updated", uri="docs://api.json"))
                    await anyio.to_thread.run_sync(lambda: admin.wait_for("updated", uri="docs://api.json"))

            anyio.run(main)
            # The public event came after the hidden one: had the hidden one reached the reader, it would be here.
            assert [f for f in reader.frames if f[0] == "updated"] == [("updated", {"uri": "docs://api.json"})]


def _stream_status(served: Served, token: str) -> tuple[int, str]:
    """The status of a new event stream (and, when refused, its message), without reading an accepted one."""
    with httpx.Client(timeout=httpx.Timeout(30, read=60)) as client, client.stream(
            "GET", served.base + "/console/api/events", headers={"Authorization": f"Bearer {token}"}) as response:
        return response.status_code, response.read().decode() if response.status_code != 200 else ""


def test_event_streams_are_capped_per_caller_with_a_reserve_for_the_admin_scope(tmp_path: Path) -> None:
    """Three streams in all, two per caller, one kept for the admin scope: a reader holding two gets no third,
    nobody gets none past the non-admin share, the admin still gets one; a closed stream gives its slot back."""
    manifest = make_folder(tmp_path)
    manifest.write_text(manifest.read_text().replace(
        "console: {adminScope: admin}", "console: {adminScope: admin, maxStreams: 3, maxStreamsPerCaller: 2, "
                                        "adminStreams: 1}"))
    with serve(tmp_path, manifest) as running:
        readers = [Events(running, READER), Events(running, READER)]
        admin: Events | None = None
        try:
            for reader in readers:
                reader.wait_for("hello")
            status, message = _stream_status(running, READER)
            assert status == 503 and "this caller already holds 2" in message
            status, message = _stream_status(running, NOBODY)
            assert status == 503 and "too many" in message
            admin = Events(running, ADMIN)
            admin.wait_for("hello")
            assert _stream_status(running, ADMIN)[0] == 503  # all three are open
            # A closed page frees its slot when the server hears the disconnect, not at the stream's next heartbeat
            # (when a write would fail): the new stream is let in well within one heartbeat interval.
            readers.pop().close()
            deadline = time.monotonic() + HEARTBEAT_S / 3
            while (status := _stream_status(running, NOBODY)[0]) != 200 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert status == 200
        finally:
            for events in [*readers, *([admin] if admin else [])]:
                events.close()


def test_updated_events_pass_only_for_uris_the_stream_may_see() -> None:
    from mcp.server.subscriptions import InMemorySubscriptionBus, ResourceUpdated

    async def main() -> None:
        bus = InMemorySubscriptionBus()
        hub = EventHub(bus, ReloadHistory(), max_streams=2)
        stream = hub.stream(lambda uri: not uri.startswith("secret:"), lambda: 7)
        assert "hello" in await stream.__anext__()
        await bus.publish(ResourceUpdated(uri="secret://plan.md"))
        await bus.publish(ResourceUpdated(uri="docs://a.md"))
        frame = await stream.__anext__()
        assert frame == 'event: updated\ndata: {"uri":"docs://a.md"}\n\n'
        await stream.aclose()

    anyio.run(main)


def test_event_streams_are_capped_bounded_and_end_when_closed() -> None:
    from mcp.server.subscriptions import InMemorySubscriptionBus, ResourcesListChanged

    async def main() -> None:
        bus = InMemorySubscriptionBus()
        history = ReloadHistory()
        hub = EventHub(bus, history, max_streams=1)
        first = hub.stream(lambda uri: True, lambda: 1)
        await first.__anext__()
        second = hub.stream(lambda uri: True, lambda: 1)
        with pytest.raises(TooManyStreams):
            await second.__anext__()
        # A page that does not read: the queue stays bounded, and the stream says `resync` once.
        for _ in range(1000):
            await bus.publish(ResourcesListChanged())
        frame = await first.__anext__()
        assert frame.startswith("event: resync")
        await first.aclose()  # a closed tab: its subscription and its slot go
        assert hub.streams == 0 and len(history.listeners) == 0
        again = hub.stream(lambda uri: True, lambda: 1)
        await again.__anext__()
        hub.close()  # serving stops: the stream ends
        with pytest.raises(StopAsyncIteration):
            await again.__anext__()
        assert hub.streams == 0

    anyio.run(main)


def test_a_stream_ends_when_its_client_disconnects_under_any_asgi_spec_version() -> None:
    """Starlette's StreamingResponse listens for `http.disconnect` only below ASGI spec 2.4 (uvicorn's HTTP
    protocols say 2.3 today); the console's response does under any version, so a closed page gives its slot back
    at once rather than at the next heartbeat, when a write would fail."""
    from mcp.server.subscriptions import InMemorySubscriptionBus

    async def main() -> None:
        hub = EventHub(InMemorySubscriptionBus(), ReloadHistory(), max_streams=1)
        gone = anyio.Event()

        async def receive() -> dict[str, Any]:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message.get("body"):
                gone.set()  # the page got its `hello`, then the tab is closed

        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "method": "GET", "headers": []}
        response = EventStreamResponse(hub.stream(lambda uri: True, lambda: 1), media_type="text/event-stream")
        with anyio.fail_after(HEARTBEAT_S / 3):
            await response(scope, receive, send)
        assert hub.streams == 0

    anyio.run(main)


# --- the parts ------------------------------------------------------------------------------------------------


def _catalog(uris: list[str]) -> Catalog:
    display = Display()
    return Catalog([Entry(uri, uri.rsplit("/", 1)[-1], display) for uri in uris], [])


def test_the_scopes_a_catalog_asks_for_are_found_without_building_its_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a scoped caller sees everything is asked of each new catalog (every change makes one) by its event
    stream: the scopes come from the makers its rows use and its explicit rows, never from building every entry
    (1.7 s at a million rows); a maker whose rows all went asks for nothing."""
    from aggregator.catalog_rows import Rows
    from aggregator.console.views import _entry_scopes
    from tests.test_rows_change import _rows

    files = {"a.md": (1, None), "sp ace.md": (1, None)}  # a compact row and an explicit one (its URI is encoded)
    rows = _rows((frozenset({"s"}), False, files, {"x": ("text", frozenset({"t"}))}))
    alone = rows.edited([uri for uri in rows.uris if not uri.startswith("note:")], [])
    expected = [frozenset({"s", "t"}), frozenset({"t"})]
    assert [frozenset().union(*(e.access for e in r)) for r in (rows, alone)] == expected

    def built(*_: object) -> None:
        raise AssertionError("an entry was built")

    monkeypatch.setattr(Rows, "__iter__", built)
    monkeypatch.setattr(Rows, "__getitem__", built)
    assert [_entry_scopes(Catalog(r, [])) for r in (rows, alone)] == expected


def test_tree_pages_reassemble_the_catalog() -> None:
    uris = sorted({f"{scheme}://{a}/{b}/{c}.md" for scheme in ("docs", "wiki", "a") for a in "xyz" for b in "pq"
                   for c in range(7)} | {"docs://top.md", "plain", "urn:isbn:1", "docs://x/"})
    catalog = _catalog(uris)
    entries, keys = catalog.visible(None)
    found: list[str] = []

    def walk(prefix: str) -> None:
        cursor = None
        while True:
            page = tree_page(entries, keys, prefix, cursor, 2)
            for child in page.children:
                if isinstance(child, Folder):
                    assert child.count == len([u for u in uris if u.startswith(child.prefix)])
                    walk(child.prefix)
                else:
                    found.append(child.uri)
            cursor = page.next_cursor
            if cursor is None:
                return

    walk("")
    assert sorted(found) == uris and len(found) == len(set(found))


def test_redaction_takes_out_credentials_and_paths() -> None:
    text = ("GET https://bob:s3cret@example.com/x?token=abc&page=2 failed: Authorization: Bearer xyz; "
            "password=hunter2 reading /srv/data/docs/a.md and /etc/passwd")
    out = redact(text, {"/srv/data/docs": "<docs>"})
    for secret in ("s3cret", "abc", "xyz", "hunter2", "/srv/data", "/etc/"):
        assert secret not in out, out
    assert "page=2" in out and "<docs>/a.md" in out and "…/passwd" in out
    assert where("/srv/m/manifest.yaml", "/srv/m") == "manifest.yaml"
    assert where("/etc/other.yaml", "/srv/m") == "other.yaml"
    assert re.fullmatch(r"https://\*\*\*@h/", redact("https://u:p@h/"))


@pytest.mark.parametrize(("value", "expected"), [
    ("true", ConsoleSettings()), ("false", None), ("{adminScope: ops}", ConsoleSettings(admin_scope="ops")),
    (None, None)])
def test_server_console_setting(tmp_path: Path, value: str | None, expected: ConsoleSettings | None) -> None:
    line = f"  console: {value}\n" if value is not None else ""
    manifest = tmp_path / "m.yaml"
    manifest.write_text(f"version: 1\nserver:\n  name: s\n{line}resources:\n  - {{uri: 'a://b', name: b, text: c}}\n")
    assert load_manifest(manifest).server.console == expected


@pytest.mark.parametrize("value", ["{adminScope: ''}", "{admin: ops}", "yes please", "[ops]"])
def test_a_bad_console_setting_is_refused_where_it_is(tmp_path: Path, value: str) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(f"version: 1\nserver:\n  name: s\n  console: {value}\nresources:\n"
                        "  - {uri: 'a://b', name: b, text: c}\n")
    with pytest.raises(ManifestError) as refused:
        load_manifest(manifest)
    assert any(issue.line == 4 and issue.key.startswith("server.console") for issue in refused.value.issues), \
        refused.value


def test_replica_and_manifest_digest_are_shown_in_a_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, through the ASGI app, with a supervisor on a real change bus (not started, so not connected):
    whoami and sources name the replica, its link state and the manifest's sha256 (this anonymous caller sees
    everything: the manifest's scope is taken out; a scoped one is not told the digest, see test_console_scoped)."""
    import hashlib

    from mcp.server.transport_security import TransportSecurityMiddleware
    from starlette.applications import Starlette

    from aggregator.cluster.bus import ChangeBus
    from aggregator.cluster.link import RedisLink
    from aggregator.console.app import Console
    from aggregator.http_app import transport_security
    from aggregator.manifest.model import ClusterSettings
    from aggregator.notify import Notifier
    from aggregator.service import ResourceService
    from aggregator.supervisor import Supervisor
    from tests.console_server import TOKENS, make_folder

    for name, value in TOKENS.items():
        monkeypatch.setenv(name, value)
    manifest = make_folder(tmp_path)
    manifest.write_text(manifest.read_text().replace(", access: {scopes: [secret]}", ""))

    async def main() -> None:
        service = await ResourceService.open(manifest)
        link = RedisLink(ClusterSettings(redis="redis://:secret@127.0.0.1:1/0", prefix="console-test"), "replica-7")
        try:
            live = Supervisor(service, Notifier(), cluster=ChangeBus(link))
            guard = TransportSecurityMiddleware(transport_security("127.0.0.1", 80, service.manifest.server.http))
            app = Starlette(routes=Console(live).routes(guard))
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
                who = (await http.get("/console/api/whoami")).json()
                sources = (await http.get("/console/api/sources")).json()
        finally:
            await link.aclose()
            await service.aclose()
        for body in (who, sources):
            assert body["cluster"] == {"replica": "replica-7", "connected": False}
            assert body["manifestDigest"] == hashlib.sha256(manifest.read_bytes()).hexdigest()
            assert ":secret@" not in json.dumps(body)  # the cluster's Redis password

    anyio.run(main)


def test_reload_history_is_bounded_keeps_one_copy_of_a_repeated_refusal_and_cuts_long_diffs(tmp_path: Path) -> None:
    from aggregator.console import history as history_module
    from aggregator.entry_spans import whole
    from aggregator.manifest.model import ManifestIssue

    manifest = tmp_path / "m.yaml"
    manifest.write_text("version: 1\nserver: {name: s}\nresources:\n  - {uri: 'a://b', name: b, text: c}\n")
    loaded = load_manifest(manifest)
    history = ReloadHistory(keep_diffs=True)
    issue = ManifestIssue(str(manifest), 3, 1, "resources", "bad")
    history.failed(1, [issue])
    history.failed(1, [issue])  # the supervisor retries a broken save on every check
    assert len(history.records) == 1
    old, new = _catalog(["a://b"]), _catalog([f"a://{i:05}" for i in range(history_module.KEPT_LINES + 5)])
    anyio.run(history.succeeded, old, loaded, new, loaded, whole(old.entries, new.entries))
    record = history.records[-1]
    assert record.ok and len(record.lines) == history_module.KEPT_LINES and record.more == 6
    assert record.lines[0].text == "+ a://00000"
    view = reload_view(record, None, True, str(manifest), limit=10)
    assert len(view["lines"]) == 10 and view["moreLines"] == history_module.KEPT_LINES - 10 + 6
    for i in range(history_module.KEPT_RELOADS + 5):
        history.failed(2, error=f"failure {i}")
    assert len(history.records) == history_module.KEPT_RELOADS
    assert history.last(1)[0].error == f"failure {history_module.KEPT_RELOADS + 4}"
    quiet = ReloadHistory()  # no console: no diff is computed
    anyio.run(quiet.succeeded, old, loaded, new, loaded, whole(old.entries, new.entries))
    assert quiet.records[-1].lines == ()


def test_an_mcp_upstream_shows_its_connection_and_reconnects(tmp_path: Path) -> None:
    from tests.conftest import write_manifest
    from tests.test_mcp_kind import UPSTREAM
    from tests.test_upstream import ENV

    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: gateway, console: true}}
        sources:
          up: {{url: "mcp+stdio:", prefix: "test://", command: {UPSTREAM!r}, env: {ENV!r}}}
        templates:
          - {{uriTemplate: "wiki://static/{{name}}", name: static, source: up, path: "static-{{name}}"}}
        """)
    with serve(tmp_path, manifest) as running:
        read = running.get("/console/api/read", token=None, uri="wiki://static/text")
        assert read.json()["text"] == "Hello from one"
        [row] = running.get("/console/api/sources", token=None).json()["sources"]
        assert (row["id"], row["kind"], row["change"]) == ("up", "mcp", "pushed")
        assert row["upstream"]["state"] == "connected" and row["upstream"]["reconnects"] == 0


def test_a_failing_source_says_why_when_it_last_worked_and_when_it_retries(tmp_path: Path) -> None:
    """An mcp upstream on a closed port: its row says failing, the redacted cause (no credential, no host path),
    when it will try again; the working sources say when they last succeeded; the body counts failing sources.
    A token that does not see everything gets the flag and the times, not the cause."""
    from tests.replicas import free_port

    manifest = make_folder(tmp_path)
    manifest.write_text(manifest.read_text().replace(
        "collections:\n", f"  up: {{url: \"mcp+http://127.0.0.1:{free_port()}/mcp?key=hunter2\", prefix: \"x://\", "
                          "allowPrivateNetwork: true, timeout: 2s, headers: {Authorization: Bearer hunter2}}\n"
                          "collections:\n").replace(
        "templates:\n", "templates:\n  - {uriTemplate: \"up://{name}\", name: up, source: up, path: \"{name}\"}\n"))
    with serve(tmp_path, manifest) as running:
        assert running.get("/console/api/read", uri="docs://huge.txt").status_code == 413  # the file's problem
        assert running.get("/console/api/read", uri="docs://api.json").status_code == 200
        assert running.get("/console/api/read", uri="up://thing").status_code == 502
        body = running.get("/console/api/sources").json()
        rows = {row["id"]: row for row in body["sources"]}
        up, docs = rows["up"], rows["docs"]
        assert up["failing"] is True and up["upstream"]["state"] == "failed"
        assert up["lastError"]["message"] and up["lastError"]["at"] > time.time() - 600
        assert up["retryAt"] is not None and up["retryAt"] > time.time() - 5
        assert docs["failing"] is False and docs["lastSuccessAt"] > time.time() - 600  # its 413 is kept as lastError
        assert body["failing"] == sorted(sid for sid, row in rows.items() if row["failing"])
        assert "up" in body["failing"] and "docs" not in body["failing"]
        assert running.get("/console/api/whoami").json()["failingSources"] == body["failing"]
        text = json.dumps(body)
        assert "hunter2" not in text and str(tmp_path) not in text
        reader = {row["id"]: row for row in running.get("/console/api/sources", READER).json()["sources"]}
        assert reader["up"]["failing"] is True and reader["up"]["retryAt"] is not None
        assert "lastError" not in reader["up"] and "lastError" not in reader["up"].get("upstream", {})


def test_raw_sends_no_type_it_was_given_as_a_header(tmp_path: Path) -> None:
    """/console/api/raw never writes a resource's mimeType into its Content-Type: an inline image gets the image
    type it was recognised as, anything else is a download, whatever the type (control characters, a header
    injection from an upstream, the manifest's own parameters; the manifest's schema refuses control characters
    in a type, test_manifest_schema)."""
    import sys

    from tests.conftest import write_manifest
    from tests.test_upstream import HERE

    hostile = [sys.executable, str(HERE / "hostile_upstream.py"), "values"]
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: gateway, console: true}}
        sources:
          va: {{url: "mcp+stdio:", namespace: va, command: {hostile!r}}}
        resources:
          - {{uri: "note://ctl", name: ctl, text: "x", mimeType: "image/png; x=y"}}
          - {{uri: "note://cr", name: cr, text: "x", mimeType: "text/plain; a=b"}}
        """)
    with serve(tmp_path, manifest) as running:
        for uri, kind, disposition in [("note://ctl", "image/png", "inline"),
                                       ("note://cr", "application/octet-stream", "attachment"),
                                       ("va+h://m/1", "application/octet-stream", "attachment"),
                                       ("va+h://bad-mime", "application/octet-stream", "attachment")]:
            raw = running.get("/console/api/raw", token=None, uri=uri)
            assert raw.status_code == 200, (uri, raw.text)
            assert raw.headers["content-type"] == kind and raw.headers["content-disposition"].startswith(disposition)
            assert "x-injected" not in raw.headers
        assert "Traceback" not in running.log.read_text()


def test_a_converted_document_is_previewed_and_downloaded_as_markdown(tmp_path: Path) -> None:
    """A `convert: markdown` entry's preview is its Markdown (the read path's conversion), highlighted as Markdown;
    its download is that Markdown under a name that says so, not a .pdf holding text."""
    import shutil

    pytest.importorskip("pypdfium2", reason="the documents extra is not installed: pip install -e '.[documents]'")
    from tests.conftest import write_manifest
    from tests.documents_gen import DATA

    (tmp_path / "files").mkdir()
    shutil.copy(DATA / "crazyones.pdf", tmp_path / "files" / "crazyones.pdf")
    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: documents, console: true}
        sources:
          files: {url: ./files}
        collections:
          - {source: files, glob: "*.pdf", uri: "doc://{path}", convert: markdown}
        """)
    with serve(tmp_path, manifest) as running:
        preview = running.get("/console/api/read", token=None, uri="doc://crazyones.pdf").json()
        assert (preview["kind"], preview["mimeType"], preview["language"]) == ("text", "text/markdown", "markdown")
        assert preview["text"].startswith("<!-- page 1 -->\n\nThe Crazy Ones\nOctober 14, 1998")
        raw = running.get("/console/api/raw", token=None, uri="doc://crazyones.pdf")
        assert raw.content.decode().startswith("<!-- page 1 -->")
        assert raw.headers["content-disposition"] == 'attachment; filename="crazyones.pdf.md"'
