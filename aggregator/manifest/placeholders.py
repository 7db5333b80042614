"""The `{name}` placeholders of a manifest's path and pattern strings: one spelling for the checks and the runtime.

A collection's `uri`, `name` and `title` are patterns over the file placeholders; a template's `path` names its URI
template's variables. The checks reject any other name in braces, so the runtime only meets known ones.
"""

from __future__ import annotations

import re

__all__ = ["FILE_PLACEHOLDERS", "PLACEHOLDER"]

PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
"""`{name}`; group 1 is the name (anything but braces, so the checks can report a misspelt one)."""

FILE_PLACEHOLDERS = ("path", "name", "stem", "ext")
"""What a collection pattern may name of each file: {path} inside the source, {name} the file name, {stem} the name
without extension, {ext} the extension without its dot."""
