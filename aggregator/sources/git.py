"""A git repository's tree at a ref (branch, tag or commit), through fsspec's git filesystem (pygit2).

Local repositories are read in place; remote URLs are cloned (bare) into the user's cache folder and fetched
when the source opens. Refs and path segments starting with '-' are refused: they read as options to git.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from aggregator.manifest.source_urls import is_remote_git
from aggregator.sources.base import FileInfo, SourceError, SourceNotFound
from aggregator.sources.filesystem import FsspecSource, cache_dir

__all__ = ["GitSource", "open_git"]


class GitSource(FsspecSource):
    """The tree of one ref; every file's modification time is the ref's commit time."""

    def __init__(self, id: str, fs: Any, *, label: str, commit_time: float, **limits: Any) -> None:
        super().__init__(id, fs, "", label=label, **limits)
        self._commit_time = commit_time

    def full_path(self, path: str) -> str:
        # fsspec's git filesystem reads "repo:ref@path" out of paths: ':' and '@' would pick another tree.
        if ":" in path or "@" in path or any(seg.startswith("-") for seg in path.split("/")):
            raise SourceNotFound("refused path for a git source")
        return super().full_path(path)

    def _info(self, full: str) -> dict[str, Any]:
        info = super()._info(full)
        # fsspec's git filesystem stops walking at the first file, so `a.md/x` would read `a.md`: a path's
        # folder must be a folder.
        folder = full.rpartition("/")[0]
        if folder and super()._info(folder).get("type") != "directory":
            raise SourceNotFound("no such file")
        return info

    async def stat(self, path: str) -> FileInfo:
        info = await super().stat(path)
        return FileInfo(info.path, info.size, self._commit_time, info.version)

    async def list(self, pattern: str, exclude: Sequence[str] = (), hidden: bool = False) -> list[FileInfo]:
        files = await super().list(pattern, exclude, hidden)
        return [FileInfo(f.path, f.size, self._commit_time, f.version) for f in files]


def open_git(id: str, url: str, ref: str | None, **limits: Any) -> GitSource:
    """Open the repository at `url` (a local path or a remote URL) at `ref` (default: HEAD)."""
    try:
        import pygit2
        from fsspec.implementations.git import GitFileSystem
    except ImportError:
        raise SourceError("git sources need pygit2: pip install 'mcp-aggregator[git]' "
                          "(in a checkout: pip install -e '.[git]')") from None
    if ref is not None and (ref.startswith("-") or not ref.strip()):
        raise SourceError("a git ref may not start with '-'")
    remote = is_remote_git(url)
    label = _redact(url) if remote else url
    try:
        location = _clone_or_fetch(pygit2, url) if remote else url
        repo = pygit2.Repository(location)
        chosen = ref or repo.head.shorthand
        commit, _ = repo.resolve_refish(chosen)
    except (pygit2.GitError, KeyError, ValueError) as exc:
        raise SourceError(f"git repository {label} at ref {ref or 'HEAD'!r} cannot be read: {exc}") from None
    fs = GitFileSystem(path=location, ref=str(commit.id))
    return GitSource(id, fs, label=f"git {label}@{chosen}", commit_time=float(commit.commit_time), **limits)


def _clone_or_fetch(pygit2: Any, url: str) -> str:
    folder = cache_dir("git", url)
    try:
        repo = pygit2.Repository(folder)
    except pygit2.GitError:
        pygit2.clone_repository(url, folder, bare=True)
        return folder
    for remote in repo.remotes:
        remote.fetch()
    return folder


def _redact(url: str) -> str:
    # https://user:token@host/repo -> https://host/repo: credentials never reach a log.
    return re.sub(r"//[^/@]*@", "//", url)
