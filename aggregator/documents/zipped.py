"""Office files are zip archives: their parts' uncompressed sizes are summed from the central directory before any
parser opens them, so a zip bomb is refused unread. Python's zipfile never inflates a part past the size its entry
declares, so the declared sizes bound what the parsers can read."""

from __future__ import annotations

import io
import zipfile

from aggregator.documents.failures import ConversionFailed, OverLimit

__all__ = ["MAX_PARTS", "check_zip"]

MAX_PARTS = 10_000
"""Parts an Office file may hold (a real one has tens to a few hundred)."""
_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
"""An OLE compound file: what Office writes for a password-protected document (and .doc, .xls, .ppt)."""


def check_zip(data: bytes, what: str, max_unzipped: int) -> zipfile.ZipFile:
    """The archive, once its parts are known to fit `max_unzipped` bytes uncompressed; ConversionFailed if it is not
    a zip archive (`what` names the format), OverLimit past the limits."""
    if data.startswith(_OLE_MAGIC):
        raise ConversionFailed(f"it is a password-protected {what} file, or an old binary Office file")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, OSError):
        raise ConversionFailed(f"it is not a valid {what} file (not a zip archive)") from None
    parts = archive.infolist()
    if len(parts) > MAX_PARTS:
        raise ConversionFailed(f"it holds {len(parts)} zip parts; a {what} file holds far fewer")
    total = sum(part.file_size for part in parts)
    if total > max_unzipped:
        raise OverLimit(f"its parts hold {total} bytes uncompressed, more than {max_unzipped}", "maxUnzippedBytes")
    if any(part.flag_bits & 0x1 for part in parts):
        raise ConversionFailed(f"it is an encrypted {what} file")
    return archive
