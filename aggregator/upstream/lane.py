"""A lean lane for `resources/read` (and `resources/list` pages) on a stdio upstream: the request written straight
to the child's stdin and its answer taken off stdout before the SDK's session sees it, beside the SDK's own traffic
on the same pipe. A listing page's answer is handed over as the wire's dict (`pages.resource_page` checks it), its
memory not multiplied by the SDK's models.

Through the SDK's client a read cost the gateway about five times a bare JSON-RPC exchange (request and result
models, the dispatcher's span, memory streams and the writer task between them; benchmarks/upstream_hop.py), most
of a hop. The lane's ids are strings (`agg-N`) the SDK never mints (its ids are integers), so the two never claim
each other's answers. An error answer becomes the `MCPError` the SDK would raise, a result is handed over as the
wire's dict (the caller checks it: `answers.read_answer`, else the SDK's result model), and a connection that ends fails every read waiting (CONNECTION_CLOSED,
as the SDK's), so `Upstream._call`'s retry and error mapping apply unchanged. A read given up (timeout,
cancellation, awaited or sent) is forgotten and cancelled upstream with `notifications/cancelled` (its id and a
reason), as the SDK does.

A read costs no task hop of its own: the line is written at once when the pipe holds nothing unsent (`write_now`;
else it waits its turn behind the SDK's writes), and its answer comes through a future the reader resolves, which a
`timeout` given to `read` fails in place of a cancel scope.

On the modern wire each request carries the envelope the SDK's client stamps (`_meta`: protocol version, client
info, capabilities), built from what the handshake negotiated. With tracing on, reads keep the SDK's client (its span
and the trace context it sends upstream): `Upstream.read` decides.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import deque
from collections.abc import Awaitable, Callable
from json.encoder import encode_basestring  # the C one json.dumps uses (ensure_ascii=False)
from typing import Any, Protocol

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from aggregator.codec import loads, loads_strict

__all__ = ["ID_MARK", "Lane", "LooseResult", "Sent", "Waiter", "parsed", "result_of"]

_PREFIX = "agg-"
ID_MARK = f'"{_PREFIX}'.encode()
"""Bytes every line answering a lane read holds (its id's start): a line without them is not parsed for the lane."""
_READ_HEAD = f'{{"jsonrpc":"2.0","id":"{_PREFIX}'.encode()
_KEPT_DONE = 64
"""Deadlines of reads already over that may wait behind one still waiting before they are swept out."""
_SWEPT_PAST = 16
"""Deadlines queued past which an answered read sweeps the queue (fewer wait for the next answer over this many)."""
_TIMED_OUT = "timed out"
_CANCELLED = "caller cancelled"
"""Why a read given up is cancelled upstream: past its deadline, or its caller gave it up (the SDK's words)."""
_CLIENT_CAPABILITIES: dict[str, Any] = {}
"""What our client declares (no roots, sampling or elicitation): the SDK's client with no callbacks says the same."""


class Lane:
    """Reads over one stdio connection, sharing its pipe with the SDK's session (`write` is the pipe's writer, which
    serializes whole lines with the SDK's own writes; `write_now` writes a whole line at once and says whether it
    could, without waiting)."""

    def __init__(self, write: Callable[[bytes], Awaitable[None]],
                 write_now: Callable[[bytes], bool] | None = None) -> None:
        self._write = write
        self._write_now = write_now
        self._ids = itertools.count(1)
        self._waiting: dict[str, Waiter] = {}
        self._closed = False
        self._meta: dict[str, Any] | None = None
        self._tail = "}}\n"
        """What follows the URI in a request line: the modern wire's envelope, encoded once."""
        self._deadlines: deque[tuple[float, Waiter]] = deque()
        """Reads waiting with a timeout, by deadline (one timeout per lane: later reads, later deadlines)."""
        self._sweep: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop `send` runs in, once known."""
        self._enveloped: set[str] = set()
        """Requests whose answer is taken only with a valid JSON-RPC envelope (listings)."""
        self._telling: set[asyncio.Task[None]] = set()
        """Cancellations of given-up reads on their way upstream."""
        self.ready = False
        """Whether reads may take the lane: set once the handshake is known (`negotiated`)."""
        self.modern = False
        """Whether the modern wire was negotiated (its results carry caching hints)."""
        self.answer_line = b""
        """The line of the answer `claims` is delivering, while it delivers it (b"": none, or not known)."""

    @property
    def listing(self) -> bool:
        """Whether a listing page is awaited (its answer may be a line of megabytes)."""
        return bool(self._enveloped)

    def negotiated(self, protocol_version: str | None, client_info: dict[str, Any]) -> None:
        """The handshake's outcome: the modern wire's envelope, or none on the legacy wire."""
        if protocol_version is None:
            return
        if protocol_version in MODERN_PROTOCOL_VERSIONS:
            self._meta = {"io.modelcontextprotocol/protocolVersion": protocol_version,
                          "io.modelcontextprotocol/clientInfo": client_info,
                          "io.modelcontextprotocol/clientCapabilities": _CLIENT_CAPABILITIES}
            self._tail = ',"_meta":' + json.dumps(self._meta, separators=(",", ":"), ensure_ascii=False) + "}}\n"
            self.modern = True
        self.ready = True

    def claims(self, message: object, line: bytes = b"") -> bool:
        """Whether `message` (a parsed line from stdout: `line`, where known) answers one of the lane's reads; if so it
        is delivered."""
        if not isinstance(message, dict):
            return False
        request_id = message.get("id")
        if not isinstance(request_id, str) or not request_id.startswith(_PREFIX) or "method" in message:
            return False
        if request_id in self._enveloped and (message := _answer_of(message)) is None:
            return True  # not a JSON-RPC answer: the SDK's session drops it too
        waiting = self._waiting.pop(request_id, None)
        if waiting is not None and not waiting.done():  # an answer to a read given up is dropped
            self.answer_line = line
            try:
                waiting.set_result(message)
            finally:
                self.answer_line = b""
        return True

    def close(self) -> None:
        """The connection ended: every read waiting fails as the SDK's do (CONNECTION_CLOSED)."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        self._deadlines.clear()
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_result(None)
        self._waiting.clear()

    async def read(self, uri: str, timeout: float | None = None) -> dict[str, Any]:
        """The upstream's result for `resources/read` of `uri` (a complete one, as the wire gave it); MCPError for an
        error answer or a connection that ended, TimeoutError past `timeout` seconds (None: the caller bounds it)."""
        return result_of(await self.ask(uri, timeout))

    async def ask(self, uri: str, timeout: float | None = None) -> dict[str, Any] | None:
        """`read`'s answer as the wire gave it (the message: `result_of` takes its result), None when the connection
        ended; MCPError when it ended under the write, TimeoutError past `timeout` seconds."""
        if self._closed:
            return None
        return await self._ask(*self._request(self.read_tail(uri)), timeout)

    async def list_resources(self, cursor: str | None) -> dict[str, Any]:
        """The upstream's result for one `resources/list` page from `cursor` (None: the first), as the wire gave it
        (whatever its resultType, as the SDK's client takes it; the caller checks it, `pages.resource_page`); MCPError
        for an error answer or a connection that ended. The request is the SDK client's: the cursor when there is
        one, the modern wire's envelope; its answer is taken only once its JSON-RPC envelope is valid, as the SDK's
        session takes one (any other is dropped and the page waits on). Its time is the caller's to bound."""
        if self._closed:
            raise MCPError(types.CONNECTION_CLOSED, "Connection closed")
        request_id = f"{_PREFIX}{next(self._ids)}"
        params: dict[str, Any] = {} if cursor is None else {"cursor": cursor}
        if self._meta is not None:
            params["_meta"] = self._meta
        request = {"jsonrpc": "2.0", "id": request_id, "method": "resources/list", **({"params": params} if params
                                                                                       else {})}
        self._enveloped.add(request_id)
        try:
            message = await self._ask(request_id, json.dumps(request, separators=(",", ":")).encode() + b"\n", None)
        finally:
            self._enveloped.discard(request_id)
        if message is None:
            raise MCPError(types.CONNECTION_CLOSED, "Connection closed")
        if "error" in message:
            error = message["error"]
            raise MCPError(error.code, error.message, error.data)
        return message["result"]

    async def _ask(self, request_id: str, line: bytes, timeout: float | None) -> dict[str, Any] | None:
        """Send `line` (request `request_id`) and wait for its answer: the message, None when the connection ended;
        TimeoutError past `timeout` seconds. A request given up is cancelled upstream."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[dict[str, Any] | None] = loop.create_future()
        self._waiting[request_id] = answer
        expiry = None if timeout is None else self._expire_at(loop, loop.time() + timeout, answer)
        answered = False
        try:
            try:
                if self._write_now is None or not self._write_now(line):
                    await self._write(line)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                # The child stopped reading: as the SDK says of a connection gone (the call goes to the next one).
                raise MCPError(types.CONNECTION_CLOSED, "Connection closed") from None
            message = await answer
            answered = True
        finally:
            if expiry is not None:
                expiry.cancel()
            if not answer.done():  # never awaited (its write failed): the sweep has nothing to expire
                answer.cancel()
            self._swept()
            if not answered and self._waiting.pop(request_id, None) is not None and not self._closed:
                timed_out = not answer.cancelled() and isinstance(answer.exception(), TimeoutError)
                await self._cancel(_cancellation(request_id, _TIMED_OUT if timed_out else _CANCELLED))
        return message

    def send(self, uri: str, sent: Sent, timeout: float) -> bool:
        """Ask for `uri` now, its answer (the message, None when the connection ended, TimeoutError past `timeout`)
        handed to `sent.answered` where it arrives; False (nothing sent) when the pipe cannot take the line at once."""
        return self.send_read(self.read_tail(uri), sent, timeout)

    def read_tail(self, uri: str) -> bytes:
        """What follows a read's id in its request line on this lane (`send_read`): made once for a URI read often."""
        return (f'","method":"resources/read","params":{{"uri":{encode_basestring(uri)}{self._tail}'
                ).encode("utf-8", "surrogatepass")

    def send_read(self, tail: bytes, sent: Sent, timeout: float) -> bool:
        """`send` of the read whose request line ends with `tail` (`read_tail`)."""
        if self._closed or self._write_now is None:
            return False
        request_id, line = self._request(tail)
        # Everything the answer needs is in place before the line goes out, and the write is the callback's last
        # step: the upstream it wakes is run on this CPU and waits for the callback to end (benchmarks/hop_ab.py).
        self._waiting[request_id] = sent
        sent._lane, sent._request_id, sent._over = self, request_id, False  # noqa: SLF001 - its own reads'
        loop = self._loop
        if loop is None:  # the lane lives in one loop: asked once (asking costs a system call on Python 3.11)
            loop = self._loop = asyncio.get_running_loop()
        sent._expiry = self._expire_at(loop, loop.time() + timeout, sent)  # noqa: SLF001
        try:
            if self._write_now(line):
                return True
        except OSError:
            pass  # the child stopped reading: the caller's usual path finds the connection gone
        self._unsent(request_id, sent)
        return False

    def _unsent(self, request_id: str, sent: Sent) -> None:
        """Undo `send_read` of a line the pipe did not take: nothing waits for it (its deadline, left queued, is
        swept as a read over)."""
        del self._waiting[request_id]
        sent._over = True  # noqa: SLF001 - its own reads'
        if sent._expiry is not None:  # noqa: SLF001
            sent._expiry.cancel()  # noqa: SLF001

    def _request(self, tail: bytes) -> tuple[str, bytes]:
        """A new read's id and its request line ending with `tail` (`read_tail`): what json.dumps would write
        (compact, UTF-8 as it is)."""
        number = str(next(self._ids))
        return _PREFIX + number, _READ_HEAD + number.encode() + tail

    def _swept(self) -> None:
        """Deadlines of reads over are dropped from the front, and all of them once they outnumber those waiting."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][1].done():
            deadlines.popleft()
        if len(deadlines) > _KEPT_DONE and len(deadlines) > 2 * len(self._waiting):
            # Reads answered behind one still waiting: dropped now rather than at its deadline.
            self._deadlines = deque(entry for entry in deadlines if not entry[1].done())

    def _given_up(self, sent: Sent, reason: str = _CANCELLED) -> None:
        """A sent read over with no answer (`Sent.give_up`, never told; or past its deadline): its timer stopped, the
        read forgotten (an answer still to come is dropped), and the upstream told why."""
        if sent._expiry is not None:  # noqa: SLF001 - its own reads'
            sent._expiry.cancel()  # noqa: SLF001
        request_id = sent._request_id  # noqa: SLF001
        if self._waiting.pop(request_id, None) is not None and not self._closed:
            self._tell(_cancellation(request_id, reason))
        self._swept()

    def _tell(self, note: bytes) -> None:
        """Write `note` at once where the pipe can take it (the pipe stays free for the next read), else in a task of
        its own behind the writes under way."""
        try:
            if self._write_now is not None and self._write_now(note):
                return
        except OSError:
            return  # the child stopped reading: the connection's end is told as it comes
        task = asyncio.get_running_loop().create_task(self._cancel(note))
        self._telling.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(self._telling.discard)

    def _expire_at(self, loop: asyncio.AbstractEventLoop, deadline: float,
                   answer: Waiter) -> asyncio.TimerHandle | None:
        """Fail `answer` with TimeoutError at `deadline`: queued for the lane's one sweep (no timer a read), or a
        timer of its own (returned: the caller cancels it) when it falls before a deadline already queued."""
        deadlines = self._deadlines
        if deadlines and deadline < deadlines[-1][0]:
            return loop.call_at(deadline, _expire, answer)
        deadlines.append((deadline, answer))
        if self._sweep is None:
            self._sweep = loop.call_at(deadline, self._expire_due, loop)
        return None

    def _expire_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """The sweep: every read past its deadline fails, and the sweep comes back at the next deadline. A read is
        told after its deadline left the queue: a waiter told in place (`Sent`) sweeps the queue itself, and may send a
        read whose deadline queues a sweep of its own."""
        self._sweep = None
        now = loop.time()
        while self._deadlines:
            deadline, answer = self._deadlines[0]
            if not answer.done() and deadline > now:
                if self._sweep is not None:  # queued by a read sent meanwhile, for a later deadline
                    self._sweep.cancel()
                self._sweep = loop.call_at(deadline, self._expire_due, loop)
                return
            self._deadlines.popleft()
            if not answer.done():
                answer.set_exception(TimeoutError())

    async def _cancel(self, note: bytes) -> None:
        """Tell the upstream a read was given up (`_cancellation`; best effort: the pipe may be gone, and we may be
        cancelled)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(1):
            try:
                await self._write(note)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                pass


class Waiter(Protocol):
    """What waits for a lane answer: an asyncio future, or a `Sent`."""

    def done(self) -> bool: ...
    def set_result(self, message: dict[str, Any] | None, /) -> None: ...
    def set_exception(self, exc: BaseException, /) -> None: ...
    def cancel(self) -> bool: ...


class Sent:
    """One read `send` wrote, and at once what waits for its answer (the lane's `Waiter`) and how to give it up: its
    subclass's `answered` is told once, where the outcome arrives (the message, None when the connection ended,
    TimeoutError past its deadline), unless `give_up` came first (then never; the upstream is told, as the SDK
    tells a cancelled call). One object a read, its fields set by `send`."""

    __slots__ = ("_lane", "_request_id", "_expiry", "_over", "_link")

    _lane: Lane
    _request_id: str
    _expiry: asyncio.TimerHandle | None
    _over: bool
    _link: Any
    """Its sender's: the connection it went on (`relaying.Route`)."""

    def answered(self, outcome: dict[str, Any] | None | BaseException) -> None:
        """The read's outcome (once)."""
        raise NotImplementedError

    def give_up(self) -> None:
        """The read is no longer wanted: nothing once it was answered (or given up)."""
        if not self._over:
            self._over = True
            self._lane._given_up(self)  # noqa: SLF001 - its own lane's

    def done(self) -> bool:
        return self._over

    def set_result(self, message: dict[str, Any] | None, /) -> None:
        # Over, its timer (if it had one of its own) stopped: every answer comes this way. The lane's deadlines of
        # reads over are swept once a few are queued (the sweep passes over them meanwhile), not at every answer.
        self._over = True
        if self._expiry is not None:
            self._expiry.cancel()
        self.answered(message)
        lane = self._lane  # swept once the answer is out
        if len(lane._deadlines) > _SWEPT_PAST:  # noqa: SLF001 - its own lane's
            lane._swept()  # noqa: SLF001

    def set_exception(self, exc: BaseException, /) -> None:
        # Past its deadline (the one failure the lane tells): given up as `Lane._ask` gives up an awaited read, so no
        # waiter is kept for an answer that may never come, and the upstream stops the work.
        self._over = True
        self._lane._given_up(self, _TIMED_OUT)  # noqa: SLF001 - its own lane's
        self.answered(exc)

    def cancel(self) -> bool:
        """Never told (the read was given up)."""
        self._over = True
        return True


def _cancellation(request_id: str, reason: str) -> bytes:
    """The line telling the upstream that read `request_id` was given up, and why (as the SDK's client words it)."""
    note = {"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": request_id, "reason": reason}}
    return json.dumps(note).encode() + b"\n"


def _expire(answer: Waiter) -> None:
    if not answer.done():
        answer.set_exception(TimeoutError())


def _answer_of(message: dict[str, Any]) -> dict[str, Any] | None:
    """An answer as the SDK's session takes it (its envelope validated: the result, or the error's fields as
    validated), None for a message it drops."""
    try:
        checked = types.jsonrpc_message_adapter.validate_python(message, by_name=False)
    except ValidationError:
        return None
    if isinstance(checked, types.JSONRPCError):
        return {"error": checked.error}
    return {"result": checked.result} if isinstance(checked, types.JSONRPCResponse) else None


class LooseResult(dict[str, Any]):
    """A result parsed by the stdlib's parser where orjson refused the line: its strings may hold a lone surrogate,
    which no UTF-8 encodes, so the SDK's model checks it (`answers.read_answer` leaves it alone)."""

    __slots__ = ()


def parsed(line: bytes) -> Any:
    """A line from the upstream's stdout as `codec.loads` parses it (ValueError or RecursionError where it raises),
    with its result a `LooseResult` where orjson refused the line."""
    try:
        return loads_strict(line)
    except ValueError:  # the stdlib decides, and the result may hold a lone surrogate
        message = loads(line)
    if type(message) is dict and type(result := message.get("result")) is dict:
        message["result"] = LooseResult(result)
    return message


def result_of(message: dict[str, Any] | None) -> dict[str, Any]:
    """The result of an answer to a read; MCPError for an error answer, a connection that ended (None) or a result
    that is not complete."""
    if message is None:
        raise MCPError(types.CONNECTION_CLOSED, "Connection closed")
    error = message.get("error")
    if error is not None:
        if not isinstance(error, dict) or not isinstance(code := error.get("code"), int):
            raise MCPError(types.INTERNAL_ERROR, "a malformed error answer")
        raise MCPError(code, str(error.get("message", "")), error.get("data"))
    result = message.get("result")
    if not isinstance(result, dict) or result.get("resultType", "complete") != "complete":
        # An input_required answer (or none): the SDK's client refuses it too.
        raise MCPError(types.INTERNAL_ERROR, "resources/read: not a complete result")
    return result
