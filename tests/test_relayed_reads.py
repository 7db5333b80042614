"""Reads relayed in callbacks (`aggregator/stdio_relay.py` over `aggregator/reads/relayed.py`): an uncached read
of an `mcp+stdio:` upstream answered from the pipe callback that brings the upstream's answer, with no task. The
relay is what serves such reads (`stdio_relay.RelayedRead`, over a URI's `RelayPlan`; a URI without one is read the
usual way), and a client over stdio sees of them exactly what the SDK's path shows: the same answers and errors on
both wires, the same access log, a cancelled read unanswered and cancelled upstream, the cache's single flight
shared with reads served the usual way, and a read whose connection is lost under it read again the usual way. Real
processes throughout: our upstream test server (tests/upstream_server.py) behind `aggregator serve`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import pytest

from aggregator import __version__
from aggregator.event_loop import backend_options
from aggregator.handlers.resources import ResourceHandlers
from aggregator.search import Discovery
from aggregator.server import build_server
from aggregator.service import ResourceService
from aggregator.stdio_fast import fast_reads_for
from aggregator.stdio_relay import RelayedRead
from tests.conftest import write_manifest
from tests.served import serve_http
from tests.test_http_fast import _modern
from tests.test_http_fast_observed import _modern_headers
from tests.test_stdio_fast import MODERN_META, _read
from tests.test_stdio_fast import _script as _reads
from tests.test_stdio_fast_observed import WAIT, _accessed, _run
from tests.test_upstream import ENV, HERE

UPSTREAM = [sys.executable, str(HERE / "upstream_server.py"), "stdio"]


def _manifest(folder: Path, ttl: str = "0s", timeout: str = "3s", **environ: str) -> Path:
    env = {"PYTHONPATH": ENV["PYTHONPATH"], "UPSTREAM_HANGING": "1", "UPSTREAM_CHANGES": "1", **environ}
    return write_manifest(folder, f"""
        version: 1
        server: {{name: relayed}}
        defaults: {{ttl: {ttl}}}
        sources:
          up: {{url: "mcp+stdio:", prefix: "test://", command: {UPSTREAM!r}, env: {env!r}, maxBytes: 50000,
                timeout: {timeout}}}
        collections:
          - {{source: up, glob: "static-*", uri: "wiki://{{path}}"}}
          - {{source: up, glob: "{{boom,big,hang,hanging,counter,texts}}", uri: "wiki://{{path}}"}}
        """)


@pytest.mark.parametrize("pause", [0.5, 0.0], ids=["started", "at-once"])
@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_a_client_sees_of_relayed_reads_what_the_sdk_path_shows(tmp_path: Path, wire: str, pause: float) -> None:
    """Text, a blob, an upstream failure (its secret kept upstream), an answer past maxBytes, a URI the catalog does
    not have, and a read held upstream then cancelled once it runs or in the write that asked for it (unanswered;
    the upstream told: nothing is left hanging):
    answers and access log alike with the fast path (which relays) and without."""
    manifest = _manifest(tmp_path)
    meta = {"_meta": MODERN_META} if wire == "modern" else {}
    opening = [(m, 0.0) for m in _reads(wire) if m.get("method") != "resources/read"]
    opening[0] = (opening[0][0], WAIT)
    script = [*opening, *((_read(n, f"wiki://{name}", **meta), WAIT) for n, name in enumerate(
        ["static-text", "static-binary", "boom", "big", "nope", "counter"], start=101)),
        (_read(109, "wiki://hang", **meta), pause),
        ({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 109}}, 0.5),
        (_read(110, "wiki://hanging", **meta), WAIT), (_read(111, "wiki://static-text", **meta), 0.0)]
    (fast, fast_err), (slow, slow_err) = (_run(manifest, script, on) for on in (True, False))
    assert fast == slow
    assert fast[101]["result"]["contents"][0]["text"].startswith("Hello")
    assert "blob" in fast[102]["result"]["contents"][0]
    assert fast[103]["error"]["data"] == {"uri": "wiki://boom"} and "SECRET" not in str(fast[103])
    assert fast[104]["error"]["data"]["uri"] == "wiki://big"
    assert fast[106]["result"]["contents"][0]["text"] == "read 1"
    assert 109 not in fast and fast[110]["result"]["contents"][0]["text"] == "0"
    access = _accessed(fast_err)
    assert access == _accessed(slow_err)
    assert access[("stdio", "resources/read", "wiki://boom", "unavailable")] == 1
    assert access[("stdio", "resources/read", "wiki://big", "too_large")] == 1
    assert access[("stdio", "resources/read", "wiki://hang", "error")] == 1
    assert access[("stdio", "resources/read", "wiki://static-text", "ok")] == 2


@pytest.mark.parametrize("hints", ["", "private:5000"], ids=["no-hints", "hints"])
@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_answers_alike_but_for_their_text_are_served_as_the_usual_way_serves_them(tmp_path: Path, wire: str,
                                                                               hints: str) -> None:
    """One URI read again and again, its text changing (non-ASCII, quotes and control characters, line separators,
    a byte-order mark, the text that stands for a cut-out text, nothing): after the first, relayed answers are
    written into the first one's line; each is the SDK's path's answer, on both wires, with the upstream's caching
    hints or without."""
    from tests.upstream_server import TEXTS

    manifest = _manifest(tmp_path, UPSTREAM_TEXTS="1", **({"UPSTREAM_CACHE": hints} if hints else {}))
    meta = {"_meta": MODERN_META} if wire == "modern" else {}
    opening = [(m, 0.0) for m in _reads(wire) if m.get("method") != "resources/read"]
    opening[0] = (opening[0][0], WAIT)
    count = 2 * len(TEXTS) + 1
    script = [*opening, *((_read(n, "wiki://texts", **meta), WAIT) for n in range(101, 101 + count))]
    (fast, _), (slow, _) = (_run(manifest, script, on) for on in (True, False))
    assert fast == slow
    served = [fast[n]["result"]["contents"][0]["text"] for n in range(101, 101 + count)]
    assert served == [text.removeprefix("\ufeff") for text in (TEXTS * 3)[:count]]


def _hostile_manifest(folder: Path) -> Path:
    return write_manifest(folder, f"""
        version: 1
        server: {{name: relayed}}
        defaults: {{ttl: 0s}}
        sources:
          va: {{url: "mcp+stdio:", prefix: "h://t/", command: {[sys.executable, str(HERE / "hostile_upstream.py"),
                                                                 "numbers"]!r}}}
        collections:
          - {{source: va, glob: "*", uri: "wiki://{{path}}"}}
        """)


def test_hostile_answers_alike_but_for_a_numbers_type_or_a_lone_surrogate_go_the_usual_way(tmp_path: Path) -> None:
    """A kept shape is used only for an answer equal to its own but for the text: a `ttlMs` equal to the kept one's
    but for its type (True, 1.0 for 1), or not valid, and text holding a lone surrogate, are served as the SDK's path
    serves them."""
    manifest = _hostile_manifest(tmp_path)
    opening = [(m, 0.0) for m in _reads("legacy") if m.get("method") != "resources/read"]
    opening[0] = (opening[0][0], WAIT)
    count = 14  # twice round tests/hostile_upstream.py's NUMBERS (importing it would serve on this test's stdin)
    script = [*opening, *((_read(n, "wiki://numbers" if n % 3 else "wiki://lone"), WAIT)
                          for n in range(101, 101 + count))]
    (fast, _), (slow, _) = (_run(manifest, script, on) for on in (True, False))
    assert fast == slow
    texts = [a["result"]["contents"][0].get("text", "") for a in fast.values() if "contents" in a.get("result", {})]
    assert any("error" in answer for answer in fast.values()) and any(text.startswith("read") for text in texts)


def test_texts_served_as_the_upstream_wrote_them_are_its_answers_texts(tmp_path: Path) -> None:
    """Answers alike but for their text are served with the text as the upstream wrote it (escaped, `": "`), and an
    answer whose `_meta` holds a string `"text"` before the content's key is served as the SDK's path serves it."""
    manifest = _hostile_manifest(tmp_path)
    opening = [(m, 0.0) for m in _reads("legacy") if m.get("method") != "resources/read"]
    opening[0] = (opening[0][0], WAIT)
    script = [*opening, *((_read(n, "wiki://decoy" if n % 2 else "wiki://escaped"), WAIT) for n in range(101, 111))]
    (fast, _), (slow, _) = (_run(manifest, script, on) for on in (True, False))
    assert fast == slow
    texts = [fast[n]["result"]["contents"][0]["text"] for n in range(101, 111)]
    assert texts[0::2] == [f"decoy read {n} \u2713" for n in range(1, 10, 2)]
    assert texts[1::2] == [f'read "{n}" \\ caf\u00e9 \u2028 \U0001f600 "text": \n' for n in range(2, 11, 2)]


def test_no_shape_is_kept_of_an_answer_whose_result_is_large_but_for_its_text(tmp_path: Path) -> None:
    """An upstream's result of kilobytes besides its text (an 8 KB `_meta`) is served the usual way each time and
    nothing of it is kept for the URI; a small one's shape is kept."""
    async def main() -> None:
        service = await ResourceService.open(_hostile_manifest(tmp_path))
        stdio = _Stdio(service)
        handlers = stdio.fast.relays
        assert isinstance(handlers, ResourceHandlers)
        try:
            await service.read("wiki://lone")  # connected: the lane is up
            for n, uri in enumerate(["wiki://meta", "wiki://numbers"] * 3):
                assert isinstance(stdio.read(n, uri), RelayedRead)
                assert (await stdio.answer(n))["contents"][0]["text"] in ("metadata", f"read {n // 2 + 1}")
            meta, numbers = handlers.relay_plan("wiki://meta"), handlers.relay_plan("wiki://numbers")
            assert meta is not None and numbers is not None
            assert not meta.shapes and list(numbers.shapes) == ["2025-11-25"]
        finally:
            await service.aclose()

    anyio.run(main)


def test_the_plans_of_uris_past_the_bound_are_not_kept(tmp_path: Path) -> None:
    """A URI of megabytes asked for is planned (here: not relayed, the catalog lacks it) but not kept: the memo of
    4,096 plans would hold thousands of them."""
    from aggregator.reads.relayed import MAX_PLANNED_URI

    async def main() -> None:
        service = await ResourceService.open(_hostile_manifest(tmp_path))
        try:
            long, short = "wiki://" + "x" * MAX_PLANNED_URI, "wiki://nowhere"
            assert service.relay_plan(long, lambda uri: False) is None
            assert service.relay_plan(short, lambda uri: False) is None
            plans = service._plans  # noqa: SLF001
            assert short in plans and long not in plans
        finally:
            await service.aclose()

    anyio.run(main)


class _Stdio:
    """The stdio fast path of a real server over `service` (its read handler's relayed reads included), fed request
    lines as the pipe would and its answers kept by id: those written at once (`answer_now`, a relayed read's) and
    those a task writes (a read served the usual way). A legacy connection whose handshake was answered."""

    def __init__(self, service: ResourceService) -> None:
        self.fast = fast_reads_for(build_server(service))
        assert self.fast is not None
        self.fast.era, self.fast.gate_open, self.fast.legacy_version = "legacy", True, "2025-11-25"
        self.fast._out = self  # noqa: SLF001 - what stdout's writer is to it
        self.answers: dict[Any, Any] = {}
        self.lines: dict[Any, bytes] = {}
        """The lines written at once, by id."""
        self.answered = anyio.Event()

    def ready(self) -> bool:
        return True

    def answer_now(self, request_id: Any, data: bytes | None, error: Any) -> None:
        self.answers[request_id] = json.loads(data)["result"] if data is not None else error
        if data is not None:
            self.lines[request_id] = data
        self.answered.set()

    async def _answer(self, request_id: Any, data: bytes | None, error: Any) -> None:
        self.answer_now(request_id, data, error)

    def read(self, request_id: int, uri: str, modern: bool = False, compact: bool = False) -> Any:
        """Send a read (`compact`: written as the SDK's client writes it); the running read (`RelayedRead` when
        relayed, a task when not)."""
        self.fast._loop = asyncio.get_running_loop()  # noqa: SLF001
        request = _read(request_id, uri, **({"_meta": MODERN_META} if modern else {}))
        line = json.dumps(request, separators=(",", ":") if compact else None).encode() + b"\n"
        if modern:
            self.fast.era = "modern"
        assert self.fast.take(line, self._answer) == request_id
        return self.fast.tasks.get(request_id)

    async def answer(self, request_id: int) -> Any:
        with anyio.fail_after(10):
            while request_id not in self.answers:
                self.answered = anyio.Event()
                await self.answered.wait()
        return self.answers[request_id]


def test_a_read_asked_again_in_the_same_words_and_its_text_as_the_upstream_wrote_it(tmp_path: Path) -> None:
    """A read line seen before but for its id skips the parse and the checks (`stdio_seen`), and once a shape is
    kept, answers carry their text as the upstream wrote it (its escapes), not encoded again."""
    async def main() -> None:
        service = await ResourceService.open(_hostile_manifest(tmp_path))
        stdio = _Stdio(service)
        seen = stdio.fast._seen  # noqa: SLF001
        try:
            await service.read("wiki://lone")  # connected: the lane is up
            for n in range(1, 5):
                line = json.dumps(_read(n, "wiki://escaped"), separators=(",", ":")).encode() + b"\n"
                assert (seen.find(line) is not None) == (n > 1)
                assert isinstance(stdio.read(n, "wiki://escaped", compact=True), RelayedRead)
                text = (await stdio.answer(n))["contents"][0]["text"]
                assert text.startswith(f'read "{n}" \\ caf\u00e9')
            assert "caf\u00e9".encode() in stdio.lines[1]  # the usual way: encoded as UTF-8
            assert all(b"caf\\u00e9" in stdio.lines[n] for n in (2, 3, 4))  # the upstream's own escapes
        finally:
            await service.aclose()

    anyio.run(main)


def test_relayed_reads_serve_what_they_may_and_the_rest_goes_the_usual_way(tmp_path: Path) -> None:
    """Uncached reads of the upstream are relayed (text, and a failure as the handler's error); a URI the catalog
    lacks, a search URI and a source whose copies may be kept have no plan (read the usual way). A relayed read and
    a read served the usual way at the same time share one upstream read (the cache's single flight)."""
    async def main() -> None:
        # The upstream says its reads are public (and not to be kept): reads of them may share one flight.
        service = await ResourceService.open(_manifest(tmp_path, UPSTREAM_CACHE="public:0"))
        stdio = _Stdio(service)
        handlers = stdio.fast.relays
        assert isinstance(handlers, ResourceHandlers)
        try:
            await service.read("wiki://static-text")  # connected: the lane is up
            assert isinstance(stdio.read(1, "wiki://static-text", modern=True), RelayedRead)
            assert await stdio.answer(1) == {
                "contents": [{"uri": "wiki://static-text", "mimeType": "text/plain", "text": "Hello from one"}],
                "ttlMs": 0, "cacheScope": "public", "resultType": "complete",
                "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "relayed", "version": __version__}}}
            stdio.fast.era = "legacy"
            assert isinstance(stdio.read(2, "wiki://boom"), RelayedRead)
            error = await stdio.answer(2)
            assert error.code == -32603 and error.data == {"uri": "wiki://boom"} and "SECRET" not in error.message
            assert handlers.relay_plan("wiki://nope") is None and handlers.relay_plan("search://?q=x") is None
            # One upstream read for both: the usual read follows the relayed one's flight.
            assert isinstance(stdio.read(3, "wiki://counter"), RelayedRead)
            assert isinstance(stdio.read(4, "wiki://counter"), asyncio.Task)
            assert (await stdio.answer(3))["contents"][0]["text"] == (await stdio.answer(4))["contents"][0]["text"]
            assert (await stdio.answer(3))["contents"][0]["text"] == "read 1"
            assert (await service.read("wiki://counter")).content.text == "read 2"
        finally:
            await service.aclose()

    anyio.run(main)
    kept = tmp_path / "kept"
    kept.mkdir()

    async def cached() -> None:
        service = await ResourceService.open(_manifest(kept, ttl="60s"))
        try:
            await service.read("wiki://static-text")
            assert ResourceHandlers(service, Discovery(service), None).relay_plan("wiki://static-binary") is None
        finally:
            await service.aclose()

    anyio.run(cached)


def test_a_read_the_upstreams_pipe_cannot_take_at_once_goes_the_usual_way_and_holds_nothing(tmp_path: Path) -> None:
    """The relayed read is set up before its request line is written (the write is its last step): when the pipe
    cannot take the line at once (it holds unsent bytes), nothing of it is left (no slot of the cap, no snapshot
    held, no flight of its key) and the read is served the usual way, behind the writes under way."""
    async def main() -> None:
        service = await ResourceService.open(_manifest(tmp_path))
        stdio = _Stdio(service)
        try:
            await service.read("wiki://static-text")  # connected: the lane is up
            lane = service.sources["up"].upstream._conn.lane  # type: ignore[attr-defined]
            write_now, refused = lane._write_now, []  # noqa: SLF001
            lane._write_now = lambda line: refused.append(line) is not None  # noqa: SLF001 - a pipe still full
            try:
                read = stdio.read(1, "wiki://counter")
                assert isinstance(read, asyncio.Task) and len(refused) == 1
                assert (await stdio.answer(1))["contents"][0]["text"] == "read 1"
            finally:
                lane._write_now = write_now  # noqa: SLF001
            upstream = service.sources["up"].upstream  # type: ignore[attr-defined]
            assert upstream._limiter.borrowed_tokens == 0 and not service._leases._held  # noqa: SLF001
            assert isinstance(stdio.read(2, "wiki://counter"), RelayedRead)  # its flight was let go
            assert (await stdio.answer(2))["contents"][0]["text"] == "read 2"
        finally:
            await service.aclose()

    anyio.run(main)


def test_a_cancelled_relayed_read_frees_its_slot_and_tells_the_upstream(tmp_path: Path) -> None:
    """Cancelled: never replied, the upstream's handler cancelled, the source's concurrency slot given back (more
    reads than the cap run after many cancellations)."""
    async def main() -> None:
        service = await ResourceService.open(_manifest(tmp_path))
        stdio = _Stdio(service)
        try:
            await service.read("wiki://static-text")
            for n in range(12):  # more than the cap (maxConcurrency 8): a slot kept would block the last ones
                read = stdio.read(n, "wiki://hang")
                assert isinstance(read, RelayedRead)
                await anyio.sleep(0.05)
                stdio.fast.tasks.pop(n).cancel()  # as the client's notifications/cancelled does
                read.cancel()  # twice: nothing more happens
            with anyio.fail_after(10):
                while (await service.read("wiki://hanging")).content.text != "0":
                    await anyio.sleep(0.05)
            assert not stdio.answers
            upstream = service.sources["up"].upstream  # type: ignore[attr-defined]
            assert upstream._limiter.borrowed_tokens == 0  # noqa: SLF001
        finally:
            await service.aclose()

    anyio.run(main)


def test_a_relayed_read_whose_connection_is_lost_is_read_again_the_usual_way(tmp_path: Path) -> None:
    """The upstream child dies under a relayed read: it replies None (read it the usual way: nothing counted), and
    that read reaches the reconnected upstream."""
    pidfile = tmp_path / "upstream.pid"

    async def main() -> None:
        # Calls bounded well past a loaded machine's restart of the upstream (a new Python process, its handshake).
        service = await ResourceService.open(_manifest(tmp_path, timeout="15s", UPSTREAM_PIDFILE=str(pidfile)))
        stdio = _Stdio(service)
        try:
            await service.read("wiki://static-text")
            assert isinstance(stdio.read(1, "wiki://hang"), RelayedRead)
            await anyio.sleep(0.2)
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
            with anyio.fail_after(10):
                while not isinstance(stdio.fast.tasks.get(1), asyncio.Task):
                    await anyio.sleep(0.02)
            assert not stdio.answers  # nothing answered: read again by a task, the usual way
            stdio.fast.tasks.pop(1).cancel()
            with anyio.fail_after(20):
                assert (await service.read("wiki://static-text")).content.text == "Hello from one"
        finally:
            await service.aclose()

    anyio.run(main)


def test_a_reload_keeps_the_source_of_a_relayed_read_open_until_it_ends(tmp_path: Path) -> None:
    """A reload that drops the source of a relayed read still in flight closes it only once the read ends."""
    async def main() -> None:
        # The held read must outlast the reload's start of a new upstream on a loaded machine: a bound well past it.
        manifest = _manifest(tmp_path, timeout="15s")
        service = await ResourceService.open(manifest)
        stdio = _Stdio(service)
        try:
            await service.read("wiki://static-text")
            upstream = service.sources["up"].upstream  # type: ignore[attr-defined]
            assert isinstance(stdio.read(1, "wiki://hang"), RelayedRead)
            manifest.write_text(manifest.read_text().replace("'UPSTREAM_CHANGES': '1'", "'UPSTREAM_TAG': 'two'"))
            await service.reload()
            assert service.sources["up"].upstream is not upstream
            await anyio.sleep(0.3)
            assert upstream.status.state == "connected"  # held by the read
            stdio.fast.tasks.pop(1).cancel()
            with anyio.fail_after(10):
                while upstream.status.state != "closed":
                    await anyio.sleep(0.05)
        finally:
            await service.aclose()

    anyio.run(main)


SLOW = [sys.executable, str(HERE / "hostile_upstream.py"), "slow"]


def _slow_manifest(folder: Path, timeout: str = "500ms") -> Path:
    """An upstream that never answers slow://slow, answers slow://late past the timeout (1.5 s: give it less), and
    says at slow://told what it was told; a cap of two reads at once."""
    return write_manifest(folder, f"""
        version: 1
        server: {{name: relayed}}
        defaults: {{ttl: 0s}}
        sources:
          slow: {{url: "mcp+stdio:", prefix: "h://", command: {SLOW!r}, env: {ENV!r}, timeout: {timeout},
                  maxConcurrency: 2}}
        collections:
          - {{source: slow, glob: "*", uri: "slow://{{path}}"}}
        """)


async def _told(service: ResourceService, cancelled: int) -> dict[str, Any]:
    """What the slow upstream was told, once it was told of `cancelled` reads given up (its cancellations are sent
    in a task of their own)."""
    with anyio.fail_after(10):
        while True:
            told: dict[str, Any] = json.loads((await service.read("slow://told")).content.text or "")
            if len(told["cancelled"]) >= cancelled:
                return told
            await anyio.sleep(0.05)


def _cancelled_with_reasons(told: dict[str, Any]) -> set[str]:
    """The ids of the reads the upstream was told were given up, each told with a reason."""
    assert all(isinstance(params.get("reason"), str) and params["reason"] for params in told["cancelled"]), told
    return {params["requestId"] for params in told["cancelled"]}


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_relayed_read_given_up_is_forgotten_and_cancelled_upstream(tmp_path: Path, loop: str) -> None:
    """Relayed reads past their timeout (more of them than the cap), one whose answer comes after its timeout, and
    one cancelled by its caller: each fails or goes unanswered, the lane keeps no waiter for any of them, the
    upstream is told of each (notifications/cancelled, its id and a reason), the cap's slots are all given back,
    and a good read is relayed and answered after them. On both loops `serve` runs on."""
    async def main() -> None:
        service = await ResourceService.open(_slow_manifest(tmp_path))
        stdio = _Stdio(service)
        try:
            assert (await service.read("slow://x")).content.text == "text of h://x"
            upstream = service.sources["slow"].upstream  # type: ignore[attr-defined]
            lane = upstream._conn.lane  # noqa: SLF001
            for n, uri in enumerate(["slow://slow"] * 3 + ["slow://late"], start=1):  # in turn: the cap is two
                assert isinstance(stdio.read(n, uri), RelayedRead)  # relayed: a slot was free
                error = await stdio.answer(n)
                assert "could not be read" in error.message, error
                assert not lane._waiting  # noqa: SLF001
            assert isinstance(stdio.read(5, "slow://slow"), RelayedRead)
            await anyio.sleep(0.1)
            stdio.fast.tasks.pop(5).cancel()  # as the client's notifications/cancelled does
            assert not lane._waiting and 5 not in stdio.answers  # noqa: SLF001
            told = await _told(service, 5)
            assert _cancelled_with_reasons(told) >= set(told["slow"]) and len(told["slow"]) == 4
            assert [params["reason"] for params in told["cancelled"]] == ["timed out"] * 4 + ["caller cancelled"]
            await anyio.sleep(1.5)  # slow://late's answer came, and was dropped
            assert not lane._waiting and upstream._limiter.borrowed_tokens == 0  # noqa: SLF001
            assert isinstance(stdio.read(6, "slow://x"), RelayedRead)
            assert (await stdio.answer(6))["contents"][0]["text"] == "text of h://x"
            assert upstream._limiter.borrowed_tokens == 0 and not stdio.fast.tasks  # noqa: SLF001
        finally:
            await service.aclose()

    anyio.run(main, backend_options=backend_options(loop))


@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_a_client_over_stdio_sees_reads_given_up_cancelled_upstream(tmp_path: Path, wire: str) -> None:
    """Over stdio, a read past its timeout and a read its client cancels: the upstream is told of both (their ids,
    a reason) whether the read was relayed (the fast path) or awaited (the SDK's path)."""
    manifest = _slow_manifest(tmp_path)
    meta = {"_meta": MODERN_META} if wire == "modern" else {}
    opening = [(m, 0.0) for m in _reads(wire) if m.get("method") != "resources/read"]
    opening[0] = (opening[0][0], WAIT)
    script = [*opening, (_read(101, "slow://slow", **meta), WAIT), (_read(102, "slow://slow", **meta), 0.3),
              ({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 102}}, 0.5),
              (_read(103, "slow://told", **meta), WAIT)]
    for fast in (True, False):
        answers, _ = _run(manifest, script, fast)
        assert "could not be read" in answers[101]["error"]["message"] and 102 not in answers
        told = json.loads(answers[103]["result"]["contents"][0]["text"])
        assert len(told["slow"]) == 2 and _cancelled_with_reasons(told) == set(told["slow"]), (fast, told)
        assert {p["requestId"]: p["reason"] for p in told["cancelled"]} == dict(zip(
            told["slow"], ["timed out", "caller cancelled"], strict=True)), (fast, told)


@pytest.mark.parametrize("fast", ["1", "0"])
def test_a_read_whose_http_client_goes_away_is_cancelled_upstream(tmp_path: Path, fast: str) -> None:
    """Over HTTP (reads are awaited there, not relayed), a client that disconnects from a read its upstream holds:
    the upstream is told at once (the caller's cancellation, well before the read's timeout)."""
    with serve_http(_slow_manifest(tmp_path, timeout="30s"), tmp_path, env={"AGGREGATOR_HTTP_FAST": fast}) as server:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(server.url, content=json.dumps(_modern(7, "slow://slow")).encode(),
                       headers=_modern_headers("", "slow://slow"), timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            told = json.loads(httpx.post(server.url, content=json.dumps(_modern(8, "slow://told")).encode(),
                                         headers=_modern_headers("", "slow://told"), timeout=10
                                         ).json()["result"]["contents"][0]["text"])
            if told["cancelled"] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert told["cancelled"] == [{"requestId": told["slow"][0], "reason": "caller cancelled"}], told
