"""stdin as a terminal (`aggregator serve` run by hand): its lines read by the event loop, not by a worker thread.

A thread blocked reading a terminal cannot be interrupted, so a stop (Ctrl-C, SIGTERM) would wait for the next
Enter or Ctrl-D: the loop's executor threads are joined on the way out. The loop instead waits until the terminal
has input and reads only then, so ending the reading is removing the fd from the loop. The fd stays blocking: the
terminal's file description is the shell's too, and one left non-blocking (by a crash) breaks the shell's reads.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, BinaryIO

__all__ = ["TerminalLines", "terminal_lines"]

CHUNK = 64 * 1024
"""Bytes at most per read: more than a terminal line holds (4096 in canonical mode)."""


class TerminalLines(asyncio.ReadTransport):
    """Feeds `reader` with what the terminal on `fd` delivers, read when the event loop sees input waiting (so the
    read does not block: nobody else reads this private duplicate). `close()` ends the reading; the reader then sees
    end of input. Paused by the reader while it holds more than twice its limit unread."""

    def __init__(self, fd: int, reader: asyncio.StreamReader, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._fd, self._reader, self._loop = fd, reader, loop
        self._closed = self._paused = False
        loop.add_reader(fd, self._readable)  # first: NotImplementedError where the loop cannot (Windows' proactor)
        reader.set_transport(self)

    def _readable(self) -> None:
        try:
            data = os.read(self._fd, CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # EIO: the terminal hung up (its window closed), which ends its input as Ctrl-D does
            data = b""
        if data:
            self._reader.feed_data(data)  # looked up each time: FastReads.tap may have replaced it
        else:
            self.close()

    def pause_reading(self) -> None:
        if not self._closed and not self._paused:
            self._paused = True
            self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if not self._closed and self._paused:
            self._paused = False
            self._loop.add_reader(self._fd, self._readable)

    def is_reading(self) -> bool:
        return not self._closed and not self._paused

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self._fd)
            self._reader.feed_eof()

    def is_closing(self) -> bool:
        return self._closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def terminal_lines(stream: BinaryIO, limit: int) -> tuple[asyncio.StreamReader, TerminalLines] | None:
    """Lines of `stream` (lines up to `limit` bytes) read by the running loop, and the transport whose `close` ends
    them; None when `stream` is not a terminal or the loop cannot wait on one."""
    try:
        fd = stream.fileno()
        if not os.isatty(fd):
            return None
    except (AttributeError, OSError, ValueError):
        return None
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    try:
        return reader, TerminalLines(fd, reader, loop)
    except NotImplementedError:
        return None
