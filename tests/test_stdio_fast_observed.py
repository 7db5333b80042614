"""What an operator observes of requests the stdio fast path serves is what the SDK's path gives (issue 29, "nothing
lost"), on both wires: the access log (`--access-log`, the one per-request figure stdio has) counts each read and
listing once with the same outcome; a `notifications/cancelled` stops a read in flight and leaves it unanswered;
and with tracing on every request gets the SDK's span, as many and the same as with the path off. A real server
process fed a pipe, `AGGREGATOR_STDIO_FAST=1` against `=0`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests import http_server
from tests.conftest import server_params, write_manifest
from tests.test_stdio_fast import MODERN_META, _read
from tests.test_stdio_fast import _script as _reads

Run = tuple[dict[Any, dict[str, Any]], str]
WAIT = -1.0
"""A pause that waits for the answer to the message just sent (its first line)."""


def _request(request_id: object, method: str, wire: str, **params: Any) -> dict[str, Any]:
    meta = {"_meta": MODERN_META} if wire == "modern" else {}
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**params, **meta}}


def _script(wire: str) -> list[dict[str, Any]]:
    """test_stdio_fast's reads (hits, blobs, missing, malformed), listings and a bad cursor."""
    return [*_reads(wire), _request(40, "resources/list", wire), _request(41, "resources/list", wire, cursor="bad"),
            _request(42, "resources/templates/list", wire), _read(43, "docs://README.md", **(
                {"_meta": MODERN_META} if wire == "modern" else {}))]


def _run(manifest: Path, lines: list[tuple[dict[str, Any], float]], fast: bool, *args: str,
         **environ: str) -> Run:
    """Serve `manifest` over a pipe fed `lines` (each message, then a pause of that many seconds, or WAIT): the
    answers by id and stderr."""
    params = server_params(manifest, "--no-reload", "--access-log", *args)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env = {**clean, **(params.env or {}), "AGGREGATOR_STDIO_FAST": "1" if fast else "0", **environ}
    process = subprocess.Popen([params.command, "-m", "aggregator", "--log-format", "json", *params.args[2:]],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert process.stdin is not None and process.stdout is not None
    early = b""
    for message, pause in lines:
        process.stdin.write(json.dumps(message).encode() + b"\n")
        process.stdin.flush()
        if pause == WAIT:
            early += process.stdout.readline()
        time.sleep(max(pause, 0.0))
    out, err = process.communicate(timeout=60)
    out = early + out
    assert process.returncode == 0, err[-2000:]
    answers = [json.loads(line) for line in out.splitlines() if line.strip()]
    by_id = {a.get("id"): a for a in answers}
    assert len(by_id) == len(answers)
    return by_id, err.decode()


def _objects(stderr: str) -> list[dict[str, Any]]:
    """Every JSON object on stderr: the JSON log's lines and the console exporter's spans (indented, many lines)."""
    decoder, found, end = json.JSONDecoder(), [], 0
    for start in (m.start() for m in re.finditer(r"^\{", stderr, re.MULTILINE)):
        if start < end:
            continue  # inside the object decoded last
        try:
            value, end = decoder.raw_decode(stderr, start)
        except ValueError:
            continue
        found.append(value)
    return found


def _accessed(stderr: str) -> Counter[tuple[str, str, str, str]]:
    return Counter((o["caller"], o["method"], str(o["uri"]), o["outcome"]) for o in _objects(stderr)
                   if o.get("logger") == "aggregator.access")


@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_the_access_log_counts_fast_requests_as_the_sdk_does(docs_manifest: Path, wire: str) -> None:
    script = [(m, 0.0) for m in _script(wire)]
    (fast, fast_err), (slow, slow_err) = (_run(docs_manifest, script, on) for on in (True, False))
    assert fast == slow
    access = _accessed(fast_err)
    assert access == _accessed(slow_err)
    assert access[("stdio", "resources/read", "docs://README.md", "ok")] >= 2
    assert access[("stdio", "resources/read", "docs://missing.md", "not_found")] == 1
    assert access[("stdio", "resources/list", "None", "invalid")] == 1
    assert access[("stdio", "resources/templates/list", "None", "ok")] == 1


@pytest.mark.parametrize("pause", [0.5, 0.0], ids=["started", "at-once"])
@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_a_cancelled_read_is_stopped_and_unanswered_as_by_the_sdk(tmp_path: Path, wire: str, pause: float) -> None:
    """A read held by its upstream, cancelled once it runs or in the same write as the read itself: no answer, the
    next read answered, the access log the same (the handler ran and was cancelled: outcome error)."""
    with http_server.serve() as upstream:
        (tmp_path / "docs").mkdir()
        (tmp_path / "docs" / "a.md").write_text("# A\n")
        manifest = write_manifest(tmp_path, f"""
            version: 1
            server: {{name: cancelled}}
            sources:
              docs: {{url: ./docs}}
              web: {{url: "http://127.0.0.1:{upstream.port}/base/", allowPrivateNetwork: true}}
            resources:
              - {{uri: "web://gated", name: gated, source: web, path: gated}}
              - {{uri: "docs://a.md", name: a, source: docs, path: a.md}}
            """)
        opening = [(m, 0.0) for m in _reads(wire) if m.get("method") != "resources/read"]
        opening[0] = (opening[0][0], WAIT)  # the server is up before the read is sent
        meta = {"_meta": MODERN_META} if wire == "modern" else {}
        script = [*opening, (_read(5, "web://gated", **meta), pause),
                  ({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}}, 0.2),
                  (_read(6, "docs://a.md", **meta), 0.0)]
        runs = {}
        for on in (True, False):
            runs[on] = _run(manifest, script, on)
    (fast, fast_err), (slow, slow_err) = runs[True], runs[False]
    assert fast == slow and 5 not in fast and fast[6]["result"]["contents"][0]["text"] == "# A\n"
    access = _accessed(fast_err)
    assert access == _accessed(slow_err)
    assert access[("stdio", "resources/read", "web://gated", "error")] == 1


pytest.importorskip("opentelemetry.sdk", reason="the otel extra (opentelemetry-sdk) is not installed")


def _server_spans(stderr: str) -> Counter[tuple[str, str]]:
    return Counter((o["name"], str(o["attributes"].get("jsonrpc.request.id"))) for o in _objects(stderr)
                   if o.get("kind") == "SpanKind.SERVER")


@pytest.mark.parametrize("wire", ["legacy", "modern"])
def test_with_tracing_on_every_request_gets_its_span(docs_manifest: Path, wire: str) -> None:
    script = [(m, 0.0) for m in _script(wire)]
    tracing = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "10"}
    (fast, fast_err), (slow, slow_err) = (_run(docs_manifest, script, on, **tracing) for on in (True, False))
    assert fast == slow
    spans = _server_spans(fast_err)
    assert spans == _server_spans(slow_err)
    # Every read the path takes with tracing off (test_stdio_fast: hits, blob, inline, missing) has its span;
    # those the SDK's ladder refuses before its middleware (a bad envelope) have none either way.
    for request_id in (10, "s", 11, 12, 13, 14, 15, 0, 43):
        assert spans[("resources/read", str(request_id))] == 1, (request_id, spans)
    assert spans[("resources/list", "40")] == 1 and spans[("resources/templates/list", "42")] == 1
