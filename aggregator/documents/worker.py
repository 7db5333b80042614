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
        if not _ran_out_of_memory(exc) and not _came_near(limits.max_memory):
            return {"error": exc.why}, False
        return _over_memory(limits.max_memory), True
    except MemoryError:
        return _over_memory(limits.max_memory), True
    except ImportError as exc:
        return {"error": f"the converter for {header['format']} files is not installed ({exc.name})",
                "missing": exc.name}, False
    except RecursionError:
        return {"error": "it is nested too deeply to convert"}, False
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def _over_memory(max_memory: int) -> dict[str, Any]:
    return {"error": f"it needs more than {max_memory} bytes of memory to convert (limit convert.maxMemory)",
            "limit": "maxMemory"}


# What zlib (Z_MEM_ERROR), libxml2 and the C allocator say when an allocation fails under RLIMIT_AS.
_OUT_OF_MEMORY = ("memory allocation failed", "insufficient memory", "cannot allocate memory", "out of memory")


def _peak_address_space() -> int | None:
    """This process's peak address space in bytes (VmPeak), None where /proc does not tell."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmPeak:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _came_near(limit: int) -> bool:
    """Whether the address space reached within 1/8 of `limit` (since this worker started: one that fails for
    memory is replaced): an allocation past it then failed somewhere a parser reports as a broken file (the error
    it raises names no memory at all)."""
    peak = _peak_address_space()
    return peak is not None and peak >= limit - limit // 8


def _ran_out_of_memory(exc: BaseException) -> bool:
    """Whether a converter's "corrupt file" verdict hides an allocation that failed under the memory limit: the
    parsers turn a MemoryError met deep inside (zipfile, lxml, openpyxl's readers) into errors of their own, which
    the converters then call corrupt (seen under load: a 20,000-row XLSX at 64 MiB said "corrupt XLSX")."""
    seen: BaseException | None = exc
    for _ in range(16):  # a bounded walk: contexts can be long but never need to be followed far
        if seen is None:
            return False
        if isinstance(seen, MemoryError) or any(said in str(seen).lower() for said in _OUT_OF_MEMORY):
            return True
        seen = seen.__context__ or seen.__cause__
    return False


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
