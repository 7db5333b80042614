"""stdout for commands whose reader may stop early: `aggregator list M | head` ends quietly, with its own exit code."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["tolerate_reader_leaving"]


class _UntilReaderLeaves:
    """A stream (text, or its `.buffer`) whose writes, once the reader has closed the pipe, go nowhere instead of
    raising BrokenPipeError: the command finishes normally, and nothing is left to fail at interpreter exit."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._stream, name)
        return _UntilReaderLeaves(attribute) if name == "buffer" else attribute

    def write(self, data: Any) -> int:
        try:
            return self._stream.write(data)
        except BrokenPipeError:
            self._discard()
            return len(data)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._discard()

    def _discard(self) -> None:
        # Point the descriptor at /dev/null rather than closing it: what is still buffered (here or in the text
        # layer above) then flushes without error, now and when Python flushes stdout on the way out.
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)
        try:
            self._stream.flush()
        except (OSError, ValueError):  # what could not be flushed is what nobody is reading
            pass


def tolerate_reader_leaving() -> None:
    """Make sys.stdout drop its output, rather than raise, once its reader has gone (a closed pipe).

    Not for `serve`: there stdout is the protocol, and a client that left is the SDK's to notice."""
    if not isinstance(sys.stdout, _UntilReaderLeaves):
        sys.stdout = _UntilReaderLeaves(sys.stdout)
