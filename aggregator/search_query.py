"""The arguments of discovery: a search query's words, a limit, a search:// URI, and the errors they raise.

A query is text, never syntax: only its words (`\\w+`, optionally ending in `*`) are kept, so no input reaches the
full-text index as an operator. Every message here is safe for clients.
"""

from __future__ import annotations

import re

from aggregator.errors import RequestError
from aggregator.templates import UriTemplate

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "SEARCH_SCHEME", "SEARCH_TEMPLATE", "InvalidSearch", "parse_limit",
           "parse_search_uri", "query_terms"]

SEARCH_TEMPLATE = "search://{?q,prefix,limit}"
SEARCH_SCHEME = "search:"
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
MAX_QUERY_CHARS = 1000
MAX_TERMS = 16
_TERM = re.compile(r"(\w+)(\*?)")
_SEARCH = UriTemplate.parse(SEARCH_TEMPLATE)


class InvalidSearch(RequestError):
    """Arguments a search or listing cannot use; the message says which (it is safe for clients)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


def query_terms(query: str) -> list[tuple[str, bool]]:
    """The words of a query (lower-cased, at most MAX_TERMS) and whether each ends in `*` (a prefix search).
    Anything else a query holds (quotes, operators, brackets) is a separator: a query is text, never syntax."""
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidSearch(f"the query is longer than {MAX_QUERY_CHARS} characters")
    terms = [(word.lower(), bool(star)) for word, star in _TERM.findall(query)]
    return list(dict.fromkeys(terms))[:MAX_TERMS]


def parse_limit(value: object, default: int = DEFAULT_LIMIT, most: int = MAX_LIMIT) -> int:
    """A limit given as a number or its text, between 1 and `most`; `default` when absent or empty."""
    if value is None or value == "":
        return default
    try:
        limit = int(str(value))
    except ValueError:
        raise InvalidSearch("limit must be a whole number") from None
    if not 1 <= limit <= most:
        raise InvalidSearch(f"limit must be between 1 and {most}")
    return limit


def parse_search_uri(uri: str) -> tuple[str, str, int]:
    """(q, prefix, limit) of a search:// URI; InvalidSearch if it is not one."""
    values = _SEARCH.match(uri)
    if values is None:
        raise InvalidSearch(f"a search URI looks like {SEARCH_TEMPLATE}, e.g. search://?q=install&limit=5")
    q, prefix = values.get("q") or "", values.get("prefix") or ""
    if not isinstance(q, str) or not isinstance(prefix, str):
        raise InvalidSearch("q and prefix are single values")
    return q, prefix, parse_limit(values.get("limit"))
