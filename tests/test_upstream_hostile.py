"""Upstreams that list badly, through the real gateway: the official client over stdio (both wires) against
`aggregator serve` whose `mcp` sources are real processes (tests/hostile_upstream.py in one of its modes,
tests/upstream_server.py beside it), and `aggregator validate`. An upstream's own defects (a URI listed twice,
cursors that loop, no templates, no resources capability, values no client should get) never stop the gateway nor
its other sources: what is wrong is left out and said once per source and kind of defect."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import warnings
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp_types import BlobResourceContents, ResourceTemplateReference

from tests.conftest import MODES, write_manifest
from tests.test_live import save, uris
from tests.test_upstream import ENV, HERE
from tests.command import aggregator

UPSTREAM = [sys.executable, str(HERE / "upstream_server.py"), "stdio"]
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

LONE = "half \ud800 of a pair: \u00e9"
"""What the `values` upstream reads at h://t/lone (tests/hostile_upstream.py's `LONE`; that module serves on import)."""


def hostile(mode: str) -> str:
    """The `command:` of a hostile upstream in `mode`, as YAML."""
    return repr([sys.executable, str(HERE / "hostile_upstream.py"), mode])


def logged(manifest: Path, log: Path) -> StdioServerParameters:
    """`aggregator serve` over stdio with its stderr in `log`."""
    return StdioServerParameters(command="sh", args=["-c", 'exec "$0" "$@" 2>"$LOG"', sys.executable, "-m",
                                                     "aggregator", "serve", str(manifest)],
                                 env={**ENV, "LOG": str(log)})


def validate(manifest: Path) -> subprocess.CompletedProcess[str]:
    """`aggregator validate` in this process (tests/command.py); the upstreams it opens are processes."""
    return aggregator("validate", str(manifest), env=ENV)


def docs_folder(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")


def gateway(tmp_path: Path, sources: str, extra: str = "") -> Path:
    """A manifest serving a folder and a healthy upstream (namespace up) beside the `sources` given."""
    docs_folder(tmp_path)
    return write_manifest(tmp_path, f"""
        version: 1
        server: {{name: gateway}}
        defaults: {{ttl: 0s}}
        sources:
          docs: {{url: ./docs}}
          up: {{url: "mcp+stdio:", namespace: up, command: {UPSTREAM!r}, env: {ENV!r}}}
{sources}
        collections:
          - {{source: docs, glob: "*.md", uri: "docs://{{path}}"}}
{extra}
        """)


HEALTHY = {"docs://a.md"} | {f"up+test://{name}" for name in ("static-text", "static-binary", "big", "hang", "boom",
                                                              "tag/one")}


@pytest.mark.parametrize("mode", MODES)
def test_a_uri_listed_twice_or_cursors_that_loop(mode: str, tmp_path: Path) -> None:
    """One upstream lists h://x twice (namespace and a collection over it), another pages forever with the same
    cursor: both serve what they list once, and the folder and the healthy upstream beside them are served too;
    `validate` says so with a warning naming each source, once, and exits 0."""
    manifest = gateway(tmp_path, f"""
          hs: {{url: "mcp+stdio:", namespace: hs, prefix: "h://", command: {hostile("dupes")}}}
          lp: {{url: "mcp+stdio:", prefix: "h://", command: {hostile("loop")}}}""", """
          - {source: hs, glob: "*", uri: "dup://{path}"}
          - {source: lp, glob: "*", uri: "loop://{path}"}""")

    async def main() -> None:
        async with Client(logged(manifest, tmp_path / "serve.log"), mode=mode, cache=None) as client:
            listed = await uris(client)
            assert sorted(listed) == sorted(HEALTHY | {"hs+h://x", "hs+h://y", "dup://x", "dup://y", "loop://x",
                                                       "loop://y"})
            assert (await client.read_resource("hs+h://x")).contents[0].text == "text of h://x"
            assert (await client.read_resource("dup://x")).contents[0].text == "text of h://x"
            assert (await client.read_resource("loop://y")).contents[0].text == "text of h://y"
            assert (await client.read_resource("docs://a.md")).contents[0].text == "# A\n"

    anyio.run(main)
    checked = validate(manifest)
    assert checked.returncode == 0, checked.stderr
    assert "also produced by" not in checked.stderr
    for source in ("hs", "lp"):
        said = [line for line in checked.stderr.splitlines() if f"({source})" in line and "h://x" in line
                and "twice" in line]
        assert len(said) == 1, checked.stderr


@pytest.mark.parametrize("mode", MODES)
def test_a_uri_listed_twice_while_serving(mode: str, tmp_path: Path) -> None:
    """The upstream starts listing h://x twice (and a new h://z) while the gateway serves: the relisting keeps the
    first h://x and adds h://z, saves of the manifest still apply, and the defect is said once, without a
    traceback."""
    sources = f"""
          fl: {{url: "mcp+stdio:", namespace: fl, prefix: "h://", command: {hostile("flip")}}}"""
    extra = """
          - {source: fl, glob: "*", uri: "flip://{path}"}
        resources:
          - {uri: "flip://now", name: now, source: fl, path: flip}"""
    manifest = gateway(tmp_path, sources, extra)
    log = tmp_path / "serve.log"

    async def main() -> None:
        async with Client(logged(manifest, log), mode=mode, cache=None) as client:
            before = set(await uris(client))
            # Building the catalog read h://flip (flip://now is not listed upstream: it exists if it reads), so the
            # upstream may have flipped already: its list_changed came before the gateway listened, and is told then.
            assert {"fl+h://x", "fl+h://y", "flip://x", "flip://y"} <= before
            assert (await client.read_resource("flip://now")).contents[0].text == "text of h://flip"
            with anyio.fail_after(15):
                while not {"fl+h://z", "flip://z"} <= set(listed := await uris(client)):
                    await anyio.sleep(0.1)
            assert sorted(listed) == sorted(before | {"fl+h://z", "flip://z"})
            text = manifest.read_text()
            save(manifest, text.replace("resources:\n", "resources:\n  - {uri: 'note://n', name: n, text: n}\n"))
            with anyio.fail_after(15):
                while "note://n" not in await uris(client):
                    await anyio.sleep(0.1)
            assert (await client.read_resource("fl+h://x")).contents[0].text == "text of h://x"

    anyio.run(main)
    text = log.read_text()
    assert "Traceback" not in text and "also produced by" not in text and "reload failed" not in text, text
    assert len([line for line in text.splitlines() if "(fl)" in line and "twice" in line]) == 1, text


@pytest.mark.parametrize("mode", MODES)
def test_an_upstream_without_templates_or_resources(mode: str, tmp_path: Path) -> None:
    """`plain` answers templates/list with -32601 (no templates) and advertises no subscribe: its resources are
    listed, read and subscribed to; `nocaps` offers no resources at all: it lists nothing, and nothing else stops."""
    manifest = gateway(tmp_path, f"""
          pl: {{url: "mcp+stdio:", namespace: pl, command: {hostile("plain")}}}
          nc: {{url: "mcp+stdio:", namespace: nc, command: {hostile("nocaps")}}}""")

    async def main() -> None:
        async with Client(logged(manifest, tmp_path / "serve.log"), mode=mode, cache=None) as client:
            assert sorted(await uris(client)) == sorted(HEALTHY | {"pl+h://x", "pl+h://y"})
            templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
            assert templates == {"up+test://template/{id}/data", "up+test://header/{name}"}
            assert (await client.read_resource("pl+h://x")).contents[0].text == "text of h://x"
            if mode == "legacy":
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    await client.subscribe_resource("pl+h://x")
            else:
                async with client.listen(resource_subscriptions=["pl+h://x"]):
                    pass
            assert (await client.read_resource("pl+h://y")).contents[0].text == "text of h://y"

    anyio.run(main)
    checked = validate(manifest)
    assert checked.returncode == 0, checked.stderr
    assert "cannot be listed" not in checked.stderr and "Method not found" not in checked.stderr
    assert "(nc)" in checked.stderr and "offers no resources" in checked.stderr


@pytest.mark.parametrize("mode", MODES)
def test_values_no_client_should_get(mode: str, tmp_path: Path) -> None:
    """URIs with NUL, ESC or CR/LF and a 100 KB URI are left out; names, titles and descriptions lose their control
    characters (a description keeps its line breaks) and are cut to a bound; a mimeType that is no media type is
    dropped, listed or read; each kind of defect is said once for the source."""
    manifest = gateway(tmp_path, f"""
          va: {{url: "mcp+stdio:", namespace: va, command: {hostile("values")}}}""")
    log = tmp_path / "serve.log"

    async def main() -> None:
        async with Client(logged(manifest, log), mode=mode, cache=None) as client:
            listed = {r.uri: r for r in (await client.list_resources()).resources}
            ours = {uri for uri in listed if uri.startswith("va+")}
            assert ours == {"va+h://ok", "va+h://bad-mime", "va+h://bad-text", "va+h://long-text"}
            for resource in listed.values():
                for value in (resource.uri, resource.name, resource.title, resource.mime_type):
                    assert value is None or not CONTROL.search(value), resource
                assert not CONTROL.search((resource.description or "").replace("\n", "")), resource
            assert listed["va+h://bad-mime"].mime_type in (None, "application/octet-stream")
            bad = listed["va+h://bad-text"]
            assert (bad.name, bad.title) == ("bad\ufffd[2Jname", "title\ufffd\ufffdX-Injected: 1")
            assert bad.description == "line one\nline two\ufffd\ufffd[31m red"
            long = listed["va+h://long-text"]
            assert len(long.name) <= 1024 and len(long.description or "") <= 16384
            templates = {t.uri_template: t for t in (await client.list_resource_templates()).resource_templates}
            assert {uri for uri in templates if uri.startswith("va+")} == {"va+h://t/{a}", "va+h://m/{a}"}
            assert templates["va+h://m/{a}"].mime_type is None
            done = await client.complete(ResourceTemplateReference(type="ref/resource", uri="va+h://t/{a}"),
                                         {"name": "a", "value": ""})
            assert done.completion.values == ["fine"]
            for uri in ("va+h://bad-mime", "va+h://m/1"):
                content = (await client.read_resource(uri)).contents[0]
                assert content.mime_type is None or not CONTROL.search(content.mime_type), content
            # Text no UTF-8 can encode (a lone surrogate) is served as the bytes it stands for, not as text.
            lone = (await client.read_resource("va+h://t/lone")).contents[0]
            assert isinstance(lone, BlobResourceContents) and lone.mime_type == "application/octet-stream"
            assert base64.b64decode(lone.blob) == LONE.encode("utf-8", "surrogatepass")

    anyio.run(main)
    text = log.read_text()
    assert "Traceback" not in text, text
    said = [line for line in text.splitlines() if "(va)" in line]
    for defect in ("control characters in URIs", "longer than", "not a media type", "completion value(s) left out"):
        assert len([line for line in said if defect in line]) == 1, (defect, text)
    assert "\x00" not in text and "\x1b" not in text and "X-Injected: 1\n" not in text


def test_a_collision_the_manifest_declares_stays_a_located_error_while_serving(tmp_path: Path) -> None:
    """The upstream starts listing h://z, which the manifest's collection serves as flip://z, a URI the manifest
    also declares: that is the author's doing, so the relisting is refused with the located error (once, no
    traceback) and the gateway keeps serving what it served."""
    sources = f"""
          fl: {{url: "mcp+stdio:", prefix: "h://", command: {hostile("flip")}}}"""
    extra = """
          - {source: fl, glob: "*", uri: "flip://{path}"}
        resources:
          - {uri: "flip://now", name: now, source: fl, path: flip}
          - {uri: "flip://z", name: z, text: "declared"}"""
    manifest = gateway(tmp_path, sources, extra)
    log = tmp_path / "serve.log"

    async def main() -> None:
        async with Client(logged(manifest, log), mode="legacy", cache=None) as client:
            before = await uris(client)
            assert {"flip://x", "flip://y", "flip://z"} <= set(before)
            await client.read_resource("flip://now")
            with anyio.fail_after(15):
                while "is also produced by" not in log.read_text():
                    await anyio.sleep(0.1)
            assert await uris(client) == before
            assert (await client.read_resource("flip://z")).contents[0].text == "declared"
            assert (await client.read_resource("up+test://static-text")).contents[0].text == "Hello from one"

    anyio.run(main)
    text = log.read_text()
    assert "Traceback" not in text, text
    [said] = [line for line in text.splitlines() if "is also produced by" in line]
    assert "collections[1] (file 'z')" in said and f"{manifest.name}:" in text
