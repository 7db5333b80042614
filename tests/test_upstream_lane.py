"""The read lane on its own: the request line it writes, and its timeouts (one deadline sweep per lane, not a
timer per read)."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from aggregator.upstream.lane import Lane, Sent

URIS = ["bench://a.md", 'q://"quoted"\\back', "u://caf\u00e9/\u2028/\U0001f600", "c://\x00\x1f\x7f",
        "s://lone\ud800surrogate", ""]


def _lane() -> tuple[Lane, list[bytes]]:
    written: list[bytes] = []

    def write_now(line: bytes) -> bool:
        written.append(line)
        return True

    async def write(line: bytes) -> None:
        written.append(line)

    return Lane(write, write_now), written


def _expected(request_id: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "resources/read", "params": params},
                      separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n"


def _cancelled(written: list[bytes]) -> dict[str, str]:
    """The reads cancelled upstream in `written`, and why."""
    notes = [json.loads(line)["params"] for line in written if b"notifications/cancelled" in line]
    return {note["requestId"]: note["reason"] for note in notes}


@pytest.mark.parametrize("modern", [False, True])
def test_the_request_line_is_the_json_encoders(modern: bool) -> None:
    async def main() -> None:
        lane, written = _lane()
        lane.negotiated("2026-07-28" if modern else "2025-11-25", {"name": "aggregator", "version": "1\u00e9"})
        for n, uri in enumerate(URIS, 1):
            reading = asyncio.ensure_future(lane.read(uri, 5.0))
            await asyncio.sleep(0)
            params: dict[str, Any] = {"uri": uri}
            if modern:
                params["_meta"] = lane._meta
            assert written[-1] == _expected(f"agg-{n}", params)
            assert lane.claims({"jsonrpc": "2.0", "id": f"agg-{n}", "result": {"contents": []}})
            assert await reading == {"contents": []}

    asyncio.run(main())


def test_reads_time_out_at_their_own_deadline_and_answered_ones_do_not() -> None:
    async def main() -> None:
        lane, written = _lane()
        lane.negotiated("2025-11-25", {"name": "aggregator", "version": "1"})
        started = time.monotonic()
        slow = asyncio.ensure_future(lane.read("a://slow", 0.3))
        answered = asyncio.ensure_future(lane.read("a://answered", 0.2))
        short = asyncio.ensure_future(lane.read("a://short", 0.1))  # a deadline before the one queued ahead of it
        untimed = asyncio.ensure_future(lane.read("a://untimed"))
        await asyncio.sleep(0)
        assert lane.claims({"jsonrpc": "2.0", "id": "agg-2", "result": {"contents": []}})
        assert await answered == {"contents": []}
        with pytest.raises(TimeoutError):
            await short
        assert 0.08 < time.monotonic() - started < 0.25
        with pytest.raises(TimeoutError):
            await slow
        assert 0.28 < time.monotonic() - started < 0.6
        assert not untimed.done()
        # Every read given up was cancelled upstream, the answered one was not.
        assert _cancelled(written) == {"agg-1": "timed out", "agg-3": "timed out"}
        lane.close()
        with pytest.raises(MCPError):
            await untimed

    asyncio.run(main())


def test_many_reads_answered_in_turn_leave_nothing_behind() -> None:
    async def main() -> None:
        lane, _ = _lane()
        lane.negotiated("2025-11-25", {"name": "aggregator", "version": "1"})
        for n in range(1, 101):
            reading = asyncio.ensure_future(lane.read("a://x", 30.0))
            await asyncio.sleep(0)
            assert lane.claims({"jsonrpc": "2.0", "id": f"agg-{n}", "result": {"contents": []}})
            await reading
        assert not lane._waiting
        assert len(getattr(lane, "_deadlines", ())) <= 1
        loop = asyncio.get_running_loop()
        assert len(loop._scheduled) <= 1  # type: ignore[attr-defined]  # one sweep, not a timer per read

    asyncio.run(main())


def test_a_read_whose_write_fails_leaves_no_timer_to_fire() -> None:
    async def main() -> None:
        async def broken(line: bytes) -> None:
            raise BrokenPipeError

        lane = Lane(broken)
        lane.negotiated("2025-11-25", {"name": "aggregator", "version": "1"})
        errors: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
        with pytest.raises(MCPError):
            await lane.read("a://x", 0.05)
        await asyncio.sleep(0.15)
        import gc

        gc.collect()
        await asyncio.sleep(0)
        assert errors == []

    asyncio.run(main())


def test_reads_answered_behind_one_that_hangs_are_not_kept_until_its_deadline() -> None:
    async def main() -> None:
        lane, _ = _lane()
        lane.negotiated("2025-11-25", {"name": "aggregator", "version": "1"})
        hanging = asyncio.ensure_future(lane.read("a://hangs", 30.0))
        for n in range(2, 1002):
            reading = asyncio.ensure_future(lane.read("a://x", 30.0))
            await asyncio.sleep(0)
            assert lane.claims({"jsonrpc": "2.0", "id": f"agg-{n}", "result": {"contents": []}})
            await reading
        assert len(lane._deadlines) <= 130
        hanging.cancel()

    asyncio.run(main())


class _Told(Sent):
    """A sent read that calls `call` with its outcome (a closure may hold it: as `Upstream.relay`'s reads do)."""

    __slots__ = ("call",)

    def __init__(self, call: Any) -> None:
        self.call = call

    def answered(self, outcome: object) -> None:
        call, self.call = self.call, None  # let go of the closure, as `Upstream.relay`'s reads do
        call(outcome)


def test_a_read_told_of_its_timeout_in_a_callback_leaves_the_next_deadline_in_place() -> None:
    """Relayed reads (`Lane.send`, a `Sent` told in place, which sweeps the lane where it is told, as
    `Upstream.relay`'s are): the first read's timeout sweeps the lane from inside the sweep. Each read still times
    out at its own deadline, and the sweep raises nothing (it popped the next read's deadline, or an empty deque).
    Each is forgotten (an answer that comes late is dropped) and cancelled upstream at once, as an awaited read is;
    one given up by its caller is too, for its own reason."""
    async def main() -> None:
        lane, written = _lane()
        lane.negotiated("2025-11-25", {"name": "aggregator", "version": "1"})
        loop = asyncio.get_running_loop()
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda loop, context: errors.append(context))
        started = loop.time()
        told: dict[str, tuple[float, object]] = {}

        def waiter(name: str) -> Sent:
            def call(outcome: object) -> None:
                told[name] = (loop.time() - started, outcome)
            return _Told(call)

        for name, timeout in (("first", 0.1), ("second", 0.3)):
            assert lane.send(f"a://{name}", waiter(name), timeout)
        await asyncio.sleep(0.6)
        assert set(told) == {"first", "second"}, told
        assert all(isinstance(outcome, TimeoutError) for _, outcome in told.values())
        assert 0.08 < told["first"][0] < 0.25 and 0.28 < told["second"][0] < 0.55, told
        assert errors == []
        assert not lane._waiting and _cancelled(written) == {"agg-1": "timed out", "agg-2": "timed out"}
        assert lane.claims({"jsonrpc": "2.0", "id": "agg-1", "result": {"contents": []}})  # late: dropped
        given_up = waiter("given up")
        assert lane.send("a://given-up", given_up, 30.0)
        given_up.give_up()
        assert not lane._waiting and _cancelled(written)["agg-3"] == "caller cancelled" and "given up" not in told

    asyncio.run(main())


def test_answered_relayed_reads_leave_nothing_to_the_cycle_collector() -> None:
    """A relayed read's closure holds the read (its give-up handle, as a caller of `Upstream.relay` keeps it), and
    the read holds the closure: once told, the read lets go of it, so the read's objects go when its last
    reference does, not at the next collection (about 57 objects a read through the gateway were left to it)."""
    def relay(lane: Lane) -> None:
        handle: list[Any] = []

        def answered(outcome: object) -> None:
            assert handle

        sent = _Told(answered)
        handle.append(sent.give_up)
        assert lane.send("a://x", sent, 30.0)

    async def main() -> None:
        lane, _ = _lane()
        lane.negotiated("2025-11-25", {"name": "aggregator", "version": "1"})
        gc.collect()
        gc.disable()
        try:
            for n in range(1, 51):
                relay(lane)
                assert lane.claims({"jsonrpc": "2.0", "id": f"agg-{n}", "result": {"contents": []}})
            assert gc.collect() == 0
        finally:
            gc.enable()

    asyncio.run(main())


@pytest.mark.parametrize("refusal", ["full", "broken"])
def test_a_sent_read_the_pipe_refuses_is_never_told_and_nothing_waits_for_it(refusal: str) -> None:
    """`send` puts what the answer needs in place before it writes (the write is its last step): a line the pipe
    does not take leaves nothing behind, no answer, no deadline and no cancellation upstream."""
    async def main() -> None:
        written: list[bytes] = []

        def write_now(line: bytes) -> bool:
            if refusal == "broken":
                raise BrokenPipeError
            return False

        async def write(line: bytes) -> None:
            written.append(line)

        lane = Lane(write, write_now)
        lane.negotiated("2025-11-25", {"name": "aggregator", "version": "1"})
        told: list[object] = []
        errors: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
        for _ in range(3):
            sent = _Told(told.append)
            assert not lane.send("a://x", sent, 0.05)
        assert not lane._waiting
        await asyncio.sleep(0.15)
        assert lane.claims({"jsonrpc": "2.0", "id": "agg-1", "result": {"contents": []}})
        assert told == [] and written == [] and errors == []

    asyncio.run(main())
