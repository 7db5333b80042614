"""`convert: markdown` against calling pypdfium2 directly, in one run (issue 27): pages a second and first-read
latency of a 100-page PDF through the real server (stdio, the official client, modern wire, cache off), the same
extraction in this process, a plain text read through the same server (the process hop), and the worker pool's
memory at rest.

    .venv/bin/python -m benchmarks.documents [--rounds 15] [--pages 100] [--write]

`--write` replaces the "Benchmark" section of docs/documents.md."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import psutil
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from documents_gen import pdf_pages  # noqa: E402

MANIFEST = """version: 1
server: {name: bench-documents}
sources:
  files: {url: ./files}
collections:
  - {source: files, glob: "*.pdf", uri: "doc://{path}", convert: markdown}
  - {source: files, glob: "*.txt", uri: "txt://{path}"}
"""


def direct(data: bytes) -> str:
    """pypdfium2 as its documentation shows it: each page's text range, joined."""
    import pypdfium2 as pdfium

    document = pdfium.PdfDocument(data)
    try:
        texts = []
        for page in document:
            textpage = page.get_textpage()
            texts.append(textpage.get_text_range())
            textpage.close()
            page.close()
        return "\n".join(texts)
    finally:
        document.close()


def timed(call, *args) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    call(*args)
    return time.perf_counter() - start


async def through_server(folder: Path, rounds: int) -> dict[str, float]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "aggregator", "serve",
                                                                 str(folder / "manifest.yaml")],
                                   env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")})
    figures: dict[str, float] = {}
    async with Client(params, mode="auto", cache=None) as client:  # type: ignore[arg-type]
        async def read(uri: str) -> float:
            start = time.perf_counter()
            await client.read_resource(uri)
            return time.perf_counter() - start

        figures["cold"] = await read("doc://warmup.pdf")  # the first conversion starts a worker
        hop, first = [], []
        for i in range(rounds):
            hop.append(await read(f"txt://t{i}.txt"))
            first.append(await read(f"doc://p{i}.pdf"))  # a file not read before: a conversion each
        figures["first_read"] = statistics.median(first)
        figures["hop"] = statistics.median(hop)
        figures["worker_rss"] = _worker_rss(str(folder / "manifest.yaml"))
    return figures


def _worker_rss(manifest: str) -> float:
    """MB resident in the conversion workers of the server serving `manifest`."""
    total = 0
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "aggregator.documents.worker" not in cmdline:
            continue
        try:
            parent = process.parent()
            if parent is not None and manifest in parent.cmdline():
                total += process.memory_info().rss
        except psutil.Error:
            continue
    return total / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--pages", type=int, default=100)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    pdf = pdf_pages(args.pages, words=200)
    from aggregator.documents.pdf import pdf_to_markdown
    from aggregator.manifest.model import ConvertSettings

    direct(pdf), pdf_to_markdown(pdf, ConvertSettings())  # imported and warmed
    own, ours = [], []
    for _ in range(args.rounds):  # interleaved: the machine's load falls on both alike
        own.append(timed(direct, pdf))
        ours.append(timed(pdf_to_markdown, pdf, ConvertSettings()))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "files").mkdir()
        (folder / "manifest.yaml").write_text(MANIFEST)
        for name in ["warmup"] + [f"p{i}" for i in range(args.rounds)]:
            (folder / "files" / f"{name}.pdf").write_bytes(pdf)
        for i in range(args.rounds):
            (folder / "files" / f"t{i}.txt").write_text("x" * 4096)
        served = anyio.run(through_server, folder, args.rounds)
    load = os.getloadavg()[0]
    direct_s, ours_s = statistics.median(own), statistics.median(ours)
    rows = [
        ("pypdfium2 called directly, in process", direct_s),
        ("aggregator's PDF converter, in process", ours_s),
        ("first read through the server (stdio, modern wire)", served["first_read"]),
    ]
    lines = [f"{args.pages}-page PDF ({len(pdf) // 1024} KB, 200 words a page), {args.rounds} rounds, medians; "
             f"load average {load:.1f} on {os.cpu_count()} cores while it ran (other work shared the machine: "
             "compare rows, not runs).", "",
             "| Path | Median | Pages/s |", "| --- | --- | --- |"]
    lines += [f"| {name} | {seconds * 1000:.1f} ms | {args.pages / seconds:,.0f} |" for name, seconds in rows]
    lines += ["",
              f"A 4 KB text file read through the same server (the process hop, no conversion): "
              f"{served['hop'] * 1000:.1f} ms. First read through the server / direct call: "
              f"{served['first_read'] / direct_s:.2f}x; minus the hop: "
              f"{(served['first_read'] - served['hop']) / direct_s:.2f}x (target: within 1.2x plus the hop). "
              f"The very first conversion, which starts a worker: {served['cold'] * 1000:.0f} ms. "
              f"Worker pool at rest (after the reads): {served['worker_rss']:.0f} MB resident.",
              "", "Run: `.venv/bin/python -m benchmarks.documents --write`."]
    section = "\n".join(lines)
    print(section)
    if args.write:
        doc = ROOT / "docs" / "documents.md"
        text = doc.read_text()
        text = re.sub(r"\n## Benchmark\n.*?(?=\n## |\Z)", "", text, flags=re.S).rstrip("\n")
        doc.write_text(text + "\n\n## Benchmark\n\n" + section + "\n")


if __name__ == "__main__":
    main()
