"""Generated workloads: N small Markdown files spread over folders, and the manifest that serves them."""

from __future__ import annotations

from pathlib import Path

FILES_PER_FOLDER = 100


def generate(base: Path, count: int) -> Path:
    """Create (once) `count` files under base/files-<count>; return that folder."""
    root = base / f"files-{count}"
    marker = root / ".complete"
    if marker.exists():
        return root
    for i in range(count):
        folder = root / f"d{i // FILES_PER_FOLDER:04}"
        if i % FILES_PER_FOLDER == 0:
            folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i % FILES_PER_FOLDER:03}.md").write_text(f"# Document {i}\n\nBody of document {i}.\n")
    marker.write_text("")
    return root


def uri_of(i: int) -> str:
    return f"bench://d{i // FILES_PER_FOLDER:04}/f{i % FILES_PER_FOLDER:03}.md"


def manifest_for(root: Path) -> Path:
    """A manifest with one collection over `root`, using aggregator's default page size."""
    path = root.parent / f"{root.name}.yaml"
    path.write_text(
        "version: 1\n"
        "server: {name: bench}\n"
        f"sources:\n  files: {{url: {root}}}\n"
        "collections:\n"
        '  - {source: files, glob: "**/*.md", uri: "bench://{path}", name: "{path}"}\n'
    )
    return path
