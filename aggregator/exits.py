"""How an `aggregator` command ends: its exit codes, and a manifest's problems reported (stderr, or JSON on stdout)."""

from __future__ import annotations

import json
import sys

from aggregator.manifest.model import ManifestError

__all__ = ["EXIT_INVALID", "EXIT_OK", "EXIT_USAGE", "report"]

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
"""Bad usage: a manifest that cannot be read, options that do not go together, an `--http` address `serve` cannot
listen on (in use, not on this machine, not resolved, privileged)."""


def report(error: ManifestError, fmt: str = "text") -> None:
    """The manifest's problems: one per line on stderr, or (`fmt` json) `{"valid": false, "errors": [...]}` on
    stdout."""
    if fmt == "json":
        print(json.dumps({"valid": False, "errors": [i.to_dict() for i in error.issues]}, indent=2))
    else:
        for issue in error.issues:
            print(issue, file=sys.stderr)
