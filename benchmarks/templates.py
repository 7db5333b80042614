"""`python -m benchmarks.templates [--templates 1000] [--repeat 2]`: reads through 1,000 URI templates.

Every template `tpl://tNNNN/{folder}/{file}` reads `{folder}/{file}.md` of a 1,000-file workload; reads pick
templates spread over all of them, so a server that tries templates one by one pays for it. Peers: aggregator
(a manifest with the templates), floor (a hand-parsed URI, preloaded strings) and the SDK's MCPServer (one
decorated template resource per template). Over stdio, both wires; writes its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import anyio

from benchmarks.figures import Figures, combine
from benchmarks.measure import measure
from benchmarks.peers import Launch
from benchmarks.report import peer_ratio_table, workload_table
from benchmarks.sections import DOCS, TEMPLATES, write_section
from benchmarks.workload import body_of, generate

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / ".data"
FILES = 1_000


def manifest(root: Path, templates: int) -> Path:
    """The aggregator manifest: one source, `templates` templates over it."""
    path = root.parent / f"{root.name}-templates-{templates}.yaml"
    lines = ["version: 1", "server: {name: bench-templates}", "defaults: {ttl: 5m}", "sources:",
             f"  files: {{url: ./{root.name}}}", "templates:"]
    lines += [f'  - {{uriTemplate: "tpl://t{i:04}/{{folder}}/{{file}}", name: t{i:04}, source: files, '
              f'path: "{{folder}}/{{file}}.md", mimeType: text/markdown}}' for i in range(templates)]
    path.write_text("\n".join(lines) + "\n")
    return path


def picks(templates: int, n: int = 20) -> tuple[list[str], str]:
    """`n` URIs spread over the templates and the files, and the text of the first."""
    uris, first = [], ""
    for k in range(n):
        t, i = (k * 7919 + 13) % templates, (k * 104729) % FILES
        uris.append(f"tpl://t{t:04}/d{i // 100:04}/f{i % 100:03}")
        first = first or body_of(i)
    return uris, first


async def run(templates: int, repeat: int, reads: int, budget_s: float) -> list[Figures]:
    root = generate(DATA, FILES, prefix="catalog")
    python = sys.executable
    peers = {
        "aggregator": Launch(python, ["-m", "aggregator", "--log-level", "WARNING", "serve",
                                      str(manifest(root, templates))]),
        "floor": Launch(python, ["-m", "benchmarks.peers.template_peers", "floor", str(root), str(templates)]),
        "sdk_mcpserver": Launch(python, ["-m", "benchmarks.peers.template_peers", "sdk_mcpserver", str(root),
                                         str(templates)]),
    }
    uris, expected = picks(templates)
    results = []
    for mode in ("legacy", "auto"):
        runs: dict[str, list[Figures]] = {name: [] for name in peers}
        for _ in range(repeat):
            for name, launch in peers.items():
                figures = await measure(name, launch, templates, mode, uris, expected, reads=reads, budget_s=budget_s)
                print(f"{name} {mode}: {figures.error or f'{figures.reads_per_s:,.0f} reads/s'}", file=sys.stderr)
                runs[name].append(figures)
        results += [combine(r) for r in runs.values()]
    return results


def section(results: list[Figures], templates: int, reads: int, command: str) -> str:
    """The report's section: what was run, and the table."""
    started = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    return "\n".join([
        TEMPLATES, "",
        f"Run {started} with `{command}`: {templates:,} templates `tpl://tNNNN/{{folder}}/{{file}}` over {FILES:,} "
        "files, reads spread over all templates (stdio; ratios in parentheses to the floor, which parses the URI by "
        "hand; nothing is listed).", "",
        *workload_table(results, templates, reads, listing=False), "",
        "aggregator against each peer (aggregator / peer):", "",
        *peer_ratio_table(results, templates, listing=False), ""])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.templates", description=__doc__)
    parser.add_argument("--templates", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--reads", type=int, default=600, help="reads per read phase")
    parser.add_argument("--budget", type=float, default=1.5, help="seconds at most per read phase")
    parser.add_argument("--output", type=Path, default=DOCS, help="the Markdown file whose section to rewrite")
    args = parser.parse_args()
    results = anyio.run(run, args.templates, args.repeat, args.reads, args.budget)
    text = section(results, args.templates, args.reads, " ".join(["python -m benchmarks.templates", *sys.argv[1:]]))
    print(text)
    write_section(args.output, text)


if __name__ == "__main__":
    main()
