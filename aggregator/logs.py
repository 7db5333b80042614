"""Logging on stderr (stdout is the protocol over stdio), as text or as one JSON object per line."""

from __future__ import annotations

import datetime
import json
import logging
import sys

__all__ = ["JsonFormatter", "setup_logging"]

# Attributes every LogRecord has; anything else was passed with `extra=` and belongs in the JSON object.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, pid (which worker), message, the record's `extra` fields, and any exception."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(
                   timespec="milliseconds").replace("+00:00", "Z"),
               "level": record.levelname, "logger": record.name, "pid": record.process,
               "message": record.getMessage()}
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        line = json.dumps(out, default=str, ensure_ascii=False)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (a file name that is not UTF-8, as os.fsdecode keeps it)
            line = json.dumps(_visible(out), default=str, ensure_ascii=False)
        return line


def _visible(value: object) -> object:
    """`value` with each lone surrogate of its strings written out as its escape (`caf\\udce9`), as text: stderr
    would write the character itself as that escape inside a JSON string, which then reads as a lone surrogate, and
    a strict JSON reader refuses the line."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_visible(k): _visible(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_visible(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return _visible(str(value))  # what `default=str` would write of it


def setup_logging(level: str, fmt: str = "text") -> None:
    """Route every log record to stderr at `level` (DEBUG, INFO, WARNING, ERROR), as `fmt` text or json."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # watchfiles logs every batch of changes at INFO: noise, and a feedback loop when logs go into a watched folder.
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
