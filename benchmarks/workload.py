"""Generated workloads: N small Markdown files spread over subfolders, and the URIs every peer serves them at.

Layout: `<base>/<prefix>-<N>/dNNNN/fNNN.md`, 100 files per folder; file i is served at `uri_of(i)` by every peer.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path

FILES_PER_FOLDER = 100
URI_SCHEME = "bench://"


def relative_path(i: int) -> str:
    """The path of file i relative to the workload's root, with `/` separators."""
    return f"d{i // FILES_PER_FOLDER:04}/f{i % FILES_PER_FOLDER:03}.md"


def uri_of(i: int) -> str:
    """The URI every peer serves file i at."""
    return URI_SCHEME + relative_path(i)


def body_of(i: int) -> str:
    """The Markdown text of file i (about 40 bytes: a heading and a line; kept stable so generated data is reused)."""
    return f"# Document {i}\n\nBody of document {i}.\n"


def generate(base: Path, count: int, prefix: str = "files", body: Callable[[int], str] = body_of,
             processes: int = 1) -> Path:
    """Create `count` files (`body(i)` each) under `base/<prefix>-<count>` once (a `.complete` marker records it);
    return that folder. `processes` > 1 splits the folders among that many processes (1,000,000 files in about a
    minute on 2 cores instead of several).

    `benchmarks.run` uses its own prefix so that other benchmarks editing their files (live.py) cannot disturb it.
    """
    root = base / f"{prefix}-{count}"
    marker = root / ".complete"
    if marker.exists():
        return root
    folders = -(-count // FILES_PER_FOLDER)
    chunks = [(root, count, body, range(folders)[p::processes]) for p in range(processes)]
    if processes > 1:
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            pool.starmap(_write_folders, chunks)
    else:
        _write_folders(*chunks[0])
    marker.write_text("")
    return root


def _write_folders(root: Path, count: int, body: Callable[[int], str], folders: range) -> None:
    """Write the files of `folders` (each FILES_PER_FOLDER files, the last one cut at `count`) with plain os calls."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for folder in folders:
        first = folder * FILES_PER_FOLDER
        os.makedirs(root / relative_path(first).rsplit("/", 1)[0], exist_ok=True)
        for i in range(first, min(first + FILES_PER_FOLDER, count)):
            fd = os.open(root / relative_path(i), flags, 0o644)
            try:
                os.write(fd, body(i).encode())
            finally:
                os.close(fd)


def sample_indices(count: int, n: int = 20) -> list[int]:
    """`n` distinct file indices spread over a catalog of `count` files (the small warm set the read figures use)."""
    step = 7919  # a prime: the picks scatter over folders and, for these sizes, never repeat
    return [i * step % count for i in range(min(n, count))]
