"""Resource bodies: the one MIME type decision, gzip decompression, and the text-or-binary decision."""

from __future__ import annotations

import mimetypes
import zlib
from dataclasses import dataclass
from functools import lru_cache

QUERY_FORMATS = {"json": "application/json", "csv": "text/csv", "markdown": "text/markdown"}
"""The media type of a query template's result in each `format:` it may ask for."""

__all__ = ["Content", "GzipError", "GzipTooLarge", "decode_body", "file_mime_type", "guess_mime_type", "gunzip",
           "is_text_mime", "served_name"]

_EXTRA_TYPES = {
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".mdx": "text/markdown",
    ".rst": "text/x-rst",
    ".adoc": "text/asciidoc",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
    ".toml": "application/toml",
    ".json": "application/json",
    ".jsonl": "application/jsonl",
    ".ndjson": "application/x-ndjson",
    ".csv": "text/csv",
    ".tsv": "text/tab-separated-values",
    ".ts": "text/x-typescript",
    ".tsx": "text/x-typescript",
    ".py": "text/x-python",
    ".go": "text/x-go",
    ".rs": "text/x-rust",
    ".sql": "application/sql",
    ".sh": "text/x-shellscript",
    ".ini": "text/plain",
    ".cfg": "text/plain",
    ".log": "text/plain",
    ".txt": "text/plain",
    ".svg": "image/svg+xml",
    ".webp": "image/webp",
    ".parquet": "application/vnd.apache.parquet",
}
_TEXT_APPLICATION_TYPES = {
    "application/json",
    "application/jsonl",
    "application/x-ndjson",
    "application/xml",
    "application/yaml",
    "application/x-yaml",
    "application/toml",
    "application/javascript",
    "application/ecmascript",
    "application/sql",
    "application/x-sh",
    "application/graphql",
}
# A compressed file is what its bytes are: `notes.txt.gz` is gzip, not text (mimetypes calls it text/plain).
_COMPRESSED_TYPES = {
    ".gz": "application/gzip",
    ".tgz": "application/gzip",
    ".svgz": "application/gzip",
    ".bz2": "application/x-bzip2",
    ".xz": "application/x-xz",
    ".zst": "application/zstd",
}
GZIP_SUFFIX = ".gz"
_SNIFF_BYTES = 8192
_GUNZIP_CHUNK = 64 * 1024


@dataclass(slots=True)
class Content:
    """A resource body ready to serve: exactly one of `text` and `blob` is set."""

    mime_type: str
    text: str | None = None
    blob: bytes | None = None
    max_age: float | None = None
    """Seconds the backend said this may be kept (an MCP upstream's ttlMs), None when it said nothing."""
    private: bool = False
    """The backend said this depends on who asked (an MCP upstream's cacheScope private): never kept or shared."""

    @property
    def nbytes(self) -> int:
        """Approximate memory held, for the cache's byte budget."""
        if self.text is not None:
            # str stores 1, 2 or 4 bytes a character; len(encode) would cost a copy.
            return len(self.text) * (1 if self.text.isascii() else 4) + 64
        return len(self.blob or b"") + 64


def guess_mime_type(path: str) -> str | None:
    """The MIME type a file name suggests (compressed names are their compressor's type), or None.

    Only the last path segment counts: `what?#frag.md` is Markdown, whatever `?` and `#` would mean in a URL."""
    name = path.rsplit("/", 1)[-1]
    dot = name.rfind(".")
    if dot == -1:
        return None
    suffix = name[dot:].lower()
    known = _COMPRESSED_TYPES.get(suffix) or _EXTRA_TYPES.get(suffix)
    if known:
        return known
    # A dummy folder keeps mimetypes from reading the name as a URL (it splits at '?' and '#' otherwise).
    return mimetypes.guess_type("x/x" + suffix, strict=False)[0]


def served_name(path: str, decompress: bool) -> str:
    """The name whose type a file is served with: without `.gz` when the entry decompresses it."""
    if decompress and path.lower().endswith(GZIP_SUFFIX) and len(path.rsplit("/", 1)[-1]) > len(GZIP_SUFFIX):
        return path[: -len(GZIP_SUFFIX)]
    return path


def is_gzip_name(path: str) -> bool:
    """Whether `decompress: true` decompresses this file (its name ends in `.gz`)."""
    return served_name(path, True) != path


def file_mime_type(path: str, declared: str | None = None, decompress: bool = False) -> str | None:
    """The mimeType a file is listed and read with: the manifest's declared type, else what its name says (the
    name without `.gz` when decompressed), else None (a read then serves text/plain or application/octet-stream by
    looking at the bytes). Listings, reads and template reads all ask this function."""
    return declared or guess_mime_type(served_name(path, decompress))


class GzipError(ValueError):
    """The bytes are not a complete gzip stream."""


class GzipTooLarge(Exception):
    """Decompressing would give more than the limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} bytes once decompressed")
        self.limit = limit


def gunzip(data: bytes, max_bytes: int) -> bytes:
    """The decompressed bytes of one or more gzip members; GzipTooLarge as soon as they pass `max_bytes` (at most
    `max_bytes + 1` bytes are ever decompressed: a gzip bomb costs no more memory than the limit), GzipError if
    the data is corrupt or truncated."""
    if not data:
        raise GzipError("empty file")
    out = bytearray()
    pending = data
    while pending:
        stream = zlib.decompressobj(wbits=31)  # 31: a gzip header and trailer, CRC checked
        while True:
            try:
                chunk = stream.decompress(pending, min(_GUNZIP_CHUNK, max_bytes + 1 - len(out)))
            except zlib.error as exc:
                raise GzipError(str(exc)) from None
            out += chunk
            if len(out) > max_bytes:
                raise GzipTooLarge(max_bytes)
            if stream.eof:
                pending = stream.unused_data
                break
            pending = stream.unconsumed_tail
            if not pending and not chunk:
                raise GzipError("truncated gzip data")
        # Zero padding after the last member (some tools write it) ends the data.
        if not pending.strip(b"\x00"):
            break
    return bytes(out)


@lru_cache(maxsize=256)  # a handful of types serve nearly every read: a C-level lookup, not the parse, per read
def is_text_mime(mime_type: str) -> bool:
    """True for MIME types whose bodies are text (text/*, JSON, XML, YAML and their +suffix forms)."""
    base = mime_type.split(";", 1)[0].strip().lower()
    return (
        base.startswith("text/")
        or base in _TEXT_APPLICATION_TYPES
        or base.endswith(("+json", "+xml", "+yaml"))
    )


def decode_body(data: bytes | None, mime_type: str | None, max_age: float | None = None, private: bool = False,
                decoded: str | None = None) -> Content:
    """Text when the type says text (or, untyped, the bytes look like text) and the bytes are UTF-8; else a blob.
    `max_age` and `private` are what the backend said of it (`Content`'s); `decoded`, the text `data` is the UTF-8
    of, when the backend sent it so (not decoded again); `data` None: that UTF-8, encoded only if a blob needs it."""
    if mime_type is None:
        if data is None:
            data = (decoded or "").encode("utf-8")
        looks_text = b"\x00" not in data[:_SNIFF_BYTES]
        text = _utf8(data, decoded) if looks_text else None
        if text is not None:
            return Content("text/plain", text, None, max_age, private)
        return Content("application/octet-stream", None, data, max_age, private)
    if is_text_mime(mime_type):
        text = _utf8(data, decoded)
        if text is not None:
            return Content(mime_type, text, None, max_age, private)
    return Content(mime_type, None, data if data is not None else (decoded or "").encode("utf-8"), max_age, private)


def _utf8(data: bytes | None, decoded: str | None) -> str | None:
    if decoded is None:
        if data is None:
            return None
        try:
            decoded = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
    # A byte-order mark is an encoding artefact, not content.
    return decoded[1:] if decoded.startswith("\ufeff") else decoded
