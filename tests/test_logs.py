"""JSON log lines are valid UTF-8 JSON whatever a record holds: a lone surrogate (a file name that is not UTF-8, as
os.fsdecode keeps it) is written out as its escape, as text, and everything else as it was."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from aggregator.logs import JsonFormatter


def _line(message: str, **extra: object) -> str:
    """What a logger with the JSON formatter writes to a stream that, like stderr, backslash-escapes what UTF-8
    cannot encode."""
    stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.Logger("test.logs")
    logger.addHandler(handler)
    logger.warning("%s", message, extra=extra)
    return stream.buffer.getvalue().decode("utf-8")  # type: ignore[attr-defined]


def _strict(line: str) -> dict[str, object]:
    """`line` parsed as a strict reader does: no lone surrogate in any string."""
    parsed = json.loads(line)
    assert isinstance(parsed, dict)
    json.dumps(parsed, ensure_ascii=False).encode("utf-8")  # UnicodeEncodeError for a lone surrogate
    return parsed


def test_a_file_name_that_is_not_utf8_is_logged_as_its_escape() -> None:
    name = "docs/caf\udce9.md"
    parsed = _strict(_line(f"cannot read {name}", path=Path(name), names=[name], where={"file": name}))
    assert parsed["message"] == "cannot read docs/caf\\udce9.md"
    assert parsed["path"] == parsed["names"][0] == parsed["where"]["file"] == "docs/caf\\udce9.md"  # type: ignore[index]


@given(st.text(st.characters(codec="utf-8")))
def test_text_without_lone_surrogates_is_logged_as_it_is(message: str) -> None:
    assert _strict(_line(message, count=3))["message"] == message


@given(st.tuples(st.text(), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), st.text()).map("".join))
def test_any_text_gives_a_line_a_strict_reader_takes(message: str) -> None:
    parsed = _strict(_line(message))
    assert parsed["message"] == message.encode("utf-8", "backslashreplace").decode("utf-8")
