"""Durations and sizes as people write them: `30s`, `5m`, `1h30m`, `250ms`; `10MiB`, `512KB`, `1024`.

The regular expressions below are also the schema's `$defs` patterns (a test keeps them in step), so an
editor flags exactly the strings the loader refuses.
"""

from __future__ import annotations

import math
import re

__all__ = ["DURATION_PATTERN", "SIZE_PATTERN", "format_size", "parse_duration", "parse_size"]

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
# KB/MB are powers of 1000 (as disks and networks count), KiB/MiB and the bare K/M/G/T of 1024.
_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
    "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4,
    "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4,
}

DURATION_PATTERN = r"^\s*(\d+(\.\d+)?\s*(ms|s|m|h|d|w)\s*)+$"
SIZE_PATTERN = r"^\s*(\d+\s*[bB]?|\d+(\.\d+)?\s*[kKmMgGtT][iI]?[bB]?)\s*$"

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def parse_duration(value: str | float) -> float:
    """Seconds in a duration such as `1h30m`; a bare number is seconds. ValueError for anything else."""
    # ValueError even for a wrong type: to whoever wrote `ttl: true`, that is a wrong value like any other.
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"expected a duration such as 30s or 5m, got {type(value).__name__}")  # noqa: TRY004
    if isinstance(value, (int, float)):
        return _non_negative_seconds(float(value))
    text = "".join(value.split())
    total, pos = 0.0, 0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if not text or pos != len(text):
        raise ValueError("not a duration: write e.g. 250ms, 30s, 5m, 1h30m, 1d, or a number of seconds")
    return total


def parse_size(value: str | int) -> int:
    """Bytes in a size such as `10MiB` (KB = 1000, KiB = 1024); a bare integer is bytes. ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"expected a size such as 10MiB, got {type(value).__name__}")  # noqa: TRY004
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    match = _SIZE.fullmatch(value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS or (unit in ("", "b") and "." in match.group(1)):
        raise ValueError("not a size: write e.g. 512KB, 10MiB, 1GiB, or a whole number of bytes")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def format_size(size: int) -> str:
    """A size as a manifest would write it: `4MiB`, `512KiB`, else bytes (`1000` -> `1000 bytes`)."""
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size} bytes"


def _non_negative_seconds(seconds: float) -> float:
    # NaN slips past a JSON Schema `minimum`; infinity would make a cache entry immortal by accident.
    if not math.isfinite(seconds):
        raise ValueError("a duration must be a finite number of seconds")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds
