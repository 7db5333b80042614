from __future__ import annotations

import re

import pytest

from aggregator.manifest.units import DURATION_PATTERN, SIZE_PATTERN, parse_duration, parse_size


@pytest.mark.parametrize(("text", "seconds"), [
    ("30s", 30), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25), ("1d", 86400), (12, 12), (0.5, 0.5), ("1.5h", 5400),
])
def test_durations(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds
    if isinstance(text, str):
        assert re.match(DURATION_PATTERN, text)


@pytest.mark.parametrize("bad", ["", "5", "5 minutes", "m5", "-1s", -1, True, "1h 30x"])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "size"), [
    ("10MiB", 10 * 1024**2), ("512KB", 512_000), ("1GiB", 1024**3), (1024, 1024), ("100", 100), ("1.5KiB", 1536),
    ("2mb", 2_000_000), ("3 B", 3),
])
def test_sizes(text: str | int, size: int) -> None:
    assert parse_size(text) == size
    if isinstance(text, str):
        assert re.match(SIZE_PATTERN, text)


@pytest.mark.parametrize("bad", ["lots", "10 XB", "", -5, False, "MiB"])
def test_bad_sizes(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)  # type: ignore[arg-type]
