"""`convert:` on a resource, collection or template, and `defaults.convert`: the limits of one document's
conversion, parsed from the manifest's units (an entry's own keys over the defaults)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from aggregator.manifest.model import ConvertSettings
from aggregator.manifest.units import parse_duration, parse_size
from aggregator.manifest.yaml_marks import KeyPath

__all__ = ["Parsed", "convert_limits", "entry_convert"]

_T = TypeVar("_T")
Parsed = Callable[[Callable[[Any], _T], dict[str, Any], str, KeyPath, _T], _T]
"""The loader's `parsed`: `spec[name]` through a unit parser, a located issue when refused."""


def convert_limits(parsed: Parsed[Any], spec: dict[str, Any], path: KeyPath, base: ConvertSettings) -> ConvertSettings:
    """`base` with the limits `spec` sets (defaults.convert, or an entry's `convert:` object)."""
    return ConvertSettings(
        to=spec.get("to", base.to),
        max_input_bytes=parsed(parse_size, spec, "maxInputBytes", path, base.max_input_bytes),
        max_unzipped_bytes=parsed(parse_size, spec, "maxUnzippedBytes", path, base.max_unzipped_bytes),
        max_pages=spec.get("maxPages", base.max_pages),
        max_rows=spec.get("maxRows", base.max_rows),
        max_chars=spec.get("maxChars", base.max_chars),
        timeout=parsed(parse_duration, spec, "timeout", path, base.timeout),
        max_memory=parsed(parse_size, spec, "maxMemory", path, base.max_memory),
    )


def entry_convert(parsed: Parsed[Any], spec: dict[str, Any], path: KeyPath,
                  defaults: ConvertSettings) -> ConvertSettings | None:
    """An entry's `convert:` (`markdown`, or an object with `to` and limits); None when it has none."""
    value = spec.get("convert")
    if value is None:
        return None
    if isinstance(value, dict):
        return convert_limits(parsed, value, path + ("convert",), defaults)
    return defaults
