"""Generated workloads: N small Markdown files spread over subfolders, and the URIs every peer serves them at.

Layout: `<base>/<prefix>-<N>/dNNNN/fNNN.md`, 100 files per folder; file i is served at `uri_of(i)` by every peer.
"""

from __future__ import annotations

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


def generate(base: Path, count: int, prefix: str = "files", body: Callable[[int], str] = body_of) -> Path:
    """Create `count` files (`body(i)` each) under `base/<prefix>-<count>` once (a `.complete` marker records it);
    return that folder.

    `benchmarks.run` uses its own prefix so that other benchmarks editing their files (live.py) cannot disturb it.
    """
    root = base / f"{prefix}-{count}"
    marker = root / ".complete"
    if marker.exists():
        return root
    for i in range(count):
        path = root / relative_path(i)
        if i % FILES_PER_FOLDER == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body(i))
    marker.write_text("")
    return root


def sample_indices(count: int, n: int = 20) -> list[int]:
    """`n` distinct file indices spread over a catalog of `count` files (the small warm set the read figures use)."""
    step = 7919  # a prime: the picks scatter over folders and, for these sizes, never repeat
    return [i * step % count for i in range(min(n, count))]
