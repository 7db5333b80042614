"""The scale benchmark's files: N Markdown files of about 2 KB (`workload`'s layout, 100 a folder), made once per
size in a few processes and kept outside the repository, and the journal that puts back what a run changed.

Where: `$AGGREGATOR_BENCH_CACHE/scale-<N>/`, by default `~/.cache/aggregator-bench/`, so every worktree and run
reuses them. Disk: one 4 KiB block per file on ext4, about 41 MB at 10,000 files, 410 MB at 100,000, 4.1 GB at
1,000,000 (and as many inodes). The live phases add, edit and delete files; every path is written to the
journal (`scale-<N>.journal` beside the folder) before it is touched, and `repair` restores the folder from it,
so an interrupted run leaves nothing behind that the next one does not undo.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from collections.abc import Iterable
from typing import IO

from benchmarks.workload import FILES_PER_FOLDER, URI_SCHEME, generate, relative_path

CACHE = Path(os.environ.get("AGGREGATOR_BENCH_CACHE") or Path.home() / ".cache" / "aggregator-bench")
PREFIX = "scale"
_WORDS = ("catalog resource listing manifest folder source change notify client server read page cursor entry "
          "settle watch relist memory latency floor").split()
FILLER = "\n\n".join(" ".join(_WORDS[(p + w) % len(_WORDS)] for w in range(40)) + "." for p in range(7))
_CORPUS_PATH = re.compile(r"d(\d{4,})/f(\d{3})\.md")


def body(i: int) -> str:
    """File i's Markdown, about 2 KB (a heading and seven paragraphs; stable, so generated files are reused)."""
    return f"# Document {i}\n\n{FILLER}\n"


def corpus(count: int, base: Path = CACHE) -> Path:
    """The folder of `count` files, made now if missing (in one process per core), repaired if a run left changes."""
    root = generate(base, count, prefix=PREFIX, body=body, processes=max(2, os.cpu_count() or 2))
    Journal(root).repair()
    return root


PAGE_CACHE_STATES = ("held", "dropped")


def set_page_cache(root: Path, indices: Iterable[int], state: str) -> None:
    """Put the files of `indices` in the OS page cache ("held": each read once here) or out of it ("dropped":
    posix_fadvise DONTNEED, so that the next read goes to the disk; the corpus's files are clean, written once).
    Done before each server's cold reads, for every peer and size alike: otherwise the first peer of a round pays
    the disk for both, and a catalog that outgrows the page cache is read from the disk where a small one is not."""
    if state not in PAGE_CACHE_STATES:
        raise ValueError(f"page cache state {state!r}: one of {', '.join(PAGE_CACHE_STATES)}")
    for i in indices:
        fd = os.open(root / relative_path(i), os.O_RDONLY)
        try:
            if state == "held":
                while os.read(fd, 1 << 16):
                    pass
            else:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def uri_of_path(relative: str) -> str:
    """The URI every peer serves the file at `relative` (a `/`-separated path under the root) at."""
    return URI_SCHEME + relative


def walk_uris(root: Path) -> set[str]:
    """The URIs a fresh walk of `root` finds: every non-hidden `*.md` file, as `**/*.md` matches them."""
    found: set[str] = set()
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        prefix = os.path.relpath(folder, root).replace(os.sep, "/")
        prefix = "" if prefix == "." else prefix + "/"
        found.update(uri_of_path(prefix + name) for name in files if name.endswith(".md") and not name[0] == ".")
    return found


class Journal:
    """Paths of a corpus folder that a run is about to change, appended before each change."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.count = int(root.name.rsplit("-", 1)[1])
        self.path = root.parent / f"{root.name}.journal"
        self._handle: IO[str] | None = None

    def touch(self, relative: str) -> Path:
        """Record `relative` (flushed before returning) and return its full path."""
        if self._handle is None:
            self._handle = open(self.path, "a")  # noqa: SIM115 - kept open for the run, closed by repair
        handle = self._handle
        handle.write(relative + "\n")
        handle.flush()
        return self.root / relative

    def repair(self) -> int:
        """Put every journaled path back as generated: a corpus file rewritten, any other file removed. Returns how
        many paths were journaled; the journal is gone afterwards."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if not self.path.exists():
            return 0
        touched = set(self.path.read_text().split())
        for relative in touched:
            index = self.index_of(relative)
            path = self.root / relative
            if index is None:
                path.unlink(missing_ok=True)
            else:
                path.write_text(body(index))
        self.path.unlink()
        return len(touched)

    def index_of(self, relative: str) -> int | None:
        """The index of a generated file from its path, None for a path the corpus does not have."""
        match = _CORPUS_PATH.fullmatch(relative)
        if not match:
            return None
        index = int(match[1]) * FILES_PER_FOLDER + int(match[2])
        return index if index < self.count and relative_path(index) == relative else None
