"""End to end: the official MCP client drives `aggregator serve` over stdio on both protocol wires."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from tests.conftest import MODES, PNG_BYTES, connect, list_all

LEGACY_NOT_FOUND = -32002
INVALID_PARAMS = -32602


def expected_not_found(mode: str) -> int:
    return LEGACY_NOT_FOUND if mode == "legacy" else INVALID_PARAMS


@pytest.mark.parametrize("mode", MODES)
def test_handshake_listing_and_pagination(docs_manifest: Path, mode: str) -> None:
    async def main() -> None:
        async with connect(docs_manifest, mode) as client:
            assert client.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
            assert client.server_info.name == "test-docs"
            assert client.server_info.version == "9.9.9"
            assert client.server_info.title == "Test docs"
            assert client.instructions == "Read the README first."
            assert client.server_capabilities.resources is not None
            # Truthful on both wires: the server sends list_changed and takes subscriptions.
            assert client.server_capabilities.resources.subscribe
            assert client.server_capabilities.resources.list_changed

            resources, pages = await list_all(client)
            uris = [r.uri for r in resources]
            # 3 resources + 12 pages + README.md + inner-link.md (hidden file, outside links excluded)
            assert len(uris) == 17, uris
            assert pages == 4  # pageSize 5
            assert uris == sorted(uris) and len(set(uris)) == len(uris)
            assert "docs://.hidden.md" not in uris
            assert not any("oldlink" in u or "escape" in u for u in uris)
            by_uri = {r.uri: r for r in resources}
            page = by_uri["docs://guides/page01.md"]
            assert page.name == "page01" and page.mime_type == "text/markdown"
            assert page.size == len("# Page 1\n\nBody 1.\n")
            assert page.annotations and page.annotations.last_modified.endswith("Z")  # lastModified: file
            assert by_uri["docs://readme"].annotations is None  # listed only when the manifest asks
            assert by_uri["img://logo"].mime_type == "image/png"
            assert by_uri["note://inline"].size == len("Inline content")

            first = await client.list_resources()
            if mode == "auto":
                assert first.ttl_ms == 90_000 and first.cache_scope == "public"
            with pytest.raises(MCPError) as err:
                await client.list_resources(cursor="not-a-cursor!")
            assert err.value.code == INVALID_PARAMS

            templates = await client.list_resource_templates()
            assert sorted(t.uri_template for t in templates.resource_templates) == ["file://docs/{+path}", "page://{name}"]

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_reads_text_binary_inline_and_templates(docs_manifest: Path, mode: str) -> None:
    async def main() -> None:
        async with connect(docs_manifest, mode) as client:
            readme = await client.read_resource("docs://readme")
            (content,) = readme.contents
            assert content.text == "# Readme\n" and content.mime_type == "text/markdown"
            if mode == "auto":
                assert readme.ttl_ms == 90_000 and readme.cache_scope == "public"

            logo = (await client.read_resource("img://logo")).contents[0]
            assert logo.mime_type == "image/png" and base64.b64decode(logo.blob) == PNG_BYTES

            inline = (await client.read_resource("note://inline")).contents[0]
            assert inline.text == "Inline content"

            data = (await client.read_resource("file://docs/data.json")).contents[0]
            assert data.mime_type == "application/json" and json.loads(data.text) == {"a": 1}
            spaced = (await client.read_resource("file://docs/notes%20with%20space.txt")).contents[0]
            assert spaced.text == "spaced"
            nested = (await client.read_resource("file://docs/guides/page03.md")).contents[0]
            assert nested.text.startswith("# Page 3")
            assert (await client.read_resource("page://page05")).contents[0].text.startswith("# Page 5")
            # A symlink that stays inside the root is served.
            assert (await client.read_resource("docs://inner-link.md")).contents[0].text == "# Readme\n"
            # Second read is served from the cache and is identical.
            again = (await client.read_resource("docs://readme")).contents[0]
            assert again.text == content.text

    anyio.run(main)


HOSTILE = [
    "file://docs/../secret.txt",
    "file://docs/guides/../../secret.txt",
    "file://docs/%2e%2e/secret.txt",
    "file://docs/%2E%2E%2Fsecret.txt",
    "file://docs/..%2fsecret.txt",
    "file://docs/..%5csecret.txt",
    "file://docs/%252e%252e/secret.txt",
    "file://docs/README.md%00.png",
    "file://docs//etc/passwd",
    "file://docs/%2Fetc%2Fpasswd",
    "file://docs/..\\secret.txt",
    "file://docs/escape.txt",
    "file://docs/oldlink/old.md",
    "file://docs/../docs_old/old.md",
    "file://docs/./README.md",
    "file://docs/guides",
    "page://..%2fsecret",
    "page://%2e%2e",
    "page://a%2fb",
    "docs://nope.md",
    "unknown://x",
]


@pytest.mark.parametrize("mode", MODES)
def test_not_found_and_hostile_paths(docs_manifest: Path, tmp_path: Path, mode: str) -> None:
    async def main() -> None:
        async with connect(docs_manifest, mode) as client:
            for uri in HOSTILE:
                with pytest.raises(MCPError) as err:
                    await client.read_resource(uri)
                error = err.value
                assert error.code == expected_not_found(mode), (uri, error.code, error.message)
                assert error.data == {"uri": uri}, uri
                assert error.message == "Resource not found"
                assert str(tmp_path) not in json.dumps(error.error.model_dump()), uri
            # The server keeps serving after hostile input.
            assert (await client.read_resource("docs://readme")).contents[0].text == "# Readme\n"

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_max_bytes_error_names_uri_not_path(docs_manifest: Path, docs_tree: Path, mode: str) -> None:
    async def main() -> None:
        async with connect(docs_manifest, mode) as client:
            with pytest.raises(MCPError) as err:
                await client.read_resource("file://docs/big.bin")
            assert err.value.code == -32603
            assert err.value.data == {"uri": "file://docs/big.bin"}
            assert "4096 bytes" in err.value.message and "2048" in err.value.message
            assert str(docs_tree) not in err.value.message

    anyio.run(main)


@pytest.mark.parametrize(("extra", "logged"), [((), False), (("--access-log",), True)])
def test_access_log_is_opt_in_over_stdio(docs_manifest: Path, tmp_path: Path, extra: tuple[str, ...],
                                         logged: bool) -> None:
    """Over stdio the access log costs a sixth of a cached read and names no caller: off unless asked for."""
    from mcp import Client, StdioServerParameters

    from tests.conftest import server_params

    log = tmp_path / "stderr.log"
    inner = server_params(docs_manifest, *extra)
    params = StdioServerParameters(command="sh", args=["-c", 'exec "$0" "$@" 2>"$LOG"', inner.command, *inner.args],
                                   env={**(inner.env or {}), "LOG": str(log)})

    async def main() -> None:
        async with Client(params, mode="legacy", cache=None) as client:  # type: ignore[arg-type]
            await client.read_resource("docs://README.md")

    anyio.run(main)
    text = log.read_text()
    assert "serving 'test-docs'" in text  # the log itself is on
    assert ("aggregator.access: stdio resources/read docs://README.md ok" in text) is logged, text


MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {}}


def _piped_lines(wire: str) -> list[str]:
    """Raw JSON-RPC lines as a script would pipe them: a non-JSON line among the requests, the read last."""
    opening, requests = _piped_messages(wire)
    return [*(json.dumps(m) for m in opening), "this is not JSON {", *(json.dumps(m) for m in requests)]


def _piped_messages(wire: str) -> tuple[list[dict], list[dict]]:
    """The opening of `wire` (a handshake, or discovery) and two requests: a listing (id 2), a read (id 3)."""
    if wire == "legacy":
        opening = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "pipe", "version": "1"}}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"}]
        meta: dict = {}
    else:
        opening = [{"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": MODERN_META}}]
        meta = {"_meta": MODERN_META}
    requests = [{"jsonrpc": "2.0", "id": 2, "method": "resources/list", "params": {**meta}},
                {"jsonrpc": "2.0", "id": 3, "method": "resources/read", "params": {"uri": "docs://README.md", **meta}}]
    return opening, requests


def test_piped_requests_all_answered_and_a_non_json_line_gets_a_parse_error(docs_manifest: Path) -> None:
    """stdin closing right after the last request must not drop its response (a race: run ten servers), and a
    line that is not JSON gets -32700 with id null while the lines after it are still served."""
    import os
    import subprocess
    import sys

    from tests.conftest import server_params

    params = server_params(docs_manifest, "--no-reload")
    env = {**os.environ, **(params.env or {})}
    runs = []
    for n in range(10):
        wire = "legacy" if n % 2 == 0 else "modern"
        process = subprocess.Popen([params.command, *params.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, env=env, text=True)
        runs.append((wire, process))
    for wire, process in runs:
        out, _ = process.communicate("\n".join(_piped_lines(wire)) + "\n", timeout=60)
        assert process.returncode == 0
        answers = [json.loads(line) for line in out.splitlines() if line.strip()]
        by_id = {a.get("id"): a for a in answers}
        assert set(by_id) == {None, 1, 2, 3}, (wire, answers)
        assert by_id[None]["error"]["code"] == -32700
        assert any(r["uri"] == "docs://README.md" for r in by_id[2]["result"]["resources"])
        assert by_id[3]["result"]["contents"][0]["text"] == "# Readme\n", (wire, by_id[3])


@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_a_read_nested_past_the_parsers_depth_is_refused_and_the_server_keeps_serving(docs_manifest: Path,
                                                                                      wire: str) -> None:
    """A `resources/read` line nested 100,000 deep (past json's recursion limit: no ValueError) is answered as a line
    that is not JSON (-32700, id null) and the reads after it are served: the fast path's parse hands it on, it
    does not end the server."""
    import os
    import subprocess

    from tests.conftest import server_params

    params = server_params(docs_manifest, "--no-reload")
    opening, requests = _piped_messages(wire)
    deep = ('{"jsonrpc":"2.0","id":9,"method":"resources/read","params":{"uri":"docs://README.md","x":'
            + "[" * 100_000 + "]" * 100_000 + "}}")
    lines = [*(json.dumps(m) for m in opening), deep, *(json.dumps(m) for m in requests)]
    process = subprocess.run([params.command, *params.args], input="\n".join(lines) + "\n", capture_output=True,
                             env={**os.environ, **(params.env or {})}, text=True, timeout=60)
    assert process.returncode == 0, process.stderr[-2000:]
    by_id = {a.get("id"): a for a in (json.loads(line) for line in process.stdout.splitlines() if line.strip())}
    assert 9 not in by_id and by_id[None]["error"]["code"] == -32700, (by_id.keys(), process.stderr[-1500:])
    assert by_id[3]["result"]["contents"][0]["text"] == "# Readme\n"


def test_an_open_listen_stream_does_not_hold_the_exit_after_stdin_closes(docs_manifest: Path) -> None:
    """A listen stream never ends by itself: end of input answers the read, then stops without waiting for it."""
    import os
    import subprocess
    import time

    from aggregator.stdio import DRAIN_TIMEOUT
    from tests.conftest import server_params

    params = server_params(docs_manifest, "--no-reload")
    lines = [{"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen",
              "params": {"notifications": {"resourcesListChanged": True}, "_meta": MODERN_META}},
             {"jsonrpc": "2.0", "id": 2, "method": "resources/read",
              "params": {"uri": "docs://README.md", "_meta": MODERN_META}}]
    process = subprocess.Popen([params.command, *params.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, env={**os.environ, **(params.env or {})}, text=True)
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("".join(json.dumps(m) + "\n" for m in lines))
    process.stdin.flush()
    answers = {}
    while 2 not in answers:  # served, the listen stream open: the time measured below is the shutdown's alone
        line = process.stdout.readline()
        assert line, "the server exited before answering the read"
        answers.update({a.get("id"): a for a in [json.loads(line)] if "id" in a})
    began = time.monotonic()
    process.communicate(timeout=60)
    took = time.monotonic() - began
    assert answers[2]["result"]["contents"][0]["text"] == "# Readme\n"
    assert process.returncode == 0 and took < DRAIN_TIMEOUT / 2, took


def test_requests_from_a_file_are_answered_into_a_file(docs_manifest: Path, tmp_path: Path) -> None:
    """stdin and stdout that are regular files (no pipe for the event loop to wait on) are served too."""
    import os
    import subprocess

    from tests.conftest import server_params

    params = server_params(docs_manifest, "--no-reload")
    for wire in ("legacy", "modern"):
        requests, answers = tmp_path / f"in-{wire}.jsonl", tmp_path / f"out-{wire}.jsonl"
        requests.write_text("\n".join(_piped_lines(wire)) + "\n", encoding="utf-8")
        with requests.open("rb") as stdin, answers.open("wb") as stdout:
            done = subprocess.run([params.command, *params.args], stdin=stdin, stdout=stdout,
                                  stderr=subprocess.DEVNULL, env={**os.environ, **(params.env or {})}, timeout=60)
        assert done.returncode == 0
        by_id = {a.get("id"): a for a in map(json.loads, answers.read_text(encoding="utf-8").splitlines())}
        assert set(by_id) == {None, 1, 2, 3}, (wire, by_id)
        assert by_id[None]["error"]["code"] == -32700
        assert by_id[3]["result"]["contents"][0]["text"] == "# Readme\n", (wire, by_id[3])


def test_responses_larger_than_the_pipe_buffer_arrive_whole_and_in_one_piece(tmp_path: Path) -> None:
    """Several reads of a 1 MiB file in flight at once over pipes: every answer is one whole JSON line (the pipe
    fills, so writes wait for the client, and concurrent responses never interleave)."""
    import os
    import subprocess

    from tests.conftest import server_params, write_manifest

    (tmp_path / "big").mkdir()
    bodies = {i: f"{i}" * (1024 * 1024) for i in range(4)}
    for i, body in bodies.items():
        (tmp_path / "big" / f"b{i}.txt").write_text(body, encoding="utf-8")
    manifest = write_manifest(tmp_path, """
        version: 1
        server: {name: big}
        defaults: {maxBytes: 8MiB}
        sources:
          big: {url: ./big}
        collections:
          - {source: big, glob: "*.txt", uri: "big://{path}", name: "{stem}"}
        """)
    params = server_params(manifest, "--no-reload")
    lines = [{"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": {"_meta": MODERN_META}}]
    lines += [{"jsonrpc": "2.0", "id": 10 + n, "method": "resources/read",
               "params": {"uri": f"big://b{n % 4}.txt", "_meta": MODERN_META}} for n in range(12)]
    process = subprocess.Popen([params.command, *params.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, env={**os.environ, **(params.env or {})})
    out, _ = process.communicate("".join(json.dumps(m) + "\n" for m in lines).encode(), timeout=60)
    assert process.returncode == 0
    answers = {a["id"]: a for a in map(json.loads, out.splitlines())}
    assert set(answers) == {0, *range(10, 22)}
    for n in range(12):
        assert answers[10 + n]["result"]["contents"][0]["text"] == bodies[n % 4], n


def test_a_client_that_stopped_reading_does_not_hold_the_exit(docs_manifest: Path) -> None:
    """Answers that cannot be written (the client closed its end of stdout) are not waited for at end of input."""
    import os
    import subprocess
    import time

    from aggregator.stdio import DRAIN_TIMEOUT
    from tests.conftest import server_params

    params = server_params(docs_manifest, "--no-reload")
    process = subprocess.Popen([params.command, *params.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env={**os.environ, **(params.env or {})}, text=True)
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    process.stdout.close()
    # Started (it logs "serving" once its catalog is listed): the time measured below is the shutdown's alone, however
    # long a loaded machine takes to start it.
    while " serving " not in (line := process.stderr.readline()):
        assert line, "the server exited before it logged that it was serving"
    began = time.monotonic()
    process.stdin.write("\n".join(_piped_lines("modern")) + "\n")
    process.stdin.close()
    process.wait(timeout=60)
    assert process.returncode == 0 and time.monotonic() - began < DRAIN_TIMEOUT / 2
