"""A stdio client transport for an upstream we do not trust: bounded lines, stderr to our log, the child's tree killed.

Like the SDK's `stdio_client` (newline-delimited JSON-RPC on the child's stdin/stdout, the spec's shutdown: close
stdin, wait, then signal the process group), with what an aggregator needs on top: a message longer than
`max_line` bytes is skipped as it streams instead of growing a buffer without end, and fails the call it answered
(`oversized`; one that answers no call we can tell ends the connection, and `on_lost` is told why); a message is
parsed by `codec.loads` (orjson), then validated (pydantic's own JSON parsing of a 61 MB page peaked about four times
higher); the child's stderr is read here and logged line by line (escaped, cut at `STDERR_LINE_CHARS`, at most
`STDERR_LINES_PER_MINUTE`), never inherited raw.
POSIX only (a process group per child).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import ByteReceiveStream, Process
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from aggregator.upstream.failures import too_big
from aggregator.upstream.lane import Lane, parsed
from aggregator.upstream.oversized import MISSING, Oversized, answered_id, lines
from aggregator.upstream.tap import tap

__all__ = ["bounded_stdio"]

logger = logging.getLogger("aggregator.upstream")

STDERR_LINE_CHARS = 500
STDERR_LINES_PER_MINUTE = 120
EXIT_GRACE_S = 2.0
"""How long a child may take to exit once its stdin is closed, and again after SIGTERM."""


@asynccontextmanager
async def bounded_stdio(command: Sequence[str], env: Mapping[str, str], cwd: str | None, name: str,
                        max_line: int, on_lost: Callable[[str], None] | None = None
                        ) -> AsyncIterator[tuple[Any, Any, Lane]]:
    """Start `command` (its environment: the SDK's minimal one plus `env`) and yield the session's streams and the
    reads' lane beside them (`lane.Lane`); `on_lost(reason)` hears of a message over `max_line` bytes before the
    stream ends for it."""
    if sys.platform == "win32":  # pragma: no cover
        raise OSError("mcp+stdio upstreams need a POSIX system")
    process = await anyio.open_process(list(command), env=get_default_environment() | dict(env), cwd=cwd,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       start_new_session=True)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writing = anyio.Lock()  # one whole line at a time, the SDK's or the lane's

    async def send(data: bytes) -> None:
        assert process.stdin is not None
        async with writing:
            await process.stdin.send(data)

    stream = getattr(process.stdin, "_stream", None)  # anyio's wrapper of asyncio's StreamWriter
    pipe = stream.transport if isinstance(stream, asyncio.StreamWriter) else None  # what its `write` writes to

    def write_now(data: bytes) -> bool:
        """Write a whole line at once when nothing waits to be written (the pipe holds nothing unsent, no `send` is
        under way); False (nothing written) otherwise. BrokenPipeError when the pipe is gone."""
        if pipe is None or writing.locked():
            return False
        if pipe.is_closing():
            raise BrokenPipeError("the child's stdin is closed")
        if pipe.get_write_buffer_size():
            return False
        pipe.write(data)
        if pipe.is_closing():  # the write failed: asyncio closed the pipe
            raise BrokenPipeError("the child's stdin is closed")
        return True

    lane = Lane(send, write_now)
    # Lane answers claimed as the pipe delivers them (`tap`); else the stream is read line by line as before.
    stdout = tap(process, max_line, lane)

    async def stdout_reader() -> None:
        assert process.stdout is not None
        told = False  # whether the call answered by the line being skipped was failed already
        async with read_writer:
            try:
                async for line in stdout if stdout is not None else lines(process.stdout, max_line):
                    if isinstance(line, Oversized):
                        if not told and (request_id := answered_id(line.head, line.tail)) is not MISSING:
                            told = True
                            logger.warning("upstream %s: an answer over %s bytes (maxMessageBytes) skipped; the "
                                           "call it answers fails", name, f"{max_line:,}")
                            await _deliver(_refusal(request_id, too_big(max_line)), lane, read_writer)
                        if line.tail is None:  # still being skipped: its end is told next
                            continue
                        answered, told = told, False
                        if answered:
                            continue
                        line = None  # ended, and it answers no call we can tell
                    if line is None:
                        logger.warning("upstream %s: a message over %s bytes (maxMessageBytes) that names no "
                                       "call, or does not end; closing the connection", name, f"{max_line:,}")
                        if on_lost is not None:
                            on_lost(too_big(max_line))
                        return
                    if line.strip():
                        message = _parse(line, lane)
                        if message is not None:
                            await read_writer.send(message)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                return  # the session is gone, or the pipe broke: the stream ends either way
            finally:
                lane.close()

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await send(data.encode("utf-8"))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The child stopped reading: end the session's stream rather than leave a request waiting.
            await read_writer.aclose()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        tg.start_soon(_log_stderr, process, name)
        try:
            yield read_stream, write_stream, lane
        finally:
            lane.close()
            with anyio.CancelScope(shield=True):
                await write_stream.aclose()
                await _stop(process)
                await read_stream.aclose()
            tg.cancel_scope.cancel()


async def _lines(stream: ByteReceiveStream, limit: int) -> AsyncIterator[bytes]:
    """Lines of `stream` (without the newline), each cut at `limit` bytes (the rest of a longer one is skipped)."""
    buffer = bytearray()
    scanned = 0
    skipping = False
    while True:
        try:
            chunk = await stream.receive()
        except anyio.EndOfStream:
            if buffer and not skipping:
                yield bytes(buffer)
            return
        buffer += chunk
        while (newline := buffer.find(b"\n", scanned)) >= 0:
            if not skipping:
                yield bytes(buffer[:min(newline, limit)])
            skipping = False
            del buffer[:newline + 1]
            scanned = 0
        scanned = len(buffer)
        if scanned > limit:
            if not skipping:
                yield bytes(buffer[:limit])
            skipping = True
            buffer.clear()
            scanned = 0


def _refusal(request_id: object, reason: str) -> dict[str, Any]:
    """The error answer a call gets in place of the one it was sent (as the upstream would have answered it)."""
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": types.INTERNAL_ERROR, "message": reason}}


async def _deliver(message: dict[str, Any], lane: Lane, read_writer: Any) -> None:
    """Hand a message we made to whichever waits for it: the read lane or the SDK's session."""
    if not lane.claims(message):
        await read_writer.send(SessionMessage(types.jsonrpc_message_adapter.validate_python(message, by_name=False)))


def _parse(line: bytes, lane: Lane) -> SessionMessage | Exception | None:
    """One message for the session, None for the lane's, or the error the session reports for a line that is not
    one."""
    try:
        message = parsed(line)
        if lane.claims(message):
            return None
        return SessionMessage(types.jsonrpc_message_adapter.validate_python(message, by_name=False))
    except (ValueError, RecursionError) as exc:
        return exc


async def _log_stderr(process: Process, name: str) -> None:
    """Log the child's stderr a line at a time (cut, escaped, rate limited); overlong lines are not buffered."""
    assert process.stderr is not None
    window, logged, dropped = anyio.current_time(), 0, 0
    try:
        async for line in _lines(process.stderr, STDERR_LINE_CHARS * 4):
            now = anyio.current_time()
            if now - window >= 60:
                if dropped:
                    logger.warning("upstream %s: %d stderr lines not logged (rate limit)", name, dropped)
                window, logged, dropped = now, 0, 0
            if logged >= STDERR_LINES_PER_MINUTE:
                dropped += 1
                continue
            logged += 1
            text = line.decode("utf-8", "replace").rstrip("\r")
            cut = text[:STDERR_LINE_CHARS] + ("..." if len(text) > STDERR_LINE_CHARS else "")
            logger.info("upstream %s stderr: %s", name, cut.encode("unicode_escape").decode("ascii"))
    except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        return


async def _stop(process: Process) -> None:
    """Close stdin, give the child EXIT_GRACE_S to exit, then end its whole process group."""
    assert process.stdin is not None
    try:
        await process.stdin.aclose()
    except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass
    if not await _exited(process, EXIT_GRACE_S):
        await terminate_posix_process_tree(process, EXIT_GRACE_S)
        await _exited(process, EXIT_GRACE_S)
    with anyio.move_on_after(EXIT_GRACE_S):
        try:
            await process.aclose()  # closes the pipes and reaps the child
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
    # A grandchild that kept a pipe open keeps asyncio's transport open too (it warns at collection): close it.
    transport = getattr(getattr(process, "_process", None), "_transport", None)
    if transport is not None and callable(getattr(transport, "close", None)):
        try:
            transport.close()
        except PermissionError:  # re-killing a setuid child on <= 3.12
            pass


async def _exited(process: Process, timeout: float) -> bool:
    # Polling returncode, not wait(): wait() also waits for the pipes, which a grandchild may hold open.
    with anyio.move_on_after(timeout):
        while process.returncode is None:
            await anyio.sleep(0.01)
        return True
    return False
