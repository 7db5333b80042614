"""The conversion workers: separate processes (worker.py), so a parser that hangs or balloons costs its own
process, never the server's event loop or memory. At most `size` conversions run at once (the others wait their
turn); a worker that overruns its time is killed and replaced by a fresh one on the next conversion, and one that
died (out of memory, a crash in C) is replaced the same way. Idle workers are kept for the next conversion. A
document a parser gave up on is converted once more in a fresh worker with twice the memory: a parser may report a
failed allocation as a broken file, and only the second attempt's peak tells a corrupt file from a big one."""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from aggregator.documents.failures import ConversionFailed, OverLimit
from aggregator.documents.stored import StoredConversions
from aggregator.documents.worker import READY
from aggregator.manifest.model import ConvertSettings

__all__ = ["DEFAULT_WORKERS", "START_TIMEOUT", "ConverterMissing", "DocumentPool"]

logger = logging.getLogger("aggregator")

DEFAULT_WORKERS = max(1, min(4, os.cpu_count() or 1))
"""Conversions at once (and worker processes kept): CPU-bound, so no more than the cores, and at most 4."""
START_TIMEOUT = 60.0
"""Seconds a new worker has to load its libraries and say it is ready (not counted in a conversion's time)."""
_LENGTH = struct.Struct(">I")


class ConverterMissing(ConversionFailed):
    """The library a format needs is not installed (the `documents` extra)."""


class _Worker:
    def __init__(self, process: Process) -> None:
        self.process = process
        assert process.stdout is not None and process.stdin is not None
        self.replies = BufferedByteReceiveStream(process.stdout)
        self.requests = process.stdin

    @classmethod
    async def start(cls) -> _Worker:
        process = await anyio.open_process([sys.executable, "-m", "aggregator.documents.worker"],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None)
        worker = cls(process)
        try:
            with anyio.fail_after(START_TIMEOUT):
                ready = await worker.replies.receive_exactly(len(READY))
        except BaseException:
            await worker.kill()
            raise
        if ready != READY:
            await worker.kill()
            raise RuntimeError("a document worker started badly")
        return worker

    async def ask(self, header: bytes, document: bytes) -> dict[str, object]:
        """The worker's reply on `document`, its Markdown (if converted) under `text`."""
        await self.requests.send(_LENGTH.pack(len(header)) + header + _LENGTH.pack(len(document)))
        await self.requests.send(document)
        reply: dict[str, object] = json.loads(await self._message())
        text = await self._message()
        if reply.get("converted"):
            reply["text"] = text.decode("utf-8", "surrogatepass")
        return reply

    async def _message(self) -> bytes:
        (length,) = _LENGTH.unpack(await self.replies.receive_exactly(_LENGTH.size))
        return await self.replies.receive_exactly(length)

    async def kill(self) -> None:
        with anyio.CancelScope(shield=True):
            if self.process.returncode is None:
                self.process.kill()
            await self.process.aclose()


class DocumentPool:
    """Up to `size` worker processes converting documents, each conversion within its limits."""

    def __init__(self, size: int = DEFAULT_WORKERS) -> None:
        self.size = size
        self._limiter = anyio.CapacityLimiter(size)
        # Background work (the search indexer) queues here first: it never holds more than half the workers, so a
        # client's read finds one free (or waits for one conversion at most) however many documents are indexed.
        self._background = anyio.CapacityLimiter(max(1, size // 2))
        self._idle: list[_Worker] = []
        self.started = 0
        """Workers started since the pool was made (replacements included)."""
        self.killed = 0
        """Workers killed for overrunning their time, or found dead."""
        self.converted = 0
        """Documents sent to a worker that came back as text (for /metrics and the tests' single-flight count)."""
        self.failed = 0
        """Documents sent to a worker that did not (a limit, a corrupt file, a killed worker)."""
        self.busy = 0
        """Conversions running now."""
        self.rechecked = 0
        """Documents a parser gave up on, converted again in a fresh worker with more memory to tell a corrupt file
        from one past convert.maxMemory."""
        self.peak = 0
        """The most address space a worker has reported (bytes, its libraries included): how near maxMemory
        conversions come."""
        self.stored: StoredConversions | None = None
        """Converted text kept on disk across restarts (server.documents.cacheDir); None: off."""
        self._queued: dict[Hashable, anyio.Event] = {}

    @property
    def workers(self) -> int:
        """Worker processes alive now: idle ones and those converting."""
        return len(self._idle) + self.busy

    async def convert(self, document: bytes, fmt: str, limits: ConvertSettings, background: bool = False,
                      wanted: anyio.Event | None = None) -> str:
        """The Markdown of `document`; ConversionFailed (OverLimit for a limit, with the limit's key) otherwise.
        `background` work (indexing) runs at most size // 2 (at least 1) at once, leaving the rest to reads; once
        `wanted` is set (a client's read waits for this conversion) it stops waiting for a background turn."""
        if background:
            turn = object()
            if await self._background_turn(turn, wanted):
                try:
                    return await self.convert(document, fmt, limits)
                finally:
                    self._background.release_on_behalf_of(turn)
            return await self.convert(document, fmt, limits)
        if self.stored is None:
            return await self._convert(document, fmt, limits)
        name = self.stored.name(document, fmt, limits)
        kept = await self.stored.get(name)
        if kept is not None:
            return kept
        text = await self._convert(document, fmt, limits)
        await self.stored.put(name, text)
        return text

    @contextmanager
    def queued(self, key: Hashable) -> Iterator[anyio.Event]:
        """While background work converts what `key` names (the caller's name for it): the event `wanted(key)`
        sets, to pass to `convert`."""
        event = self._queued[key] = anyio.Event()
        try:
            yield event
        finally:
            if self._queued.get(key) is event:
                del self._queued[key]

    def wanted(self, key: Hashable) -> None:
        """A client's read of what `key` names waits for any background work on it: that work goes ahead now."""
        event = self._queued.get(key)
        if event is not None:
            event.set()

    async def _background_turn(self, turn: object, wanted: anyio.Event | None) -> bool:
        """Wait for a background slot (True: held for `turn`, to be released) or, sooner, for `wanted` (False)."""
        if wanted is None:
            await self._background.acquire_on_behalf_of(turn)
            return True
        held = False
        async with anyio.create_task_group() as race:
            async def slot() -> None:
                nonlocal held
                await self._background.acquire_on_behalf_of(turn)  # cancelled while waiting: nothing is held
                held = True
                race.cancel_scope.cancel()

            async def asked() -> None:
                await wanted.wait()
                race.cancel_scope.cancel()

            race.start_soon(slot)
            race.start_soon(asked)
        return held

    async def _convert(self, document: bytes, fmt: str, limits: ConvertSettings) -> str:
        async with self._limiter:
            try:
                reply = await self._ask(document, fmt, limits)
                if reply.get("recheck"):
                    # A parser gave up: the file is corrupt, or an allocation failed under the limit and came out as
                    # a broken file. A fresh worker (its address space its own libraries alone) with twice the memory
                    # tells which: the same verdict within the first limit is the file's, past it the limit's.
                    self.rechecked += 1
                    reply = await self._ask(document, fmt, replace(limits, max_memory=2 * limits.max_memory),
                                            within=limits.max_memory)
            except ConversionFailed:
                self.failed += 1
                raise
        if "text" in reply:
            self.converted += 1
            return str(reply["text"])
        self.failed += 1
        if "missing" in reply:
            raise ConverterMissing(str(reply["error"]))
        if "limit" in reply:
            raise OverLimit(str(reply["error"]).removesuffix(f" (limit convert.{reply['limit']})"),
                            str(reply["limit"]))
        raise ConversionFailed(str(reply["error"]))

    async def _ask(self, document: bytes, fmt: str, limits: ConvertSettings, within: int | None = None
                   ) -> dict[str, object]:
        """One worker's reply on `document` (a fresh worker's when `within`, the limit a first attempt was held to,
        is given); OverLimit or ConversionFailed when the worker overran its time or died."""
        header = json.dumps({"format": fmt, "limits": asdict(limits), "within": within}).encode("utf-8")
        worker = self._idle.pop() if self._idle and within is None else await self._start()
        keep = False
        self.busy += 1
        try:
            with anyio.fail_after(limits.timeout):
                reply = await worker.ask(header, document)
            keep = not reply.get("leave")
        except TimeoutError:
            self.killed += 1
            raise OverLimit(f"converting it took longer than {limits.timeout:g}s", "timeout") from None
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, OSError):
            self.killed += 1
            raise ConversionFailed(f"the converter stopped on it (out of memory? limit convert.maxMemory is "
                                   f"{within or limits.max_memory} bytes)") from None
        finally:
            self.busy -= 1
            if keep:
                self._idle.append(worker)
            else:
                await worker.kill()
        peak = reply.get("peak")
        if isinstance(peak, int):
            self.peak = max(self.peak, peak)
        return reply

    async def _start(self) -> _Worker:
        worker = await _Worker.start()
        self.started += 1
        return worker

    async def aclose(self) -> None:
        """Stop the idle workers (busy ones stop when their conversion ends or is cancelled)."""
        idle, self._idle = self._idle, []
        for worker in idle:
            await worker.kill()
