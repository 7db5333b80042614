"""docs/benchmarks.md is written by several commands: `benchmarks.run` writes the main report, and the side
benchmarks (cold_reads, stdio_floor, http_load, http_floor, tracing_cost, reliability, templates, live, scale, remote, search, upstream_hop, replicas, cluster,
console) each
own one `## ` section of it, which they replace or append and which a rewrite of the main report keeps."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "benchmarks.md"
TEMPLATES = "## Reads through URI templates"
LIVE = "## Live catalog: save to notification"
REMOTE = "## Remote sources: S3 and HTTP"
COLD_READS = "## Cold and warm reads against a floor that reads the disk"
HTTP_LOAD = "## Server capacity over HTTP (light load generator)"
HTTP_FLOOR = "## HTTP reads against the bare-ASGI floor"
STDIO_FLOOR = "## stdio reads against the stdlib floor"
TRACING = "## What tracing costs"
RELIABILITY = "## Reliability under faults"
SEARCH = "## Search: full-text index and queries"
UPSTREAM = "## MCP upstreams: reads through one hop"
REPLICAS = "## Replicas behind a balancer"
CONSOLE = "## Operator console"
CLUSTER = "## Replicas on Redis (server.cluster)"
SCALE = "## Scale: 10,000 to 1,000,000 files against a stdlib floor"
SCALE_BASELINE = "## Scale (issue 26 baseline, main before the incremental catalog)"
SIDE = (COLD_READS, STDIO_FLOOR, HTTP_LOAD, HTTP_FLOOR, TRACING, RELIABILITY, TEMPLATES, LIVE, SCALE, SCALE_BASELINE, REMOTE, SEARCH, UPSTREAM, REPLICAS,
        CLUSTER, CONSOLE)


def split(text: str) -> list[str]:
    """`text` cut before every line starting with `## ` (the first piece is whatever comes before)."""
    pieces: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("## ") and current:
            pieces.append("\n".join(current).rstrip("\n"))
            current = []
        current.append(line)
    if current:
        pieces.append("\n".join(current).rstrip("\n"))
    return pieces


def heading_of(piece: str) -> str:
    """The first line of a piece."""
    return piece.split("\n", 1)[0]


def side_sections(text: str) -> list[str]:
    """The side benchmarks' sections found in `text`, in order."""
    return [piece for piece in split(text) if heading_of(piece) in SIDE]


def ordered(pieces: list[str]) -> list[str]:
    """The main report's pieces as they are, then the side sections in the order of SIDE."""
    main = [p for p in pieces if heading_of(p) not in SIDE]
    return main + sorted((p for p in pieces if heading_of(p) in SIDE), key=lambda p: SIDE.index(heading_of(p)))


def write_main(path: Path, main: str) -> None:
    """Write the main report to `path`, keeping the side sections already there."""
    kept = side_sections(path.read_text()) if path.exists() else []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join([main.rstrip("\n"), *ordered(kept)]) + "\n")


def write_section(path: Path, section: str) -> None:
    """Replace the section of `path` with the same heading as `section` (its first line), or add it."""
    pieces = split(path.read_text()) if path.exists() else ["# Benchmarks"]
    heading = heading_of(section)
    if any(heading_of(p) == heading for p in pieces):
        pieces = [section.rstrip("\n") if heading_of(p) == heading else p for p in pieces]
    else:
        pieces.append(section.rstrip("\n"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(ordered(pieces)) + "\n")
