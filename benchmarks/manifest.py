"""The aggregator manifest for a generated workload: one local source and one collection over every Markdown file."""

from __future__ import annotations

from pathlib import Path


def write_manifest(root: Path, page_size: int, annotated: bool = False) -> Path:
    """Write `<root>[-annotated]-p<size>.yaml` beside the workload folder (the source URL is relative to it) and
    return its path; `annotated` lists each file's modification time (`annotations: {lastModified: file}`)."""
    path = root.parent / f"{root.name}{'-annotated' if annotated else ''}-p{page_size}.yaml"
    annotations = ", annotations: {lastModified: file}" if annotated else ""
    text = (
        "version: 1\n"
        f"server: {{name: bench, pageSize: {page_size}}}\n"
        "defaults: {ttl: 5m, maxBytes: 10MiB}\n"
        "sources:\n"
        f"  files: {{url: ./{root.name}}}\n"
        "collections:\n"
        f'  - {{source: files, glob: "**/*.md", uri: "bench://{{path}}", name: "{{path}}"{annotations}}}\n'
    )
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path
