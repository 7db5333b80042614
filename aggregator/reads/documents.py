"""The step after a `convert:` file's bytes are read: its conversion to Markdown in the worker pool, failures
turned into errors naming the URI and, for a limit, the limit (documents/ does the work)."""

from __future__ import annotations

import logging

import anyio

from aggregator.catalog import FileTarget
from aggregator.content import Content, served_name
from aggregator.documents.failures import ConversionFailed
from aggregator.documents.formats import CONVERTED_MIME_TYPES, document_format, install_hint
from aggregator.documents.pool import ConverterMissing, DocumentPool
from aggregator.errors import ResourceNotConverted, ResourceUnavailable
from aggregator.manifest.model import ConvertSettings

__all__ = ["convert_file"]

logger = logging.getLogger("aggregator")


async def convert_file(target: FileTarget, convert: ConvertSettings, data: bytes, pool: DocumentPool,
                       background: anyio.Event | None = None) -> Content:
    """`data` (the file `target` names) as Markdown; ResourceNotConverted saying why not. With `background` (the
    search indexer's read) it waits for a background turn in the pool until that event is set."""
    fmt = document_format(served_name(target.path, target.decompress))
    if fmt is None:  # the catalog converts only files of a known format
        raise ResourceNotConverted(target.uri, "its format is not one convert reads")
    try:
        text = await pool.convert(data, fmt, convert, background is not None, background)
    except ConverterMissing as exc:
        logger.error("read %s: %s: install it with %s", target.uri, exc.why, install_hint())
        raise ResourceUnavailable(target.uri, f"{exc.why}; {install_hint()}") from None
    except ConversionFailed as exc:
        logger.warning("read %s: not converted: %s", target.uri, exc.why)
        raise ResourceNotConverted(target.uri, exc.why) from None
    return Content(CONVERTED_MIME_TYPES[convert.to], text=text)
