"""The source contract for git repositories: a repository the test creates, read at its branch.

A git source is pinned to the commit its ref named when it opened, so its files never change under it (not
`mutable`): the extra test here checks exactly that.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from aggregator.sources import Source, SourceNotFound
from tests.isolation import free_port
from tests.source_contract import OUTSIDE, Opener, SourceContract, open_kind

pygit2 = pytest.importorskip("pygit2", reason="pygit2 is not installed")


def commit_files(repo: object, files: dict[str, bytes], message: str) -> None:
    """Write `files` into `repo`'s work tree and commit them on its branch."""
    index = repo.index  # type: ignore[attr-defined]
    for path, data in files.items():
        full = Path(repo.workdir, *path.split("/"))  # type: ignore[attr-defined]
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_bytes(data)
        index.add(path)
    index.write()
    sig = pygit2.Signature("Test", "test@example.com", 1_700_000_000, 0)
    parents = [] if repo.head_is_unborn else [repo.head.target]  # type: ignore[attr-defined]
    repo.create_commit("HEAD", sig, sig, message, index.write_tree(), parents)  # type: ignore[attr-defined]


def git_source(folder: Path, files: dict[str, bytes], **settings: object) -> Source:
    """`files` committed on `main` of a repository at folder/repo, `OUTSIDE` beside it; the source reads `main`."""
    repo = pygit2.init_repository(str(folder / "repo"), initial_head="main")
    commit_files(repo, files, "contract files")
    (folder / "outside.txt").write_bytes(OUTSIDE)
    return open_kind(f"git+file://{folder / 'repo'}", ref="main", **settings)


@contextmanager
def git_daemon(folder: Path) -> Iterator[int]:
    """`git daemon` serving the repositories in `folder` on a loopback port, for the duration of the block."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: no git daemon to clone from")
    port = free_port()
    daemon = subprocess.Popen(["git", "daemon", "--reuseaddr", "--export-all", "--listen=127.0.0.1", f"--port={port}",
                               f"--base-path={folder}", str(folder)], stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield port
    finally:
        daemon.terminate()
        daemon.wait(10)


TOKEN = "tok-git-5c4b3a"


class TestGitContract(SourceContract):
    mutable = False
    credentials = True

    @pytest.fixture
    def make_source(self, tmp_path: Path) -> Opener:
        return lambda files, **settings: git_source(tmp_path, files, **settings)

    @pytest.fixture
    def with_credentials(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Source, list[str]]]:
        """A remote repository whose URL carries a user and token, cloned into the cache."""
        repo = pygit2.init_repository(str(tmp_path / "served" / "repo"), initial_head="main")
        commit_files(repo, {"a.md": b"# A\n"}, "one")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        with git_daemon(tmp_path / "served") as port:
            yield open_kind(f"git+git://reader:{TOKEN}@127.0.0.1:{port}/repo", ref="main"), [TOKEN]

    def test_the_tree_stays_the_one_the_ref_named_at_open(self, make_source: Opener, tmp_path: Path) -> None:
        async def body(source: Source) -> None:
            version = await source.version("a.md")
            commit_files(pygit2.Repository(str(tmp_path / "repo")), {"a.md": b"# A, changed\n"}, "change")
            assert (await source.read("a.md", 1 << 20)).data == self.files["a.md"]
            assert await source.version("a.md") == version
            for path in (".git/HEAD", ".git/config", "main:a.md", "HEAD@a.md", "main@a.md", "-a.md", "docs/-x"):
                with pytest.raises(SourceNotFound):
                    await source.read(path, 1 << 20)

        self.run(make_source, body)
