"""OpenTelemetry traces: our spans beneath the SDK's request span (both wires, in process, with the SDK's in-memory
exporter), reloads, renders, failed reads without upstream bodies, the real OTLP/HTTP exporter end to end, and
nothing at all while the OTEL_* variables do not ask for it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from aggregator import tracing
from aggregator.errors import ResourceUnavailable
from aggregator.manifest.model import ManifestError
from aggregator.notify import Notifier
from aggregator.server import build_server
from aggregator.service import ResourceService
from tests.conftest import MODES, write_manifest
from tests.http_server import serve
from tests.isolation import free_port
from tests.served import accepts, wait_until, workers_up

pytest.importorskip("opentelemetry.sdk", reason="the otel extra (opentelemetry-sdk) is not installed")
pytest.importorskip("opentelemetry.proto", reason="the otel extra (opentelemetry-exporter-otlp-proto-http) is not "
                                                  "installed")

from opentelemetry import trace  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = [sys.executable, str(ROOT / "tests" / "upstream_server.py"), "stdio"]
_EXPORTER = InMemorySpanExporter()
_PROVIDER: TracerProvider | None = None


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on for this test, into an in-memory exporter (the process's global provider is set once)."""
    global _PROVIDER
    if _PROVIDER is None:
        _PROVIDER = TracerProvider()
        _PROVIDER.add_span_processor(tracing.scrubbed(SimpleSpanProcessor(_EXPORTER)))  # as setup_tracing does
    tracing.enable(_PROVIDER)
    assert trace.get_tracer_provider() is _PROVIDER, "another test set a different global tracer provider"
    _EXPORTER.clear()
    try:
        yield _EXPORTER
    finally:
        tracing.disable()
        _EXPORTER.clear()


@asynccontextmanager
async def served(manifest: Path) -> AsyncIterator[tuple[ResourceService, Any]]:
    service = await ResourceService.open(manifest)
    try:
        yield service, build_server(service, Notifier(max_subscriptions=100))
    finally:
        await service.aclose()


def named(found: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in found if s.name == name]


def one(found: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    matches = named(found, name)
    assert len(matches) == 1, f"{name}: {[s.name for s in found]}"
    return matches[0]


def ancestry(span: ReadableSpan, found: Sequence[ReadableSpan]) -> list[str]:
    """Names of the spans above `span`, nearest first (within one trace)."""
    by_id = {s.context.span_id: s for s in found}
    names, parent = [], span.parent
    while parent is not None and parent.span_id in by_id:
        above = by_id[parent.span_id]
        assert above.context.trace_id == span.context.trace_id
        names.append(above.name)
        parent = above.parent
    return names


def cache_outcomes(span: ReadableSpan) -> list[str | None]:
    return [str(e.attributes["aggregator.cache.outcome"]) for e in span.events
            if e.name == "aggregator.cache" and e.attributes]


def everything_said(found: Sequence[ReadableSpan]) -> str:
    """Every attribute, event and status text of these spans, to search for what must never be there."""
    parts = []
    for s in found:
        parts += [s.name, str(s.status.description), repr(dict(s.attributes or {}))]
        parts += [f"{e.name} {dict(e.attributes or {})}" for e in s.events]
    return "\n".join(parts)


@pytest.mark.parametrize("mode", MODES)
def test_a_read_nests_cache_and_source_spans_under_the_sdk_request_span(
        docs_manifest: Path, spans: InMemorySpanExporter, mode: str) -> None:
    async def main() -> None:
        async with served(docs_manifest) as (_, server):
            async with Client(server, mode=mode, cache=None) as client:
                spans.clear()
                assert (await client.read_resource("docs://readme")).contents[0].text == "# Readme\n"
                first = spans.get_finished_spans()
                spans.clear()
                await client.read_resource("docs://readme")
                second = spans.get_finished_spans()

        request = one(first, "resources/read")
        assert request.kind is SpanKind.SERVER and request.attributes["mcp.method.name"] == "resources/read"
        load, read = one(first, "aggregator.cache.load"), one(first, "aggregator.source.read")
        assert ancestry(read, first)[:2] == ["aggregator.cache.load", "resources/read"]
        assert cache_outcomes(load) == ["miss"]
        assert dict(read.attributes or {}) == {"aggregator.source.id": "docs", "aggregator.source.kind": "file",
                                               "aggregator.path": "README.md", "aggregator.uri": "docs://readme"}
        assert read.status.status_code is StatusCode.UNSET
        assert str(docs_manifest.parent) not in everything_said(first)  # a local source's URL is a path here

        # Cached: the request span says hit, and nothing reached the source.
        assert cache_outcomes(one(second, "resources/read")) == ["hit"]
        assert not named(second, "aggregator.source.read") and not named(second, "aggregator.cache.load")

    anyio.run(main)


def test_reload_span_with_its_listings_and_a_failed_reload(docs_manifest: Path, spans: InMemorySpanExporter) -> None:
    async def main() -> None:
        service = await ResourceService.open(docs_manifest)
        try:
            spans.clear()
            text = docs_manifest.read_text()
            # A new collection: listed by this reload (the others are younger than their ttl and reused).
            write_manifest(docs_manifest.parent, text.replace(
                "collections:\n", 'collections:\n  - {source: docs, glob: "*.json", uri: "json://{path}"}\n', 1))
            await service.reload()
            found = spans.get_finished_spans()
            reload = one(found, "aggregator.reload")
            assert reload.status.status_code is StatusCode.UNSET
            attributes = dict(reload.attributes or {})
            assert attributes["aggregator.outcome"] == "ok" and attributes["aggregator.generation"] == 2
            assert attributes["aggregator.resources"] == len(service.catalog)
            listing = one(found, "aggregator.source.list")
            assert ancestry(listing, found) == ["aggregator.reload"]
            assert listing.attributes["aggregator.glob"] == "*.json" and listing.attributes["aggregator.files"] == 1

            spans.clear()
            (docs_manifest.parent / "docs" / "more.json").write_text("{}")
            assert (await service.refresh_listing()).listing_changed
            found = spans.get_finished_spans()
            relist = one(found, "aggregator.relist")
            assert relist.attributes["aggregator.generation"] == 3
            assert {ancestry(s, found)[0] for s in named(found, "aggregator.source.list")} == {"aggregator.relist"}

            spans.clear()
            write_manifest(docs_manifest.parent, "version: 1\nsources: [\n")
            with pytest.raises(ManifestError):
                await service.reload()
            failed = one(spans.get_finished_spans(), "aggregator.reload")
            assert failed.status.status_code is StatusCode.ERROR
            assert failed.attributes["aggregator.outcome"] == "failed"
            assert failed.attributes["error.type"] == "ManifestError"
            assert str(docs_manifest.parent) not in everything_said([failed])  # the message names the file
        finally:
            await service.aclose()

    anyio.run(main)


def test_render_span_holds_the_reads_it_makes(docs_manifest: Path, spans: InMemorySpanExporter) -> None:
    write_manifest(docs_manifest.parent, docs_manifest.read_text().replace(
        "resources:\n", 'resources:\n  - {uri: "digest://readme", name: digest, '
        'render: "Digest: {{ read(\'docs://readme\') }}"}\n', 1))

    async def main() -> None:
        async with served(docs_manifest) as (_, server):
            async with Client(server, mode="auto", cache=None) as client:
                spans.clear()
                assert (await client.read_resource("digest://readme")).contents[0].text == "Digest: # Readme\n"
        found = spans.get_finished_spans()
        render = one(found, "aggregator.render")
        assert render.attributes["aggregator.uri"] == "digest://readme"
        assert ancestry(render, found) == ["resources/read"]
        assert ancestry(one(found, "aggregator.source.read"), found)[:3] == [
            "aggregator.cache.load", "aggregator.render", "resources/read"]

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_a_failed_read_records_the_error_type_not_the_upstream_body(
        tmp_path: Path, spans: InMemorySpanExporter, mode: str) -> None:
    with serve() as upstream:
        upstream.failing = True  # 500 with SECRET-UPSTREAM-BODY
        manifest = write_manifest(tmp_path, f"""
            version: 1
            server: {{name: failing}}
            sources:
              api: {{url: "http://127.0.0.1:{upstream.port}/base/", allowPrivateNetwork: true,
                    headers: {{Authorization: "Bearer tok-5ecr3t"}}}}
            resources:
              - {{uri: "api://a", name: a, source: api, path: docs/a.md}}
            """)

        async def main() -> None:
            async with served(manifest) as (_, server):
                async with Client(server, mode=mode, cache=None) as client:
                    spans.clear()
                    with pytest.raises(MCPError):
                        await client.read_resource("api://a")

        anyio.run(main)
    found = spans.get_finished_spans()
    read = one(found, "aggregator.source.read")
    assert read.status.status_code is StatusCode.ERROR
    assert read.attributes["error.type"] == "ResourceUnavailable"
    assert read.attributes["aggregator.source.kind"] == "http"
    assert [e.attributes for e in read.events if e.name == "exception"] == [{"exception.type": "ResourceUnavailable"}]
    assert one(found, "aggregator.cache.load").status.status_code is StatusCode.ERROR
    assert one(found, "resources/read").status.status_code is StatusCode.ERROR
    said = everything_said(found)
    assert "SECRET-UPSTREAM-BODY" not in said and "tok-5ecr3t" not in said


def test_spans_are_one_shared_no_op_while_tracing_is_off() -> None:
    assert not tracing.enabled()
    with tracing.span("aggregator.source.read", source_id="x") as first:
        first.set(files=1)
    assert first is tracing.span("aggregator.render", uri="a://b")
    tracing.cache_event("hit", object())  # nothing to record it on, and no error


@pytest.mark.parametrize(("environ", "wanted"), [
    ({}, False),
    ({"OTEL_SERVICE_NAME": "x", "OTEL_EXPORTER_OTLP_HEADERS": "a=b"}, False),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, False),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp,console"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "TRUE"}, False),
])
def test_only_the_standard_variables_turn_tracing_on(environ: dict[str, str], wanted: bool) -> None:
    assert tracing.wanted(environ) is wanted


@pytest.mark.parametrize(("environ", "name", "extra"), [
    ({}, "aggregator", {}),
    ({"OTEL_SERVICE_NAME": "docs-edge"}, "docs-edge", {}),
    ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs,deployment.environment=prod"}, "from-attrs",
     {"deployment.environment": "prod"}),
])
def test_the_resource_names_the_service(monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], name: str,
                                        extra: dict[str, str]) -> None:
    from opentelemetry.sdk.resources import Resource

    for key in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    attributes = Resource.create(tracing._resource_defaults(environ)).attributes
    assert attributes["service.name"] == name and attributes["service.version"]
    assert extra.items() <= dict(attributes).items()


def _python(code: str, **environ: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run([sys.executable, "-c", code], env={**clean, "PYTHONPATH": str(ROOT), **environ},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("mode", MODES)
def test_console_exporter_writes_to_stderr_beside_the_stdio_wire(docs_manifest: Path, tmp_path: Path,
                                                                 mode: str) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "aggregator", "serve", str(docs_manifest)],
                                   env={**clean, "PYTHONPATH": str(ROOT), "OTEL_TRACES_EXPORTER": "console",
                                        "OTEL_BSP_SCHEDULE_DELAY": "10"})

    async def main() -> None:
        with open(tmp_path / "stderr.txt", "w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), mode=mode, cache=None) as client:
                for _ in range(5):  # spans are written while the session goes on: the wire must stay intact
                    assert (await client.read_resource("docs://readme")).contents[0].text == "# Readme\n"
                    await anyio.sleep(0.05)

    anyio.run(main)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert '"name": "resources/read"' in stderr and '"name": "aggregator.source.read"' in stderr, stderr


def test_off_by_default_imports_no_sdk_and_makes_no_exporter() -> None:
    done = _python("import sys; from aggregator.tracing import setup_tracing, enabled\n"
                   "assert setup_tracing() is False and not enabled()\n"
                   "assert not [m for m in sys.modules if m.startswith('opentelemetry.sdk')], 'SDK imported'\n"
                   "assert not [m for m in sys.modules if m.startswith('opentelemetry.exporter')]\n")
    assert done.returncode == 0, done.stderr


def test_without_the_extra_one_warning_names_it() -> None:
    done = _python("import sys; sys.modules['opentelemetry.sdk'] = None\n"
                   "import logging; logging.basicConfig()\n"
                   "from aggregator.tracing import setup_tracing\n"
                   "assert setup_tracing() is False\n",
                   OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("mcp-aggregator[otel]") == 1, done.stderr


# --- the real exporter, end to end ---------------------------------------------------------------------------


class _Collector:
    """An OTLP/HTTP receiver on loopback: keeps every POST /v1/traces body, decoded."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []

    def span_names(self) -> set[str]:
        return {s.name for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans}

    def ancestry(self, name: str) -> list[str]:
        """Names above the first span called `name`, nearest first."""
        spans = [s for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
        by_id = {s.span_id: s for s in spans}
        found = next(s for s in spans if s.name == name)
        names = []
        while found.parent_span_id in by_id:
            found = by_id[found.parent_span_id]
            names.append(found.name)
        return names

    def service_names(self) -> set[str]:
        return {a.value.string_value for r in self.requests for rs in r.resource_spans
                for a in rs.resource.attributes if a.key == "service.name"}


@contextmanager
def collector() -> Iterator[tuple[_Collector, int]]:
    received = _Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            received.paths.append(self.path)
            if self.path == "/v1/traces" and self.headers.get("Content-Type") == "application/x-protobuf":
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                received.requests.append(request)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextmanager
def serving(folder: Path, *extra: str, **environ: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`aggregator serve --http` over folder/docs with `environ` (and no OTEL_* of the test's own), until it
    accepts connections; stopped with SIGTERM (a graceful exit, which flushes spans)."""
    (folder / "docs").mkdir()
    (folder / "docs" / "a.md").write_text("# A\n")
    manifest = write_manifest(folder, """
        version: 1
        server: {name: traced}
        sources:
          docs: {url: ./docs}
        collections:
          - {source: docs, glob: "*.md", uri: "docs://{path}"}
        """)
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    process = subprocess.Popen([sys.executable, "-m", "aggregator", "serve", str(manifest), "--http", str(port),
                                *extra], env={**clean, "PYTHONPATH": str(ROOT), **environ}, stderr=subprocess.PIPE)
    try:
        # Its stderr is the caller's to read (a pipe): a failed start says only how the process ended.
        wait_until(accepts(port), f"serve --http {port}", process=process)
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


async def _read_twice(url: str, modes: Sequence[str] = MODES) -> None:
    for mode in modes:
        async with Client(url, mode=mode, cache=None) as client:
            assert (await client.read_resource("docs://a.md")).contents[0].text == "# A\n"


def test_otlp_http_exporter_end_to_end(tmp_path: Path) -> None:
    with collector() as (received, port):
        # A batch delay longer than the test: what arrives was flushed by the graceful exit.
        with serving(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                     OTEL_BSP_SCHEDULE_DELAY="600000") as (url, process):
            anyio.run(_read_twice, url)
            assert received.requests == []
            process.terminate()
            assert process.wait(20) == 0
            stderr = process.stderr.read().decode()  # type: ignore[union-attr]
        assert {"resources/read", "aggregator.source.read", "aggregator.cache.load"} <= received.span_names(), (
            received.span_names(), stderr)
        assert received.service_names() == {"aggregator"}
        assert received.ancestry("aggregator.source.read")[:2] == ["aggregator.cache.load", "resources/read"]
        assert set(received.paths) == {"/v1/traces"}
        assert "tracing on" in stderr


def test_nothing_is_exported_when_the_sdk_is_disabled(tmp_path: Path) -> None:
    with collector() as (received, port):
        with serving(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}", OTEL_SDK_DISABLED="true",
                     OTEL_BSP_SCHEDULE_DELAY="100") as (url, process):
            anyio.run(_read_twice, url)
            process.terminate()
            assert process.wait(20) == 0  # exit flushes whatever was batched: there must be nothing
            stderr = process.stderr.read().decode()  # type: ignore[union-attr]
        assert received.paths == [] and "tracing on" not in stderr


def test_each_worker_exports_its_spans_before_it_exits(tmp_path: Path) -> None:
    with collector() as (received, port):
        with serving(tmp_path, "--stateless", "--workers", "2", OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                     OTEL_BSP_SCHEDULE_DELAY="600000") as (url, process):
            # The port accepts once the parent bound it; a worker still starting when SIGTERM comes dies of it, its
            # spans unflushed (on a loaded machine the second one may not have opened its catalog yet).
            wait_until(workers_up(process.pid, 2), "2 workers serving", process=process)
            anyio.run(_read_twice, url, ("auto",) * 8)  # new connections: the kernel spreads them over the workers
            process.terminate()
            assert process.wait(30) == 0
            stderr = process.stderr.read().decode()  # type: ignore[union-attr]
        assert stderr.count("tracing on") == 2, stderr
        assert {"resources/read", "aggregator.source.read"} <= received.span_names()
        # Each worker opened its own catalog, so each listed the collection and flushed that at its exit.
        listings = [s for r in received.requests for rs in r.resource_spans for ss in rs.scope_spans
                    for s in ss.spans if s.name == "aggregator.source.list"]
        assert len(listings) == 2


def test_an_mcp_upstream_call_nests_beneath_the_source_read(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    manifest = write_manifest(tmp_path, f"""
        version: 1
        server: {{name: outer}}
        sources:
          up: {{url: "mcp+stdio:", prefix: "test://", command: {UPSTREAM!r}, env: {{PYTHONPATH: "{ROOT}"}}}}
        collections:
          - {{source: up, glob: "static-*", uri: "wiki://{{path}}"}}
          - {{source: up, glob: "boom", uri: "wiki://{{path}}"}}
        """)

    async def main() -> None:
        async with served(manifest) as (service, _):
            spans.clear()
            assert (await service.read("wiki://static-text")).content.text == "Hello from one"
            found = spans.get_finished_spans()
            send = one(found, "MCP send resources/read")
            assert send.kind is SpanKind.CLIENT
            assert ancestry(send, found)[:2] == ["aggregator.source.read", "aggregator.cache.load"]
            spans.clear()
            with pytest.raises(ResourceUnavailable):
                await service.read("wiki://boom")
            failed = spans.get_finished_spans()
            # The upstream's error text names a secret: no span keeps it, the SDK's client span included.
            sent = one(failed, "MCP send resources/read")
            assert sent.status.status_code is StatusCode.ERROR and sent.attributes["error.type"] == "-32603"
            assert "SECRET" not in everything_said(failed)

    anyio.run(main)


def test_sdk_span_messages_are_scrubbed_and_types_kept(spans: InMemorySpanExporter) -> None:
    assert _PROVIDER is not None
    sdk = _PROVIDER.get_tracer(tracing.SDK_SCOPE)
    with pytest.raises(ValueError):
        with sdk.start_as_current_span("resources/read", kind=SpanKind.SERVER):
            raise ValueError("cannot open /srv/secret-path")
    with sdk.start_as_current_span("MCP send resources/read", kind=SpanKind.CLIENT) as client:
        client.set_status(StatusCode.ERROR, "upstream said: SECRET body")
    with _PROVIDER.get_tracer("someone-else").start_as_current_span("other") as other:
        other.set_status(StatusCode.ERROR, "kept as is")
    server, sent, kept = spans.get_finished_spans()
    assert [dict(e.attributes or {}) for e in server.events] == [{"exception.type": "ValueError"}]
    assert server.status.status_code is StatusCode.ERROR and server.status.description == "ValueError"
    assert sent.status.status_code is StatusCode.ERROR and sent.status.description is None
    assert kept.status.description == "kept as is"
