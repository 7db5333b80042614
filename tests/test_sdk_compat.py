"""Library internals the server relies on still have the shape it expects: the mcp SDK's per-connection object
(aggregator.sdk_compat) through a real session and the official client, and the uvicorn httptools protocol's
attributes that aggregator.http_limits reads, on a real uvicorn server; the SDK's claim of the standard streams that
aggregator.stdio serves from. Each failure names the installed version."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import subprocess
import sys
import warnings
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client
from mcp.server import Server, ServerRequestContext

from aggregator.sdk_compat import Connection, connection_of
from tests.isolation import free_port

MCP = f"mcp {importlib.metadata.version('mcp')}"
UVICORN = f"uvicorn {importlib.metadata.version('uvicorn')} (httptools {importlib.metadata.version('httptools')})"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_the_sdk_still_keeps_the_connection_a_message_came_on(mode: str) -> None:
    """On the legacy wire one Connection serves every message of a client (the notifier keys its registrations by
    it); on the modern wire each request is an exchange of its own, with a Connection of its own."""
    seen: list[Any] = []
    closed: list[bool] = []

    async def list_resources(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> types.ListResourcesResult:
        try:
            connection = connection_of(ctx)
        except AttributeError as exc:
            raise AssertionError(f"{MCP}: a request's session no longer keeps its connection as `_connection` "
                                 f"({exc}); update aggregator/sdk_compat.py") from None
        seen.append((connection, ctx.session))
        if len(seen) == 1:
            connection.exit_stack.callback(closed.append, True)
        return types.ListResourcesResult(resources=[])

    async def main() -> None:
        server: Server[Any] = Server("probe", on_list_resources=list_resources)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the legacy wire is deprecated
            async with Client(server, mode=mode, cache=None) as client:  # type: ignore[arg-type]
                await client.list_resources()
                await client.list_resources()
                if mode == "legacy":
                    assert not closed, f"{MCP}: the connection's exit stack unwound while its client was connected"
        await anyio.sleep(0.1)

    anyio.run(main)
    (first, _), (second, _) = seen
    # What aggregator.notify relies on: a Connection, one per legacy client connection whatever session each message
    # gets, hashable, with an exit stack that is unwound when the client goes.
    assert isinstance(first, Connection), f"{MCP}: `_connection` is a {type(first).__name__}, not a Connection"
    assert isinstance(second, Connection), f"{MCP}: `_connection` is a {type(second).__name__}, not a Connection"
    if mode == "legacy":
        assert first is second, f"{MCP}: two messages of one connection came with different connection objects"
    assert type(first).__hash__ is object.__hash__ and type(first).__eq__ is object.__eq__, \
        f"{MCP}: a connection no longer hashes and compares by identity"
    assert isinstance(first.exit_stack, AsyncExitStack), f"{MCP}: a connection's `exit_stack` is not an AsyncExitStack"
    assert closed == [True], f"{MCP}: a connection's exit stack was not unwound when its client went"


def test_uvicorn_protocol_internals_that_http_limits_reads_are_there() -> None:
    """http_limits subclasses uvicorn's HttpToolsProtocol and reads `connections`, `loop`, `transport`, `parser`
    (should_upgrade), `flow` (read_paused), `cycle` (response_started, response_complete, disconnected,
    message_event, transport: http_writes stands in for it) and calls `_should_upgrade`: pinned `uvicorn<1`, checked here on a real server."""
    import uvicorn

    from aggregator.http_limits import limited_protocol
    from aggregator.manifest.model import HttpSettings

    has: dict[str, bool] = {}
    cycles: list[Any] = []

    class Probe(limited_protocol(HttpSettings())):  # type: ignore[misc]  # a class made at run time
        def on_headers_complete(self) -> None:
            for name in ("connections", "loop", "transport", "parser", "flow", "cycle"):
                has[name] = hasattr(self, name)
            cycles.append(getattr(self, "cycle", "missing"))
            super().on_headers_complete()
            for name in ("response_started", "response_complete", "disconnected", "message_event", "transport"):
                has[f"cycle.{name}"] = hasattr(self.cycle, name)
            has["flow.read_paused"] = hasattr(self.flow, "read_paused")
            has["parser.should_upgrade()"] = callable(getattr(self.parser, "should_upgrade", None))
            has["_should_upgrade()"] = callable(getattr(self, "_should_upgrade", None))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def main() -> bytes:
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, http=Probe, lifespan="off",
                                               log_config=None, log_level="warning"))
        serving = asyncio.create_task(server.serve())
        try:
            while not server.started:
                await asyncio.sleep(0.02)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi")
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            return answer
        finally:
            server.should_exit = True
            await serving

    answer = asyncio.run(main())
    assert answer.startswith(b"HTTP/1.1 200"), answer
    missing = sorted(name for name, there in has.items() if not there)
    assert has and not missing, f"{UVICORN}: HttpToolsProtocol lacks {missing}; see aggregator/http_limits.py"
    assert cycles == [None], f"{UVICORN}: `cycle` before a connection's first request is {cycles}, not None"


def test_streamable_http_internals_the_http_fast_path_reads_are_there() -> None:
    """aggregator.http_fast finds a legacy session as the SDK's manager keeps it (`_server_instances`,
    `_session_owners`) and keeps its idle countdown as its transport does (`idle_scope`, `_idle_timeout`,
    `_requests_in_flight`); tests/test_http_fast.py checks the answers, this names what went missing."""
    from mcp.server.lowlevel import Server
    from mcp.server.streamable_http import StreamableHTTPServerTransport
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    manager = StreamableHTTPSessionManager(Server("probe"))
    assert manager._server_instances == {} and manager._session_owners == {}
    transport = StreamableHTTPServerTransport("id", idle_timeout=60)
    assert (transport.mcp_session_id, transport._idle_timeout, transport._requests_in_flight) == ("id", 60, 0)
    assert transport.idle_scope is None and transport.is_terminated is False  # idle_scope: set by connect()


def test_fsspec_and_s3fs_internals_the_remote_source_calls_are_there() -> None:
    """aggregator.sources.filesystem calls `_strip_protocol` (fsspec, every remote source) and s3fs's
    `_iterdir(bucket, delimiter=, prefix=)` (a counted flat listing); tests/test_sources_s3.py lists through it."""
    import inspect

    import fsspec
    import s3fs

    versions = f"fsspec {importlib.metadata.version('fsspec')}, s3fs {importlib.metadata.version('s3fs')}"
    assert callable(getattr(fsspec.AbstractFileSystem, "_strip_protocol", None)), \
        f"{versions}: AbstractFileSystem._strip_protocol is gone"
    iterdir = getattr(s3fs.S3FileSystem, "_iterdir", None)
    assert iterdir is not None and inspect.isasyncgenfunction(iterdir), \
        f"{versions}: S3FileSystem._iterdir is gone or no longer an async generator"
    params = inspect.signature(iterdir).parameters
    missing = [name for name in ("bucket", "delimiter", "prefix") if name not in params]
    assert not missing, f"{versions}: S3FileSystem._iterdir no longer takes {missing}"


def test_the_s3fs_internals_its_retry_loop_override_calls_are_there() -> None:
    """aggregator.s3_client's `OneRetryLoopS3._call_s3` is s3fs's own, rebuilt from its parts: the parts it calls
    are there, s3fs's loop takes `retries`, and s3fs still translates an error from its `response` alone."""
    import inspect

    import s3fs.core
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    from aggregator.s3_client import AttemptsSpentError

    version = f"s3fs {importlib.metadata.version('s3fs')}"
    for name in ("_call_s3", "set_session", "get_s3", "_get_s3_method_kwargs"):
        assert callable(getattr(s3fs.S3FileSystem, name, None)), f"{version}: S3FileSystem.{name} is gone"
    wrapper = getattr(s3fs.core, "_error_wrapper", None)
    assert wrapper is not None and inspect.iscoroutinefunction(wrapper), f"{version}: _error_wrapper is gone"
    assert {"kwargs", "retries"} <= set(inspect.signature(wrapper).parameters), \
        f"{version}: _error_wrapper no longer takes kwargs and retries"
    answer = {"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."}, "ResponseMetadata": {}}
    spent = translate_boto_error(AttemptsSpentError(ClientError(answer, "GetObject")))
    expected = translate_boto_error(ClientError(answer, "GetObject"))
    assert (type(spent), spent.args) == (type(expected), expected.args), \
        f"{version}: translate_boto_error no longer translates from the error's response"


def test_the_sdk_still_claims_the_standard_streams() -> None:
    """aggregator.stdio serves the wire from the SDK's claim of fd 0 and 1: the wire moves to private duplicates,
    a stray print goes to stderr, and releasing gives the descriptors back."""
    script = """
import sys
from aggregator.sdk_compat import claim_stdin, claim_stdout
wire_in, release_in = claim_stdin()
wire_out, release_out = claim_stdout()
print("stray", flush=True)
wire_out.write(wire_in.readline().upper())
wire_out.flush()
release_out()
release_in()
print("restored", flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script], input=b"hello\n", capture_output=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert (done.returncode, done.stdout) == (0, b"HELLO\nrestored\n"), (
        f"{MCP}: the private stdio claim (mcp.server.stdio._claim_fd and its diversions) changed: update "
        f"aggregator/sdk_compat.py\n{done.stderr.decode(errors='replace')}")
    assert b"stray" in done.stderr, f"{MCP}: a stray print no longer goes to stderr while fd 1 is claimed"


def test_prometheus_client_file_helpers_the_workers_metrics_write_with_are_there(tmp_path: Path) -> None:
    """aggregator.metrics_multiprocess writes each worker's live figures with prometheus_client's own file writer
    (`mmap_dict.MmapedDict`, `mmap_key`, `values.MultiProcessValue`), which its docs do not promise: a file written
    with them must read back through the documented MultiProcessCollector."""
    import prometheus_client
    from prometheus_client import CollectorRegistry, multiprocess, values
    from prometheus_client.mmap_dict import MmapedDict, mmap_key

    version = f"prometheus-client {importlib.metadata.version('prometheus-client')}"
    assert callable(getattr(values, "MultiProcessValue", None)), f"{version}: values.MultiProcessValue is gone"
    written = MmapedDict(str(tmp_path / "gauge_livesum_1.db"))
    try:
        written.write_value(mmap_key("agg_probe", "agg_probe", ["a"], ["b"], "probe"), 7.0, 0.0)
    finally:
        written.close()
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    text = prometheus_client.generate_latest(registry).decode()
    assert 'agg_probe{a="b"} 7.0' in text, f"{version}: a file written by MmapedDict no longer reads back:\n{text}"
