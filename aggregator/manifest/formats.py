"""The schema's `format` checks, our own (jsonschema's optional ones depend on which extra packages happen to be
installed): each takes any value, checks strings only, and raises ValueError saying what is wrong."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime

__all__ = ["FORMATS"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")


def _is_date_time(value: object) -> bool:
    if isinstance(value, str):
        try:
            if not _DATE_TIME.match(value):
                raise ValueError
            datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value)
        except ValueError:
            raise ValueError("expected an ISO 8601 date and time such as 2026-01-15T09:00:00Z") from None
    return True


def _is_uri(value: object) -> bool:
    if isinstance(value, str):
        if not _SCHEME.match(value):
            raise ValueError("a URI starts with a scheme, such as docs: or https:")
        if any(c in value for c in " \t\r\n\"<>\\^`{|}"):
            raise ValueError("a URI cannot hold spaces, quotes, braces or backslashes (percent-encode them)")
    return True


def _is_uri_template(value: object) -> bool:
    # Imported here: the manifest layer must not need the template engine just to be imported.
    from aggregator.templates import UriTemplate

    if isinstance(value, str):
        UriTemplate.parse(value)
        if not _SCHEME.match(value):
            raise ValueError("a URI template starts with a scheme, such as docs:")
    return True


FORMATS: dict[str, Callable[[object], bool]] = {
    "date-time": _is_date_time, "uri": _is_uri, "uri-template": _is_uri_template}
"""Format name -> its check (ValueError, TemplateSyntaxError among them, when the value does not conform)."""
