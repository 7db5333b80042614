"""The event loop `serve` runs on (`aggregator/event_loop.py`): uvloop when installed (the test extra brings it),
asyncio's own when asked; a server on either serves the same reads, relayed ones included, over stdio to the
official client on both wires; a loop that is not one, or uvloop asked for where it is missing, is refused with
its name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from aggregator.event_loop import ENV, backend_options, chosen
from tests.conftest import write_manifest
from tests.test_upstream import ENV as UPSTREAM_ENV
from tests.test_upstream import HERE

REPO = Path(__file__).resolve().parents[1]
MODES = ["legacy", "auto"]


def test_auto_takes_uvloop_when_installed_and_asyncio_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvloop  # noqa: F401 - the test extra installs it: `auto` must find it

    monkeypatch.delenv(ENV, raising=False)
    assert chosen() == chosen("auto") == chosen("uvloop") == "uvloop"
    assert chosen("asyncio") == "asyncio"
    monkeypatch.setenv(ENV, "asyncio")
    assert chosen() == "asyncio" and chosen("uvloop") == "uvloop"  # the flag wins over the environment
    assert backend_options("uvloop") == {"use_uvloop": True} and backend_options("asyncio") == {}


@pytest.mark.parametrize("asked", ["trio", "", "UVLOOP"])
def test_a_loop_that_is_not_one_is_refused_by_name(asked: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, asked)
    if not asked:
        assert chosen() == "uvloop"  # empty: not set
        return
    with pytest.raises(ValueError, match=f"unknown event loop '{asked}' \\(one of auto, asyncio, uvloop\\)"):
        chosen()


def test_uvloop_asked_where_it_is_missing_says_what_to_install(tmp_path: Path) -> None:
    """A Python that cannot import uvloop (a finder first on the meta path refuses it): `auto` falls back to
    asyncio, `uvloop` is refused naming the extra."""
    probe = ("import importlib.machinery, sys\n"
             "class Hide:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name == 'uvloop':\n"
             "            raise ModuleNotFoundError(name)\n"
             "sys.meta_path.insert(0, Hide())\n"
             "from aggregator.event_loop import chosen\n"
             "print(chosen('auto'))\n"
             "try:\n    chosen('uvloop')\nexcept ValueError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, check=True).stdout.splitlines()
    assert out[0] == "asyncio", out
    assert out[1] == "uvloop is not installed (pip install 'mcp-aggregator[fast]')", out


def test_serve_refuses_an_unknown_loop_before_it_starts(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, "version: 1\nserver: {name: x}\n")
    done = subprocess.run([sys.executable, "-m", "aggregator", "serve", str(manifest)], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": str(REPO), ENV: "tokio"})
    assert done.returncode == 2
    assert "aggregator: --loop: unknown event loop 'tokio' (one of auto, asyncio, uvloop)" in done.stderr
    bad_flag = subprocess.run([sys.executable, "-m", "aggregator", "serve", str(manifest), "--loop", "tokio"],
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    assert bad_flag.returncode == 2 and "invalid choice: 'tokio'" in bad_flag.stderr


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_either_loop_serves_files_and_relayed_reads(tmp_path: Path, loop: str, mode: str) -> None:
    """`serve --loop L`: the log names the loop that runs; a listing, a file read and an uncached read relayed from
    an `mcp+stdio:` upstream (the lane and the relay in callbacks) answer alike on both."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    upstream = [sys.executable, str(HERE / "upstream_server.py"), "stdio"]
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: loops}}
        sources:
          docs: {{url: {str(tmp_path / "docs")!r}}}
          up: {{url: "mcp+stdio:", prefix: "test://", command: {upstream!r}, env: {UPSTREAM_ENV!r}, ttl: 0s}}
        collections:
          - {{source: docs, glob: "*.md", uri: "docs://{{path}}"}}
          - {{source: up, glob: "static-*", uri: "wiki://{{path}}"}}
        """)
    errors = tmp_path / "stderr.txt"

    async def main() -> list[str]:
        params = StdioServerParameters(command=sys.executable, args=[
            "-m", "aggregator", "--log-level", "DEBUG", "serve", str(manifest), "--loop", loop],
            env={"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "")})
        with errors.open("w") as err:
            async with Client(stdio_client(params, errlog=err), mode=mode, cache=None) as client:
                uris = {str(r.uri) for r in (await client.list_resources()).resources}
                texts = [(await client.read_resource(uri)).contents[0].text  # type: ignore[union-attr]
                         for uri in ("docs://a.md", "wiki://static-text", "wiki://static-text")]
        return [*sorted(uris & {"docs://a.md", "wiki://static-text"}), *texts]

    got = anyio.run(main)
    assert got == ["docs://a.md", "wiki://static-text", "# A\n", "Hello from one", "Hello from one"]
    assert f"event loop: {loop}" in errors.read_text()
