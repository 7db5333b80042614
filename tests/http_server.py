"""A real HTTP server on loopback for HTTP-source tests: counts requests, serves slow, endless, redirecting,
compressed and failing responses."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

BINARY = bytes(range(256)) * 4


class Upstream:
    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.etag = '"v1"'
        self.body = "# A\n\nfirst version\n"
        self.failing = False
        self.seen_headers: list[dict[str, str]] = []
        self.queries: list[dict[str, str]] = []
        self.port = 0
        self.gate = threading.Event()
        """`gated` answers once this is set (a read held open for as long as a test needs)."""
        self.files: dict[str, bytes] = {}
        """Served under /base/ with a content ETag (the source contract's files), before the fixed routes."""
        self.stalled: set[str] = set()
        """Paths under /base/ that never answer."""
        self.answering = threading.Event()
        """Cleared, requests under /base/ wait until it is set again (counted as they arrive): an upstream that
        holds every poll for as long as a test needs, so what follows a poll happens after what the test awaits."""
        self.answering.set()
        self.holding: set[str] = set()
        """The requests ("HEAD docs/a.md") that `answering` holds; empty: every one."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/base/{tail:.*}", self.handle)
        app.router.add_route("*", "/{tail:.*}", self.outside)
        return app

    async def outside(self, request: web.Request) -> web.Response:
        self.hits["OUTSIDE " + request.path] += 1
        return web.Response(text="outside the base folder")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        tail = request.match_info["tail"]
        self.hits[f"{request.method} {tail}"] += 1
        self.seen_headers.append(dict(request.headers))
        if not self.answering.is_set() and (not self.holding or f"{request.method} {tail}" in self.holding):
            await asyncio.get_running_loop().run_in_executor(None, self.answering.wait, 30)
        if self.failing:
            return web.Response(status=500, text="SECRET-UPSTREAM-BODY")
        if tail in self.stalled:
            await asyncio.sleep(60)
        if tail in self.files:
            data = self.files[tail]
            return web.Response(body=data, content_type="application/octet-stream",
                                headers={"ETag": f'"{hashlib.sha256(data).hexdigest()[:16]}"'})
        if tail == "docs/a.md":
            await asyncio.sleep(0.05)  # long enough for concurrent misses to overlap
            if request.headers.get("If-None-Match") == self.etag:
                return web.Response(status=304)
            return web.Response(text=self.body, content_type="text/markdown", headers={"ETag": self.etag})
        if tail == "data":  # no extension: the Content-Type decides
            return web.json_response({"ok": True})
        if tail == "blob":
            return web.Response(body=BINARY, content_type="application/octet-stream")
        if tail == "weather":
            self.queries.append(dict(request.query))
            return web.json_response({"city": request.query.get("city"), "params": sorted(request.query)})
        if tail == "gated":
            if request.method == "GET":  # a stat (HEAD) answers at once
                await asyncio.get_running_loop().run_in_executor(None, self.gate.wait, 10)
            return web.Response(text="gated body", content_type="text/plain")
        if tail == "slow":
            await asyncio.sleep(10)
            return web.Response(text="late")
        if tail == "endless":
            response = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await response.prepare(request)
            try:
                while True:
                    await response.write(b"x" * 65536)
                    await asyncio.sleep(0)
            except (ConnectionResetError, asyncio.CancelledError):
                return response
        if tail == "bomb":
            return web.Response(body=gzip.compress(b"\0" * 5_000_000), headers={
                "Content-Encoding": "gzip", "Content-Type": "application/octet-stream"})
        if tail == "redirect":
            raise web.HTTPFound(location=request.query["to"])
        if tail == "missing":
            return web.Response(status=404, text="SECRET-404-BODY")
        return web.Response(status=404)


async def _finish(runner: web.AppRunner) -> None:
    """Stop serving, then end the handlers still held (a stalled read sleeps for a minute): cancelled and awaited
    here, they do not outlive the loop as "Task was destroyed but it is pending!" warnings."""
    await runner.cleanup()
    held = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in held:
        task.cancel()
    await asyncio.gather(*held, return_exceptions=True)


@contextmanager
def serve() -> Iterator[Upstream]:
    """Run an Upstream on 127.0.0.1 in a background thread for the duration of the block."""
    upstream = Upstream()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runner = web.AppRunner(upstream.app(), shutdown_timeout=0.5)

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        upstream.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield upstream
    finally:
        upstream.answering.set()  # a request still held would keep an executor thread waiting
        asyncio.run_coroutine_threadsafe(_finish(runner), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
