"""git sources against a repository the test creates: refs, trees, hostile refs and paths."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from aggregator.service import ResourceService
from aggregator.errors import ResourceNotFound
from aggregator.manifest import ManifestError
from tests.conftest import MODES, connect, write_manifest
from tests.isolation import free_port

pygit2 = pytest.importorskip("pygit2", reason="pygit2 is not installed")


def commit(repo, files: dict[str, str], message: str, parents: list) -> object:
    index = repo.index
    for path, text in files.items():
        full = Path(repo.workdir) / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(text)
        index.add(path)
    index.write()
    tree = index.write_tree()
    sig = pygit2.Signature("Test", "test@example.com", 1_700_000_000 + len(parents), 0)
    return repo.create_commit("HEAD", sig, sig, message, tree, parents)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    r = pygit2.init_repository(str(path), initial_head="main")
    first = commit(r, {"docs/guide.md": "# Guide v1\n", "README.md": "# Repo\n", "-rf.md": "dash"}, "one", [])
    r.create_tag("v1", first, pygit2.enums.ObjectType.COMMIT, pygit2.Signature("T", "t@e.com"), "v1")
    commit(r, {"docs/guide.md": "# Guide v2\n", "docs/new.md": "# New\n"}, "two", [first])
    return path


def manifest(folder: Path, ref: str) -> Path:
    return write_manifest(folder, f"""
        version: 1
        server: {{name: git-test}}
        sources:
          repo: {{url: "git+file://./repo", ref: "{ref}"}}
        collections:
          - {{source: repo, glob: "docs/**/*.md", uri: "git://{{path}}", annotations: {{lastModified: file}}}}
        templates:
          - {{uriTemplate: "git://tree/{{+path}}", name: file, source: repo, path: "{{path}}"}}
        """, name=f"git-{ref}.yaml")


@pytest.mark.parametrize("mode", MODES)
def test_tree_at_branch_and_tag(repo: Path, mode: str) -> None:
    async def main() -> None:
        async with connect(manifest(repo.parent, "main"), mode) as client:
            uris = [r.uri for r in (await client.list_resources()).resources]
            assert uris == ["git://docs/guide.md", "git://docs/new.md"]
            assert (await client.read_resource("git://docs/guide.md")).contents[0].text == "# Guide v2\n"
            assert (await client.read_resource("git://tree/README.md")).contents[0].text == "# Repo\n"
            for uri in ["git://tree/../repo/.git/config", "git://tree/-rf.md", "git://tree/v1@docs/guide.md",
                        "git://tree/main:README.md", "git://tree/.git/HEAD"]:
                with pytest.raises(MCPError) as err:
                    await client.read_resource(uri)
                assert err.value.message == "Resource not found", uri
        async with connect(manifest(repo.parent, "v1"), mode) as client:
            uris = [r.uri for r in (await client.list_resources()).resources]
            assert uris == ["git://docs/guide.md"]
            listed = (await client.list_resources()).resources[0]
            assert listed.annotations.last_modified == "2023-11-14T22:13:20Z"  # the commit's time
            assert (await client.read_resource("git://docs/guide.md")).contents[0].text == "# Guide v1\n"

    anyio.run(main)


def test_refs_starting_with_a_dash_are_refused(repo: Path) -> None:
    with pytest.raises(ManifestError) as err:
        anyio.run(ResourceService.open, manifest(repo.parent, "--upload-pack=evil"))
    assert "sources.repo.ref" in str(err.value)


def test_unknown_ref_is_a_located_error(repo: Path) -> None:
    with pytest.raises(ManifestError) as err:
        anyio.run(ResourceService.open, manifest(repo.parent, "no-such-branch"))
    assert "sources.repo.url" in str(err.value) and "no-such-branch" in str(err.value)


def test_remote_url_is_cloned_into_the_cache(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A git:// URL served by `git daemon` on loopback is cloned (bare) into the cache folder and read at a ref."""
    import shutil
    import socket
    import subprocess
    import time

    if shutil.which("git") is None:
        pytest.skip("git is not installed: no git daemon to clone from")
    port = free_port()
    daemon = subprocess.Popen(["git", "daemon", "--reuseaddr", "--export-all", "--listen=127.0.0.1", f"--port={port}",
                               f"--base-path={repo.parent}", str(repo.parent)], stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        path = write_manifest(tmp_path, f"""
            version: 1
            server: {{name: git-remote}}
            sources:
              repo: {{url: "git+git://127.0.0.1:{port}/repo", ref: v1}}
            templates:
              - {{uriTemplate: "git://{{+path}}", name: file, source: repo, path: "{{path}}"}}
            """, name="remote.yaml")

        async def main() -> None:
            agg = await ResourceService.open(path)
            assert (await agg.read("git://docs/guide.md")).content.text == "# Guide v1\n"
            with pytest.raises(ResourceNotFound):
                await agg.read("git://docs/new.md")  # not in v1

        anyio.run(main)
        assert list((tmp_path / "cache" / "aggregator" / "git").iterdir())
    finally:
        daemon.terminate()
        daemon.wait(10)
