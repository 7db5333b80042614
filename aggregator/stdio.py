"""Serving over stdio so that every line gets its answer: the SDK's stdio transport with two gaps closed.

A line that is not JSON gets a JSON-RPC -32700 error (id null) and one that is JSON but not a JSON-RPC message
-32600, where the SDK drops both silently. When stdin closes (a script piping requests in), the requests already
read are finished and their responses written before the server stops, for at most `DRAIN_TIMEOUT` seconds;
the SDK would cancel them on end of input, and the last answers were lost. SIGTERM and SIGINT end the input as its
end would (reading stops, what was read is answered); one heard before serving began means not serving at all, and a
second one ends the wait for what was read (those requests are not answered; every line written is whole).

The server reads and writes the wire itself, with no task in between: its read loop reads the next line (a read
the fast path serves is taken before, where the pipe delivers it: `FastReads.tap`), and a handler's response is
written by the handler's own `send`. Pipes and sockets (what an MCP client spawns us with)
are read and written without blocking on the event loop, and a terminal is read when the loop sees input there
(aggregator.stdio_terminal: a stop does not wait for the next Enter); anything else (a regular file) through a
worker thread, as the SDK does for every line. Like the SDK, fds 0 and 1 point elsewhere while serving (stray
output of handlers and children misses the wire) and are restored on exit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

import anyio
import mcp_types as types

from mcp.server.models import InitializationOptions
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from aggregator.sdk_compat import claim_stdin, claim_stdout  # the SDK's own claim of fd 0 and 1 (private in 2.3)
from aggregator.stdio_fast import FastReads, fast_reads_for
from aggregator.stdio_terminal import terminal_lines
from aggregator.stopping import stop_signals

if TYPE_CHECKING:
    from aggregator.stopping import Stop

__all__ = ["DRAIN_TIMEOUT", "serve_stdio"]

logger = logging.getLogger("aggregator.stdio")

DRAIN_TIMEOUT = 30.0
"""Seconds requests read before stdin closed may take to finish: the default source timeout, so a read that
would succeed is not cut short."""

MAX_LINE = 16 * 1024 * 1024
"""Bytes at most in one line read from a pipe; the loop stops reading stdin while twice that is unread."""

# Requests whose response is a stream that lasts until the connection ends: waiting for them would only wait.
_OPEN_ENDED = frozenset({"subscriptions/listen"})


class _Unanswered:
    """Ids of requests read but not answered yet; `settled()` waits until there are none. The event it waits on is
    made only for that wait (at end of input), not each time a read makes the set non-empty."""

    def __init__(self) -> None:
        self.ids: set[types.RequestId] = set()
        self._none: anyio.Event | None = None
        self.gone = False

    def add(self, request_id: types.RequestId) -> None:
        if not self.gone:
            self.ids.add(request_id)

    def discard(self, request_id: Any) -> None:
        ids = self.ids
        ids.discard(request_id)
        if not ids and self._none is not None:
            self._settle()

    def abandon(self) -> None:
        """Nobody can read answers any more (stdout broke): there is nothing left to wait for."""
        self.gone = True
        self.ids.clear()
        self._settle()

    async def settled(self) -> None:
        """Return once every request read is answered (or abandoned)."""
        while self.ids:
            if self._none is None:
                self._none = anyio.Event()
            await self._none.wait()

    def _settle(self) -> None:
        none, self._none = self._none, None
        if none is not None:
            none.set()


class _Ending:
    """A stop of stdio serving (SIGTERM/SIGINT): `stopped`, and stdin's reading ended by `close` (the pipe's
    transport, so a read blocked on it sees end of input), whichever of the two comes first; `forced` (a second
    stop), and the wait for the requests read (`drains`) cancelled."""

    def __init__(self) -> None:
        self.stopped = self.forced = False
        self._close: Callable[[], None] | None = None
        self._drain: anyio.CancelScope | None = None

    def stop(self) -> None:
        self.stopped = True
        if self._close is not None:
            self._close()

    def force(self) -> None:
        self.forced = True
        self.stop()
        if self._drain is not None:
            self._drain.cancel()

    def drains(self, scope: anyio.CancelScope) -> None:
        """`scope` waits for the requests read: cancelled by a forced stop, at once if one came already."""
        self._drain = scope
        if self.forced:
            scope.cancel()

    def closes(self, close: Callable[[], None] | None) -> None:
        self._close = close
        if self.stopped and close is not None:
            close()


class _Lines(Protocol):
    async def readline(self) -> bytes: ...


class _Bytes(Protocol):
    async def write(self, data: bytes) -> None: ...


async def serve_stdio(server: Any, options: InitializationOptions, *, drain_timeout: float = DRAIN_TIMEOUT,
                      stop: Stop | None = None, ready: Callable[[], None] = lambda: None) -> None:
    """Run `server` on stdin/stdout until stdin closes or SIGTERM/SIGINT comes, and the requests read by then are
    answered (or `drain_timeout` passes); not at all when `stop` heard one already, else `ready()` once a stop is
    heard as one of a server in service. Each message is written out whole before its `send` returns."""
    ending = _Ending()
    async with anyio.create_task_group() as tg:
        await tg.start(partial(stop_signals, ready=ready), stop, ending.stop, ending.force)
        if not ending.stopped:
            await _serve(server, options, drain_timeout, ending)
        tg.cancel_scope.cancel()


async def _serve(server: Any, options: InitializationOptions, drain_timeout: float, ending: _Ending) -> None:
    stdin, release_stdin = claim_stdin()
    try:
        stdout, release_stdout = claim_stdout()
        try:
            async with _line_reader(stdin) as (lines, close), _byte_writer(stdout) as out:
                ending.closes(close)
                unanswered = _Unanswered()
                fast = fast_reads_for(server)
                to_wire = _WireOut(out, unanswered, fast)
                if fast is not None and isinstance(lines, asyncio.StreamReader):
                    # Reads taken where stdin delivers them, relayed ones answered where their answer arrives.
                    fast.tap(lines, to_wire.answer, unanswered.add, to_wire)
                try:
                    await server.run(_WireIn(lines, to_wire, unanswered, drain_timeout, fast, ending), to_wire,
                                     options)
                finally:
                    for task in list(fast.tasks.values()) if fast is not None else ():
                        task.cancel()  # reads still going when the server stops: nobody is left to answer
        finally:
            if release_stdout is not None:
                release_stdout()
    finally:
        if release_stdin is not None:
            release_stdin()


class _WireIn:
    """The server's read stream: the next decodable message on stdin; undecodable lines are answered here. At end
    of input, or once `ending` is stopped, it returns only when what was asked is answered (or the drain timeout
    passes)."""

    def __init__(self, lines: _Lines, out: _WireOut, unanswered: _Unanswered, drain_timeout: float,
                 fast: FastReads | None = None, ending: _Ending | None = None) -> None:
        self._lines, self._out, self._unanswered, self._drain_timeout = lines, out, unanswered, drain_timeout
        self._fast, self._ending = fast, ending
        self._ended = False

    async def receive(self) -> SessionMessage:
        while not self._ended:
            try:
                line = await self._lines.readline()
            except ValueError:  # longer than MAX_LINE: the reader dropped it
                logger.warning("a line on stdin longer than %d bytes was dropped", MAX_LINE)
                await self._answer(_parse_error())
                continue
            if not line or (self._ending is not None and self._ending.stopped):  # lines still buffered: not taken
                self._ended = True
                await self._drain()
                break
            if self._fast is not None:
                taken = self._fast.take(line, self._out.answer)
                if taken is not None:
                    self._unanswered.add(taken)
                    continue
            text = line.decode("utf-8", errors="replace")
            try:
                message = types.jsonrpc_message_adapter.validate_json(text, by_name=False)
            except Exception as exc:
                error = unreadable_line_error(exc)
                if error is not None:
                    await self._answer(error)
                continue
            if isinstance(message, types.JSONRPCRequest) and message.method not in _OPEN_ENDED:
                self._unanswered.add(message.id)
            elif isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
                # A cancelled request is never answered.
                self._unanswered.discard((message.params or {}).get("requestId"))
            if self._fast is not None:
                self._fast.saw(message)
            return SessionMessage(message)
        raise anyio.EndOfStream

    async def _answer(self, error: types.JSONRPCError) -> None:
        try:
            await self._out.send(SessionMessage(error))
        except anyio.BrokenResourceError:
            pass  # the client stopped reading: the requests still coming are read, and drained, all the same

    async def _drain(self) -> None:
        with anyio.move_on_after(self._drain_timeout) as waited:
            if self._ending is not None:
                self._ending.drains(waited)
            await self._unanswered.settled()
        if not waited.cancelled_caught:
            return
        if self._ending is not None and self._ending.forced:
            logger.warning("stopped before %d requests read were answered; they are cancelled",
                           len(self._unanswered.ids))
        else:
            logger.warning("stdin closed; %d requests still unanswered after %.0f s are cancelled",
                           len(self._unanswered.ids), self._drain_timeout)

    def __aiter__(self) -> _WireIn:
        return self

    async def __anext__(self) -> SessionMessage:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._ended = True

    async def __aenter__(self) -> _WireIn:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


def _line(request_id: types.RequestId, data: bytes | None, error: types.ErrorData | None) -> bytes:
    """An answer's line: `data` as encoded, or the error response for `error`."""
    if data is not None:
        return data
    return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error or types.ErrorData(
        code=types.INTERNAL_ERROR, message="Internal error")).model_dump_json(
        by_alias=True, exclude_unset=True).encode("utf-8") + b"\n"


class _WireOut:
    """The server's write stream: each message one JSON line on stdout, written by the task that sends it."""

    def __init__(self, out: _Bytes, unanswered: _Unanswered, fast: FastReads | None = None) -> None:
        self._out, self._unanswered, self._fast = out, unanswered, fast
        self._closed = False

    async def send(self, item: SessionMessage) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        data = item.message.model_dump_json(by_alias=True, exclude_unset=True).encode("utf-8") + b"\n"
        await self._write(data)
        if isinstance(item.message, types.JSONRPCResponse | types.JSONRPCError):
            if self._fast is not None:
                self._fast.answered(item.message)
            self._unanswered.discard(item.message.id)

    async def answer(self, request_id: types.RequestId, data: bytes | None, error: types.ErrorData | None) -> None:
        """A fast-path answer: the encoded response line, or the error response for `error`; dropped, as the
        SDK drops it, when the client no longer reads."""
        try:
            if self._closed:
                raise anyio.ClosedResourceError
            await self._write(_line(request_id, data, error))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            logger.debug("dropped the answer to %r: stdout closed", request_id)
            return
        self._unanswered.discard(request_id)

    def ready(self) -> bool:
        """Whether `answer_now` may write (stdout is a pipe, open, not full)."""
        out = self._out
        return not self._closed and isinstance(out, _PipeWriter) and out.ready()

    def answer_now(self, request_id: types.RequestId, data: bytes | None, error: types.ErrorData | None) -> None:
        """`answer` written at once, outside any task (a read relayed in callbacks): what the pipe cannot take yet it
        buffers (such reads start only while it is `ready`, and at most a lane's worth are out at a time)."""
        out = self._out
        if self._closed or not isinstance(out, _PipeWriter) or not out.write_now(
                data if data is not None else _line(request_id, data, error)):
            logger.debug("dropped the answer to %r: stdout closed", request_id)
            return
        self._unanswered.discard(request_id)

    async def _write(self, data: bytes) -> None:
        try:
            await self._out.write(data)
        except OSError as exc:  # the client closed its end
            self._unanswered.abandon()
            raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        self._closed = True

    async def __aenter__(self) -> _WireOut:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


def _pipe_fd(stream: BinaryIO) -> int | None:
    """The fd behind `stream` if it is a pipe or a socket (which the event loop can wait on), else None."""
    try:
        fd = stream.fileno()
        return fd if stat.S_ISFIFO(mode := os.fstat(fd).st_mode) or stat.S_ISSOCK(mode) else None
    except (AttributeError, OSError, ValueError):
        return None


@asynccontextmanager
async def _line_reader(stream: BinaryIO) -> AsyncIterator[tuple[_Lines, Callable[[], None] | None]]:
    """Lines of `stream`, and what ends their reading early (None: nothing can): from the event loop for a pipe or a
    terminal, else from a worker thread (a regular file's read does not wait)."""
    fd = _pipe_fd(stream)
    if fd is None:
        terminal = terminal_lines(stream, MAX_LINE)
        if terminal is None:
            yield anyio.wrap_file(stream), None
            return
        try:
            yield terminal[0], terminal[1].close
        finally:
            terminal[1].close()
        return
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE, loop=loop)
    # A duplicate for the transport to own and close; the claimed fd is restored onto fd 0 afterwards.
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
                                                os.fdopen(os.dup(fd), "rb", buffering=0))
    try:
        yield reader, transport.close  # closed, the pipe's reader sees end of input and the fast path takes no more
    finally:
        transport.close()
        _set_blocking(fd)


@asynccontextmanager
async def _byte_writer(stream: BinaryIO) -> AsyncIterator[_Bytes]:
    """Writes to `stream`, each done when its bytes are all out: from the event loop for a pipe, else from a
    worker thread."""
    fd = _pipe_fd(stream)
    if fd is None:
        yield _ThreadWriter(stream)
        return
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(_Flow, os.fdopen(os.dup(fd), "wb", buffering=0))
    transport.set_write_buffer_limits(high=0)  # paused while anything is buffered: a write waits until it is out
    try:
        yield _PipeWriter(transport, protocol)
    finally:
        transport.close()
        _set_blocking(fd)


def _set_blocking(fd: int) -> None:
    # The transport made the shared file description non-blocking; whoever gets fd 0/1 back expects blocking.
    try:
        os.set_blocking(fd, True)
    except OSError:
        pass


class _Flow(asyncio.Protocol):
    """Flow control of a write pipe: `wait` returns once the transport's buffer is empty."""

    def __init__(self) -> None:
        self._resumed: asyncio.Event | None = None
        self._lost: Exception | None = None

    def pause_writing(self) -> None:
        self._resumed = asyncio.Event()

    def resume_writing(self) -> None:
        if self._resumed is not None:
            self._resumed.set()
            self._resumed = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = exc or BrokenPipeError("stdout closed")
        self.resume_writing()

    def open(self) -> bool:
        """Whether a write now goes out without waiting: not paused, not lost."""
        return self._resumed is None and self._lost is None

    async def wait(self) -> None:
        while self._resumed is not None:
            await self._resumed.wait()
        if self._lost is not None:
            raise self._lost


class _PipeWriter:
    def __init__(self, transport: asyncio.WriteTransport, flow: _Flow) -> None:
        self._transport, self._flow = transport, flow

    def ready(self) -> bool:
        return not self._transport.is_closing() and self._flow.open()

    def write_now(self, data: bytes) -> bool:
        """Write `data` whole without waiting; False when stdout is closed."""
        if self._transport.is_closing():
            return False
        self._transport.write(data)
        return True

    async def write(self, data: bytes) -> None:
        if self._transport.is_closing():
            raise BrokenPipeError("stdout closed")
        self._transport.write(data)  # whole, in order: concurrent senders never interleave
        await self._flow.wait()


class _ThreadWriter:
    def __init__(self, stream: BinaryIO) -> None:
        self._stream, self._lock = stream, anyio.Lock()

    def _write(self, data: bytes) -> None:
        self._stream.write(data)
        self._stream.flush()

    async def write(self, data: bytes) -> None:
        async with self._lock:  # one message at a time, in the order sent
            await anyio.to_thread.run_sync(self._write, data)


def unreadable_line_error(exc: Exception) -> types.JSONRPCError | None:
    """The JSON-RPC error answering a line the SDK could not decode: -32700 for text that is not JSON, -32600
    (with the line's id when it has one) for JSON that is not a JSON-RPC message; None for a blank line."""
    if not isinstance(exc, ValidationError):
        logger.warning("unreadable input on stdin: %s", exc)
        return None
    errors = exc.errors()
    if errors and errors[0]["type"] == "json_invalid":
        raw = errors[0].get("input")
        if isinstance(raw, str) and not raw.strip():
            return None
        return _parse_error()
    request_id = next((_id_of(e.get("input")) for e in errors if isinstance(e.get("input"), dict)), None)
    return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(
        code=types.INVALID_REQUEST, message="Invalid Request: not a JSON-RPC 2.0 request, notification or response"))


def _parse_error() -> types.JSONRPCError:
    return types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(
        code=types.PARSE_ERROR, message="Parse error: the line is not JSON"))


def _id_of(data: dict[str, Any]) -> types.RequestId | None:
    request_id = data.get("id")
    return request_id if isinstance(request_id, str | int) and not isinstance(request_id, bool) else None
