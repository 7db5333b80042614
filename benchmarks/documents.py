"""`convert: markdown` against calling pypdfium2 directly, in one run (issue 27): pages a second and first-read
latency of a 100-page PDF through the real server (stdio, the official client, modern wire, cache off), the same
extraction in this process, a text file of the Markdown's size read through the same server (the process hop:
what serving that much text costs without converting it), and the worker pool's memory at rest.

Every round runs each path once, back to back (direct call, our converter, first read of a new PDF, read of the
text file), so the load of a shared machine falls on all of them alike; figures are medians over the rounds, and
each ratio is the median of the rounds' own ratios. CPU time (Linux schedstat, nanoseconds) is summed over every
process a path runs in (this client, the server, its workers): unlike wall time it hardly moves with the load.

    .venv/bin/python -m benchmarks.documents [--rounds 41] [--pages 100] [--write]

`--write` replaces the "Benchmark" section of docs/documents.md."""

from __future__ import annotations

import argparse
import glob
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
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


def cpu_ns(pids: list[int]) -> int:
    """CPU time so far of every thread of these processes, in nanoseconds (0 where /proc does not say)."""
    total = 0
    for pid in pids:
        for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
            try:
                with open(path) as stat:
                    total += int(stat.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended meanwhile
    return total


class Rounds:
    """Wall and CPU time of each path, one sample a round."""

    def __init__(self) -> None:
        self.wall: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    async def time(self, path: str, pids: list[int], call: Callable[[], Awaitable[object]]) -> None:
        cpu, start = cpu_ns(pids), time.perf_counter()
        await call()
        self.wall.setdefault(path, []).append(time.perf_counter() - start)
        self.cpu.setdefault(path, []).append((cpu_ns(pids) - cpu) / 1e9)

    def median(self, path: str, cpu: bool = False) -> float:
        return statistics.median((self.cpu if cpu else self.wall)[path])

    def ratio(self, path: str, to: str, cpu: bool = False, less: str | None = None) -> float:
        """Median over the rounds of path / to (path minus `less` first, when given)."""
        samples = self.cpu if cpu else self.wall
        minus = samples[less] if less else [0.0] * len(samples[path])
        return statistics.median((a - m) / b for a, m, b in zip(samples[path], minus, samples[to], strict=True))


async def measure(folder: Path, pdf: bytes, rounds: int) -> tuple[Rounds, dict[str, float]]:
    from aggregator.documents.pdf import pdf_to_markdown
    from aggregator.manifest.model import ConvertSettings

    params = StdioServerParameters(command=sys.executable, args=["-m", "aggregator", "serve",
                                                                 str(folder / "manifest.yaml")],
                                   env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")})
    figures: dict[str, float] = {}
    taken = Rounds()
    async with Client(params, mode="auto", cache=None) as client:  # type: ignore[arg-type]
        start = time.perf_counter()
        await client.read_resource("doc://warmup.pdf")  # the first conversion starts a worker
        figures["cold"] = time.perf_counter() - start
        await client.read_resource("txt://warmup.txt")
        direct(pdf), pdf_to_markdown(pdf, ConvertSettings())  # imported and warmed
        me = [os.getpid()]
        served = me + [child.pid for child in psutil.Process().children(recursive=True)]

        async def in_process(call: Callable[[], object]) -> None:
            call()

        for i in range(rounds):
            await taken.time("direct", me, lambda: in_process(lambda: direct(pdf)))
            await taken.time("ours", me, lambda: in_process(lambda: pdf_to_markdown(pdf, ConvertSettings())))
            await taken.time("first_read", served, lambda: client.read_resource(f"doc://p{i}.pdf"))  # new: converted
            await taken.time("hop", served, lambda: client.read_resource(f"txt://m{i}.txt"))
        figures["worker_rss"] = _worker_rss(str(folder / "manifest.yaml"))
    return taken, figures


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


def report(taken: Rounds, figures: dict[str, float], pages: int, pdf: bytes, markdown: int, rounds: int) -> str:
    load = os.getloadavg()[0]
    rows = [("pypdfium2 called directly, in process", "direct"),
            ("aggregator's PDF converter, in process", "ours"),
            ("first read through the server (stdio, modern wire)", "first_read"),
            (f"a {markdown // 1024} KB text file read through the server (the hop)", "hop")]
    lines = [f"{pages}-page PDF ({len(pdf) // 1024} KB, 200 words a page, {markdown // 1024} KB of Markdown), "
             f"{rounds} interleaved rounds, medians; load average {load:.1f} on {os.cpu_count()} cores while it ran "
             "(other work shared the machine: compare rows, not runs). CPU: every process of the path (client, "
             "server, worker).", "",
             "| Path | Wall | Pages/s | CPU |", "| --- | --- | --- | --- |"]
    lines += [f"| {name} | {taken.median(key) * 1000:.1f} ms | {pages / taken.median(key):,.0f} | "
              f"{taken.median(key, cpu=True) * 1000:.1f} ms |" for name, key in rows]
    lines += ["",
              f"First read / direct call, median of the rounds' ratios: wall {taken.ratio('first_read', 'direct'):.2f}x "
              f"(minus the hop {taken.ratio('first_read', 'direct', less='hop'):.2f}x), CPU "
              f"{taken.ratio('first_read', 'direct', cpu=True):.2f}x (minus the hop "
              f"{taken.ratio('first_read', 'direct', cpu=True, less='hop'):.2f}x); target: within 1.2x plus the hop. "
              f"The very first conversion, which starts a worker: {figures['cold'] * 1000:.0f} ms. "
              f"Worker pool at rest (after the reads): {figures['worker_rss']:.0f} MB resident.",
              "", "Run: `.venv/bin/python -m benchmarks.documents --write`."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--pages", type=int, default=100)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    pdf = pdf_pages(args.pages, words=200)
    from aggregator.documents.pdf import pdf_to_markdown
    from aggregator.manifest.model import ConvertSettings

    markdown = pdf_to_markdown(pdf, ConvertSettings())
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "files").mkdir()
        (folder / "manifest.yaml").write_text(MANIFEST)
        for name in ["warmup"] + [f"p{i}" for i in range(args.rounds)]:
            (folder / "files" / f"{name}.pdf").write_bytes(pdf)
        for name in ["warmup"] + [f"m{i}" for i in range(args.rounds)]:
            (folder / "files" / f"{name}.txt").write_text(markdown)
        taken, figures = anyio.run(measure, folder, pdf, args.rounds)
    section = report(taken, figures, args.pages, pdf, len(markdown.encode()), args.rounds)
    print(section)
    if args.write:
        doc = ROOT / "docs" / "documents.md"
        text = doc.read_text()
        text = re.sub(r"\n## Benchmark\n.*?(?=\n## |\Z)", "", text, flags=re.S).rstrip("\n")
        doc.write_text(text + "\n\n## Benchmark\n\n" + section + "\n")


if __name__ == "__main__":
    main()
