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
        return json.dumps(out, default=str, ensure_ascii=False)


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
