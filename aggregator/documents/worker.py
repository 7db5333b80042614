"""A conversion worker process (`python -m aggregator.documents.worker`): converts one document at a time for the
pool (pool.py), over its stdin and stdout. Messages are a 4-byte big-endian length and that many bytes: a request
is a JSON header (format, limits, and `within` on a second attempt) then the document; a reply a JSON header
(`converted`, or `error` with `limit` or `recheck`; `peak`, its address space's peak; `leave` when it exits after
it) then the Markdown in UTF-8 (empty when not converted).

It loads every converter's library before saying it is ready (one byte), so a conversion's time limit counts the
conversion only. Each conversion runs under the request's address-space limit (RLIMIT_AS); a worker that ran out of
memory says so and exits (its heap may be left half-used). A parser's "unreadable" verdict is not final: the worker
asks for a `recheck` and exits, and the pool converts the document again in a fresh worker with more memory, whose
verdict is the limit's if its peak went past the first attempt's limit (`within`), else its own. End of input (the
server went away) ends it."""

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
PIPE_MAX = 1024 * 1024
"""Bytes each pipe to and from a worker holds (the default pipe-max-size of unprivileged processes)."""
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


def write_message(stream: BinaryIO, *bodies: bytes) -> None:
    """Each body as one length-prefixed message, flushed together."""
    for body in bodies:
        stream.write(_LENGTH.pack(len(body)))
        stream.write(body)
    stream.flush()


def _wide_pipes(*streams: BinaryIO) -> None:
    """Pipes of PIPE_MAX bytes (Linux; best effort): a document and its Markdown cross in one or two writes, not
    a wake-up of the other process every 64 KiB."""
    import fcntl

    for stream in streams:
        try:
            fcntl.fcntl(stream.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_MAX)
        except OSError:  # not a pipe, or past /proc/sys/fs/pipe-max-size: the default size works, a little slower
            pass


_NOT_LOADED = ("numpy",)
"""Libraries a converter would load only because they are installed: openpyxl imports numpy when it can (to know
its number types), and numpy's BLAS maps tens of MiB of address space for its threads, which a conversion's
RLIMIT_AS counts (a 100,000-row sheet went past 160 MiB in a venv with numpy). No converter needs them."""


def _preload() -> None:
    for name in _NOT_LOADED:  # an import of these fails (ImportError) in this process, as if they were absent
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    for module in ("pypdfium2", "docx", "pptx", "openpyxl"):
        try:
            __import__(module)
        except ImportError:  # that format then fails with a clear error; the others still convert
            pass


def _reply(request: bytes, document: bytes) -> tuple[dict[str, Any], bool]:
    """The reply to one request, and whether this worker must exit after sending it."""
    header = json.loads(request)
    limits = limits_from(header)
    within: int | None = header.get("within")
    """Set on a second attempt (a fresh worker, more memory): the limit the first attempt was held to."""
    outcome = _attempt(document, header["format"], limits)
    peak = _peak_address_space()
    over = within is not None and peak is not None and peak > within
    held_to = limits.max_memory if within is None else within
    reply, leave = _verdict(outcome, header["format"], held_to, within is None, over)
    return {**reply, "peak": peak}, leave


def _attempt(document: bytes, fmt: str, limits: ConvertSettings) -> str | Exception:
    """The Markdown, or what stopped it; the conversion alone runs under the memory limit (what follows must not
    fail for want of memory)."""
    from aggregator.documents.convert import convert

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (limits.max_memory if hard == resource.RLIM_INFINITY
                                            else min(limits.max_memory, hard), hard))
    try:
        return convert(document, fmt, limits)
    except Exception as exc:  # MemoryError and RecursionError included: judged with the limit lifted
        return exc
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def _verdict(outcome: str | Exception, fmt: str, held_to: int, first: bool, over: bool) -> tuple[dict[str, Any], bool]:
    """The reply for a conversion's outcome. `first`: the first attempt, whose "unreadable" verdict is not final;
    `over`: a second attempt went past the limit the first was `held_to` (its verdict is then that limit)."""
    from aggregator.documents.failures import ConversionFailed, OverLimit, Unreadable

    if isinstance(outcome, str):
        return (_over_memory(held_to), True) if over else ({"text": outcome}, False)
    if isinstance(outcome, OverLimit):
        return {"error": outcome.why, "limit": outcome.key}, False
    if isinstance(outcome, MemoryError) or _ran_out_of_memory(outcome):
        return _over_memory(held_to), True
    if isinstance(outcome, ImportError):
        return {"error": f"the converter for {fmt} files is not installed ({outcome.name})",
                "missing": outcome.name}, False
    if isinstance(outcome, RecursionError):
        return {"error": "it is nested too deeply to convert"}, False
    if isinstance(outcome, ConversionFailed) and not isinstance(outcome, Unreadable):
        return {"error": outcome.why}, False  # decided before parsing (a header, the zip's directory): no memory
    # A parser gave up (Unreadable), or a converter failed in a way it did not expect: a corrupt file, or an
    # allocation that failed and came out as something else. A fresh worker with more memory tells which.
    why = outcome.why if isinstance(outcome, ConversionFailed) else "the converter failed on it (see the server log)"
    if not isinstance(outcome, ConversionFailed):
        print(f"conversion failed unexpectedly: {type(outcome).__name__}: {outcome}", file=sys.stderr)
    if first:
        return {"error": why, "recheck": True}, True
    return (_over_memory(held_to), True) if over else ({"error": why}, False)


def _over_memory(max_memory: int) -> dict[str, Any]:
    return {"error": f"it needs more than {max_memory} bytes of memory to convert (limit convert.maxMemory)",
            "limit": "maxMemory"}


# What zlib, libxml2 and the C allocator say when an allocation fails under RLIMIT_AS ("Error -4": Z_MEM_ERROR).
_OUT_OF_MEMORY = ("memory allocation failed", "insufficient memory", "cannot allocate memory", "out of memory",
                  "error -4 while")


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


def _ran_out_of_memory(exc: BaseException) -> bool:
    """Whether an error says, somewhere in its chain, that an allocation failed: a MemoryError, or the message zlib,
    libxml2 or the allocator give one (what a parser then raised names no memory at all)."""
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
    _wide_pipes(source, out)
    _preload()
    out.write(READY)
    out.flush()
    while True:
        request = read_message(source)
        document = read_message(source) if request is not None else None
        if request is None or document is None:
            return 0
        reply, leave = _reply(request, document)
        text = reply.pop("text", None)  # sent as it is: JSON would escape every non-ASCII character (6 bytes each)
        head = json.dumps({**reply, "converted": text is not None, "leave": leave}).encode("utf-8")
        write_message(out, head, b"" if text is None else text.encode("utf-8", "surrogatepass"))
        if leave:
            return 3


if __name__ == "__main__":
    sys.exit(main())
