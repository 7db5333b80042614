"""Durations and sizes: what people write, what the loader refuses, and the schema patterns kept in step."""

from __future__ import annotations

import math
import re

import pytest

from aggregator.manifest import load_schema
from aggregator.manifest.units import (
    DURATION_PATTERN,
    SIZE_PATTERN,
    parse_duration,
    parse_size,
)


@pytest.mark.parametrize(("text", "seconds"), [
    ("30s", 30), ("5m", 300), ("1h30m", 5400), ("1h 30m", 5400), ("250ms", 0.25), ("1d", 86400), ("2w", 1209600),
    ("1.5h", 5400), (" 10s ", 10), ("0s", 0), (12, 12), (0.5, 0.5), (0, 0),
])
def test_durations(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds
    if isinstance(text, str):
        assert re.match(DURATION_PATTERN, text), "the schema would refuse what the loader accepts"


@pytest.mark.parametrize("bad", ["", " ", "5", "5 minutes", "m5", "-1s", "1h 30x", "1.s", "5M", -1, True,
                                 math.nan, math.inf, None, [5]])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)  # type: ignore[arg-type]
    if isinstance(bad, str):
        assert not re.match(DURATION_PATTERN, bad), "the schema would accept what the loader refuses"


@pytest.mark.parametrize(("text", "size"), [
    ("10MiB", 10 * 1024**2), ("512KB", 512_000), ("1GiB", 1024**3), ("100", 100), ("1.5KiB", 1536),
    ("2mb", 2_000_000), ("3 B", 3), ("8k", 8192), ("1Ti", 1024**4), ("2T", 2 * 1024**4), ("1tb", 10**12),
    (1024, 1024), (0, 0),
])
def test_sizes(text: str | int, size: int) -> None:
    assert parse_size(text) == size
    if isinstance(text, str):
        assert re.match(SIZE_PATTERN, text), "the schema would refuse what the loader accepts"


@pytest.mark.parametrize("bad", ["lots", "10 XB", "", "MiB", "1.5", "1.5B", "-1KB", "10 MiBs", -5, False, 1.5, None])
def test_bad_sizes(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)  # type: ignore[arg-type]
    if isinstance(bad, str):
        assert not re.match(SIZE_PATTERN, bad), "the schema would accept what the loader refuses"


def test_schema_uses_the_same_patterns() -> None:
    defs = load_schema()["$defs"]
    assert defs["duration"]["pattern"] == DURATION_PATTERN
    assert defs["size"]["pattern"] == SIZE_PATTERN


def test_messages_do_not_echo_the_value() -> None:
    # Values may come from the environment; the loader locates the key, the message need not quote it.
    with pytest.raises(ValueError) as err:
        parse_duration("s3cret")
    assert "s3cret" not in str(err.value) and "30s" in str(err.value)
    with pytest.raises(ValueError) as err:
        parse_size("s3cret")
    assert "s3cret" not in str(err.value) and "10MiB" in str(err.value)
