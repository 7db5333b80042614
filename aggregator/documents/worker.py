"""A conversion worker process (`python -m aggregator.documents.worker`): converts one document at a time for the
pool (pool.py), over its stdin and stdout. Messages are a 4-byte big-endian length and that many bytes: a request
is a JSON header (format, limits) then the document, a reply one JSON object (`text`, or `error` and `limit`).

It loads every converter's library before saying it is ready (one byte), so a conversion's time limit counts the
conversion only. Each conversion runs under the request's address-space limit (RLIMIT_AS); a worker that ran out of
memory says so and exits (its heap may be left half-used). End of input (the server went away) ends it."""

from __future__ import annotations

import json
import os
import resource
import struct
import sys
from dataclasses import fields
from typing import Any, BinaryIO

from aggregator.manifest.model import ConvertSettings

__all__ = ["READY", "limits_from", "main", "read_message", "write_message"]

READY = b"R"
_LENGTH = struct.Struct(">I")


def limits_from(header: dict[str, Any]) -> ConvertSettings:
    names = {f.name for f in fields(ConvertSettings)}
    return ConvertSettings(**{k: v for k, v in header["limits"].items() if k in names})


def read_message(stream: BinaryIO) -> bytes | None:
    """One length-prefixed message; None at end of input."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(head)
    body = stream.read(length)
    return body if len(body) == length else None


def write_message(stream: BinaryIO, body: bytes) -> None:
    stream.write(_LENGTH.pack(len(body)) + body)
    stream.flush()


def _preload() -> None:
    for module in ("pypdfium2", "docx", "pptx", "openpyxl"):
        try:
            __import__(module)
        except ImportError:  # that format then fails with a clear error; the others still convert
            pass


def _reply(request: bytes, document: bytes) -> tuple[dict[str, Any], bool]:
    """The reply to one request, and whether this worker must exit after sending it."""
    from aggregator.documents.convert import convert
    from aggregator.documents.failures import ConversionFailed, OverLimit

    header = json.loads(request)
    limits = limits_from(header)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (limits.max_memory if hard == resource.RLIM_INFINITY
                                            else min(limits.max_memory, hard), hard))
    try:
        return {"text": convert(document, header["format"], limits)}, False
    except OverLimit as exc:
        return {"error": exc.why, "limit": exc.key}, False
    except ConversionFailed as exc:
        return {"error": exc.why}, False
    except MemoryError:
        return {"error": f"it needs more than {limits.max_memory} bytes of memory to convert (limit "
                         "convert.maxMemory)", "limit": "maxMemory"}, True
    except ImportError as exc:
        return {"error": f"the converter for {header['format']} files is not installed ({exc.name})",
                "missing": exc.name}, False
    except RecursionError:
        return {"error": "it is nested too deeply to convert"}, False
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def main() -> int:
    # Replies go to a private copy of stdout; fd 1 becomes stderr, so a library's print cannot corrupt a reply.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    source = sys.stdin.buffer
    _preload()
    out.write(READY)
    out.flush()
    while True:
        request = read_message(source)
        document = read_message(source) if request is not None else None
        if request is None or document is None:
            return 0
        try:
            reply, leave = _reply(request, document)
        except Exception as exc:  # a converter's own bug: the document fails, the worker goes on
            print(f"conversion failed unexpectedly: {type(exc).__name__}: {exc}", file=sys.stderr)
            reply, leave = {"error": "the converter failed on it (see the server log)"}, False
        write_message(out, json.dumps(reply).encode("utf-8"))
        if leave:
            return 3


if __name__ == "__main__":
    sys.exit(main())
