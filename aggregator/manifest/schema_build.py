"""The manifest JSON Schema assembled from the registered source kinds: a source entry takes the keys every source
has (below) and each kind's own (`SourceKind.settings`); the loader then refuses a key of another kind.

`schemas/manifest.schema.json` is this assembly over the built-in kinds (a test checks it): edit a kind's keys in
its declaration and the rest in that file, then `python -m aggregator.manifest.schema_build --write` rewrites it
(without `--write` it prints the assembly, installed kinds included, as `aggregator schema` does).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import sys
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from aggregator.sources.kind import SourceKind

__all__ = ["COMMON_SOURCE_KEYS", "PUBLISHED", "build_schema", "dump_schema", "published_schema", "published_text",
           "source_key_owners"]

log = logging.getLogger(__name__)

SCHEMA_FILE = "manifest.schema.json"
PUBLISHED = Path(__file__).resolve().parents[2] / "schemas" / SCHEMA_FILE
"""The published schema in a source checkout."""

_DURATION = {"$ref": "#/$defs/duration"}

COMMON_SOURCE_KEYS: dict[str, dict[str, Any]] = {
    "url": {"description": "Where content lives: ", "type": "string", "minLength": 1},
    "ttl": {"description": "Cache lifetime of this source's content; overrides defaults.ttl.", **_DURATION},
    "maxBytes": {"description": "Largest body read from this source; overrides defaults.maxBytes.",
                 "$ref": "#/$defs/size"},
    "description": {"description": "What this source holds, for people reading the manifest.", "type": "string"},
    "timeout": {"description": "How long one backend call may take; overrides defaults.timeout.", **_DURATION},
    "maxConcurrency": {"description": "Backend calls in flight at once; overrides defaults.maxConcurrency.",
                       "type": "integer", "minimum": 1, "maximum": 1024},
    "staleIfError": {"description": "How long past expiry a cached copy may be served while the backend fails; "
                                    "overrides defaults.staleIfError.", **_DURATION},
    "optional": {"description": "A source that cannot be opened (e.g. a missing SQLite file or folder) or listed is "
                                "skipped with a warning, and the rest serves (its collections list nothing, its reads "
                                "fail; a reload tries it again); validate reports that, being unreachable, or a file "
                                "an explicit resource names missing from it, as a warning instead of an error.",
                 "type": "boolean", "default": False},
    "poll": {"description": "Remote sources: how often to look for changes (ETag, mtime or size) of subscribed "
                            "resources and of collections, e.g. 30s. Local folders are watched instead.",
             **_DURATION},
    "access": {"description": "Scopes a caller needs to list, read and subscribe to these entries (on a source: to "
                              "every entry it serves).", "$ref": "#/$defs/access"},
}
"""The keys every source takes, whatever its kind (`url`'s description is completed by the kinds' `url_help`)."""


def source_key_owners(kinds: Iterable[SourceKind]) -> dict[str, list[str]]:
    """Each kind-specific key -> the kinds that declare it."""
    owners: dict[str, list[str]] = {}
    for kind in kinds:
        for key in kind.settings:
            owners.setdefault(key, []).append(kind.name)
    return owners


def build_schema(published: dict[str, Any], kinds: Iterable[SourceKind]) -> dict[str, Any]:
    """`published` with its source entry's keys replaced by the common ones and those of `kinds`, in order."""
    kinds = list(kinds)
    schema = copy.deepcopy(published)
    properties = copy.deepcopy(COMMON_SOURCE_KEYS)
    fallback = [k.url_help for k in kinds if k.url_help.startswith("or ")]
    helps = [k.url_help for k in kinds if k.url_help and not k.url_help.startswith("or ")]
    properties["url"]["description"] += ", ".join(helps + fallback)
    for kind in kinds:
        for key, setting in kind.settings.items():
            if key not in properties:
                properties[key] = dict(setting.schema)
            elif key in COMMON_SOURCE_KEYS or properties[key] != setting.schema:
                # One name, one meaning: a kind may share another's key (same schema), never redefine it.
                log.warning("source kind %r redefines the key %r: ignored in the schema", kind.name, key)
    schema["$defs"]["source"]["properties"] = properties
    return schema


def dump_schema(schema: dict[str, Any]) -> str:
    """The schema as the published file spells it."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def published_schema() -> dict[str, Any]:
    """The manifest JSON Schema as shipped in the package (or, in a source checkout, from `schemas/`): the built-in
    source kinds' keys only."""
    schema: dict[str, Any] = json.loads(published_text())
    return schema


def published_text() -> str:
    """The text of `published_schema()`: `dump_schema(build_schema(published_schema(), builtin_kinds()))` (a test
    checks it), so with only the built-in kinds registered it is the schema in force."""
    try:
        return resources.files("aggregator").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    except OSError:
        return PUBLISHED.read_text(encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    from aggregator.sources.registry import source_kinds

    parser = argparse.ArgumentParser(prog="python -m aggregator.manifest.schema_build",
                                     description="Print the manifest JSON Schema assembled from the source kinds.")
    parser.add_argument("--write", action="store_true", help=f"rewrite {PUBLISHED} from the built-in kinds")
    args = parser.parse_args(argv)
    try:
        published_schema()
    except ValueError:
        sys.stderr.write(f"{PUBLISHED.name} is empty or not JSON (redirected into itself?): restore it with git "
                         "checkout and regenerate it with --write\n")
        return 1
    if not args.write:
        sys.stdout.write(dump_schema(build_schema(published_schema(), source_kinds().values())))
        return 0
    from aggregator.sources.registry import builtin_kinds

    PUBLISHED.write_text(dump_schema(build_schema(published_schema(), builtin_kinds())), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
