"""Durations and sizes as people write them: `30s`, `5m`, `1h30m`, `250ms`; `10MiB`, `512KB`, `1024`."""

from __future__ import annotations

import re

__all__ = ["DURATION_PATTERN", "SIZE_PATTERN", "parse_duration", "parse_size"]

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
    "k": 1024, "m": 1024**2, "g": 1024**3,
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
# Kept in step with the schema's $defs so editors flag the same strings the loader refuses.
DURATION_PATTERN = r"^\s*(\d+(\.\d+)?(ms|s|m|h|d)\s*)+$"
SIZE_PATTERN = r"^\s*\d+(\.\d+)?\s*([kKmMgGtT]i?[bB]?|[bB])?\s*$"


def parse_duration(value: str | int | float) -> float:
    """Seconds in a duration; ValueError for anything else. A bare number is seconds."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    text = value.strip().replace(" ", "")
    if not text:
        raise ValueError("empty duration")
    total, pos = 0.0, 0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text):
        raise ValueError(f"{value!r} is not a duration (write e.g. 250ms, 30s, 5m, 1h30m, 1d)")
    return total


def parse_size(value: str | int) -> int:
    """Bytes in a size; ValueError for anything else. KB/MB are powers of 1000, KiB/MiB of 1024."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(value))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(f"{value!r} is not a size (write e.g. 512KB, 10MiB, 1GiB or a number of bytes)")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])
