"""Remote sources next to local ones, same run: cold reads (50 distinct URIs, one after another) from S3 (moto's
threaded server on loopback) and an HTTP server on loopback, one cold URI read 50 times at once from each,
cached reads from S3, HTTP and a local folder over stdio, and a collection over many S3 objects (listing time,
server peak RSS).

`python -m benchmarks.remote [--objects 100000] [--skip-listing]` prints the figures and writes its section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import http.server
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import anyio
import boto3
import psutil
from mcp import Client, StdioServerParameters
from moto.server import ThreadedMotoServer

from benchmarks.sections import DOCS, REMOTE, write_section

REPO = Path(__file__).resolve().parents[1]
BODY = b"# Report\n\n" + b"x" * 500 + b"\n"
COLD, COLD_FIRST = 50, 100  # cold reads: d001/f100.md .. d001/f149.md (in the bucket from --objects 1150 up)


def fill_bucket(endpoint: str, objects: int) -> None:
    """Create the bucket over HTTP, then put objects straight into moto's backend (100,000 PUTs over HTTP take
    ~20 min)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s",
                      region_name="us-east-1")
    s3.create_bucket(Bucket="bench")
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
    for i in range(objects):
        backend.put_object("bench", f"docs/d{i // 1000:03}/f{i % 1000:03}.md", BODY, disable_notification=True)


def manifest(folder: Path, endpoint: str, web_port: int, local: Path, collection: bool) -> Path:
    listed = '  - {source: s3, glob: "**/*.md", uri: "s3c://{path}"}\n' if collection else ""
    path = folder / ("remote-collection.yaml" if collection else "remote.yaml")
    path.write_text(f"""version: 1
server: {{name: remote-bench}}
sources:
  s3: {{url: "s3://bench/docs", options: {{key: k, secret: s, endpoint_url: "{endpoint}"}}, maxConcurrency: 32}}
  web: {{url: "http://127.0.0.1:{web_port}", allowPrivateNetwork: ["127.0.0.1/32"], maxConcurrency: 32}}
  local: {{url: "{local}"}}
templates:
  - {{uriTemplate: "s3://{{+path}}", name: s3, source: s3, path: "{{path}}"}}
  - {{uriTemplate: "web://{{+path}}", name: web, source: web, path: "{{path}}"}}
  - {{uriTemplate: "local://{{+path}}", name: local, source: local, path: "{{path}}"}}
collections:
{listed or "  []"}
""".replace("collections:\n  []\n", "collections: []\n"))
    return path


async def drive(path: Path, objects: int) -> dict[str, float]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "aggregator", "--log-level", "WARNING",
                                                                  "serve", str(path)],
                                   env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)})
    figures: dict[str, float] = {}
    async with Client(params, mode="auto", cache=None) as client:
        cold: dict[str, list[float]] = {"s3": [], "web": []}
        for i in range(COLD):  # interleaved, each URI read once: every read goes to the upstream
            for kind, latencies in cold.items():
                started = time.perf_counter()
                await client.read_resource(f"{kind}://d001/f{COLD_FIRST + i:03}.md")
                latencies.append((time.perf_counter() - started) * 1000)
        for kind, latencies in cold.items():
            figures[f"{kind} cold read, median of {COLD} distinct URIs (ms)"] = statistics.median(latencies)
        for kind in cold:
            started = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(50):
                    tg.start_soon(client.read_resource, f"{kind}://d001/f001.md")
            figures[f"{kind}: one cold URI read 50 times at once (s)"] = time.perf_counter() - started
        kinds = ("local", "s3", "web")
        uris = {kind: [f"{kind}://d000/f{i:03}.md" for i in range(20)] for kind in kinds}
        for kind in kinds:
            for uri in uris[kind]:
                await client.read_resource(uri)
        spent = dict.fromkeys(kinds, 0.0)
        # Interleaved rounds, so a slow spell of the machine costs every kind alike.
        for _ in range(10):
            for kind in kinds:
                started = time.perf_counter()
                for i in range(100):
                    await client.read_resource(uris[kind][i % 20])
                spent[kind] += time.perf_counter() - started
        for kind in kinds:
            figures[f"{kind} cached reads/s"] = 1000 / spent[kind]
    return figures


async def listing(path: Path) -> dict[str, float]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "aggregator", "--log-level", "WARNING",
                                                                  "serve", str(path)],
                                   env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)})
    started = time.perf_counter()
    async with Client(params, mode="auto", cache=None) as client:
        await client.list_resources()
        ready = time.perf_counter() - started
        started = time.perf_counter()
        count, cursor = 0, None
        while True:
            page = await client.list_resources(cursor=cursor)
            count += len(page.resources)
            cursor = page.next_cursor
            if not cursor:
                break
        full = time.perf_counter() - started
        peak = max(_hwm(c.pid) for c in psutil.Process().children(recursive=True))
    return {"listed": count, "ready (s)": ready, "full listing (s)": full, "server peak RSS (MB)": peak}


def _hwm(pid: int) -> float:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--skip-listing", action="store_true", help="only the read figures")
    parser.add_argument("--output", type=Path, default=DOCS, help="the Markdown file whose section to rewrite")
    args = parser.parse_args()
    if args.objects < 1000 + COLD_FIRST + COLD:
        parser.error(f"--objects must be at least {1000 + COLD_FIRST + COLD} (the cold reads use d001/)")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server: no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    started = time.perf_counter()
    fill_bucket(endpoint, args.objects)
    print(f"filled {args.objects} objects in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "local"
        for folder, names in (("d000", range(20)), ("d001", [1, *range(COLD_FIRST, COLD_FIRST + COLD)])):
            (local / folder).mkdir(parents=True, exist_ok=True)
            for i in names:
                (local / folder / f"f{i:03}.md").write_bytes(BODY)
        handler = functools.partial(_QuietHandler, directory=str(local))
        handler.log_message = lambda *a: None  # type: ignore[method-assign]
        web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=web.serve_forever, daemon=True).start()
        reads = anyio.run(drive, manifest(Path(tmp), endpoint, web.server_address[1], local, False), args.objects)
        lists = {} if args.skip_listing else anyio.run(listing, manifest(Path(tmp), endpoint, web.server_address[1],
                                                                          local, True))
        web.shutdown()
    server.stop()
    text = section({**reads, **lists}, args.objects, " ".join(["python -m benchmarks.remote", *sys.argv[1:]]))
    print(text)
    write_section(args.output, text)


def section(figures: dict[str, float], objects: int, command: str) -> str:
    """The report's section: one row per figure."""
    started = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    return "\n".join([
        REMOTE, "",
        f"Run {started} with `{command}`: aggregator over stdio (modern wire) on a manifest with templates over "
        f"an S3 bucket of {objects:,} objects (moto's threaded server on loopback), an HTTP server on loopback "
        "and a local folder (objects of about 500 bytes). Cold reads go to the upstream; the 50 reads at once of "
        "one cold URI show whether concurrent misses are coalesced.", "",
        "| figure | value |", "|---|---|",
        *[f"| {name} | {value:,.0f} |" if value >= 100 else f"| {name} | {value:.3g} |"
          for name, value in figures.items()], ""])



class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    """The loopback HTTP upstream, without a log line per request on the terminal."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
        pass


if __name__ == "__main__":
    main()
