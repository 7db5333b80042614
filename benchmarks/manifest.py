"""The aggregator manifest for a generated workload: one local source and one collection over every Markdown file."""

from __future__ import annotations

from pathlib import Path


def write_manifest(root: Path, page_size: int) -> Path:
    """Write `<root>.yaml` beside the workload folder (the source URL is relative to it) and return its path."""
    path = root.parent / f"{root.name}-p{page_size}.yaml"
    text = (
        "version: 1\n"
        f"server: {{name: bench, pageSize: {page_size}}}\n"
        "defaults: {ttl: 5m, maxBytes: 10MiB}\n"
        "sources:\n"
        f"  files: {{url: ./{root.name}}}\n"
        "collections:\n"
        '  - {source: files, glob: "**/*.md", uri: "bench://{path}", name: "{path}"}\n'
    )
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path
