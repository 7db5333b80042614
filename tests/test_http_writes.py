"""A response's head leaves with its first body part in one write, or at the end of the loop's iteration when the
app does not follow it at once; order is kept and close writes what is held (a real server answering through it:
test_sdk_compat, test_http_limits)."""

from __future__ import annotations

import asyncio
from typing import Any

from aggregator.http_writes import CoalescedWrites


class Recording(asyncio.Transport):
    """A transport that keeps what is written to it."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def test_head_and_body_leave_in_one_write() -> None:
    async def main() -> list[bytes]:
        real = Recording()
        cycle = CoalescedWrites(real, asyncio.get_running_loop())
        cycle.write(b"HTTP/1.1 200 OK\r\n\r\n")
        cycle.write(b"body")
        cycle.write(b"more")
        await asyncio.sleep(0)
        return real.writes

    assert asyncio.run(main()) == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"more"]


def test_a_head_not_followed_at_once_leaves_at_the_end_of_the_iteration() -> None:
    async def main() -> tuple[list[bytes], list[bytes]]:
        real = Recording()
        cycle = CoalescedWrites(real, asyncio.get_running_loop())
        cycle.write(b"HTTP/1.1 200 OK\r\n\r\n")
        before = list(real.writes)
        await asyncio.sleep(0)
        cycle.write(b"event")
        return before, real.writes

    assert asyncio.run(main()) == ([], [b"HTTP/1.1 200 OK\r\n\r\n", b"event"])


def test_close_writes_what_is_held_first() -> None:
    async def main() -> Recording:
        real = Recording()
        cycle = CoalescedWrites(real, asyncio.get_running_loop())
        cycle.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        cycle.close()
        await asyncio.sleep(0)
        return real

    real = asyncio.run(main())
    assert real.writes == [b"HTTP/1.1 204 No Content\r\n\r\n"] and real.closed
