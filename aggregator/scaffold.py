"""`aggregator init FOLDER`: a commented starter manifest for a folder, from what the folder holds."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from importlib import resources
from pathlib import Path

import yaml

__all__ = ["starter_manifest"]

_SCAN_LIMIT = 50_000  # files looked at to pick globs: enough to see what a folder holds, bounded for huge trees
_TOP_EXTENSIONS = 8
_PLAIN_EXTENSION = re.compile(r"[a-z0-9_+-]+")
SCHEMA_ID = "https://aggregator.dev/schemas/manifest-v1.json"


# What YAML takes as written (in a quoted scalar or a comment): printable characters that are not line breaks.
# PyYAML refuses DEL and C1 controls anywhere in the file, reads U+0085, U+2028 and U+2029 as line breaks, and
# a folder name that is not UTF-8 on disk arrives as lone surrogates that cannot be written at all.
_UNWRITABLE = re.compile(r"[^\t\n\r\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _yaml_text(value: str) -> str:
    """`value` as a double-quoted YAML scalar the loader gives back unchanged (`$` sequences included)."""
    # JSON quoting is valid YAML; `$${` keeps a folder named `${HOME}` from being read as a variable, and the
    # characters YAML would refuse or fold are written as `\uXXXX` escapes (a surrogate comes back as itself,
    # so a folder whose name is not UTF-8 is still found).
    quoted = json.dumps(value.replace("${", "$${"), ensure_ascii=False)
    return _UNWRITABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)


def _yaml_name(value: str) -> str:
    """`value` unquoted when YAML reads it back as that text, else quoted: a folder named `null` or `on`."""
    return value if yaml.safe_load(value) == value else _yaml_text(value)


def _schema_reference(manifest_path: Path) -> str:
    """The installed schema (editors resolve it offline): relative inside the manifest's folder, else absolute;
    the schema's `$id` when it is not installed as a file."""
    schema = Path(str(resources.files("aggregator") / "manifest.schema.json"))
    if not schema.is_file():
        return SCHEMA_ID
    return _relative_within(schema.resolve(), manifest_path.resolve().parent) or str(schema.resolve())


def _relative_within(target: Path, base: Path) -> str | None:
    """`target` relative to `base` (`./sub`, `.`) when it lies inside `base`, else None.

    A path that climbs out (`../../usr/share/doc`) breaks as soon as the manifest moves, and says nothing to a reader,
    so only paths inside the manifest's own tree, which move with it, are written relative."""
    if not target.is_relative_to(base):
        return None
    inner = target.relative_to(base).as_posix()
    return "." if inner == "." else f"./{inner}"


def _comment(text: str) -> str:
    """`text` on one comment line YAML accepts: a newline would end the comment and start YAML."""
    return _UNWRITABLE.sub("?", text.replace("\r", " ").replace("\n", " "))


def _slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return slug if slug and slug[0].isalpha() else f"docs-{slug}".rstrip("-")


def extensions(folder: Path) -> Counter[str]:
    """How many visible files of each extension the folder holds (hidden files and folders are skipped)."""
    counts: Counter[str] = Counter()
    seen = 0
    for _root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if name.startswith("."):
                continue
            ext = name.rsplit(".", 1)[1].lower() if "." in name[1:] else ""
            counts[ext if _PLAIN_EXTENSION.fullmatch(ext) else ""] += 1  # `{`, `,` or quotes would break the glob
            seen += 1
            if seen >= _SCAN_LIMIT:
                return counts
    return counts


def starter_manifest(folder: Path, manifest_path: Path, name: str | None = None) -> str:
    """The text of a starter manifest at `manifest_path` serving `folder`: relative to the manifest when the folder is
    inside the manifest's folder, else absolute."""
    counts = extensions(folder)
    server = _slug(name or folder.resolve().name)
    picked = [ext for ext, _ in counts.most_common(_TOP_EXTENSIONS) if ext]
    # `.gz` says how a file is stored, not what it is: it goes last, and the files are served decompressed
    # (only names ending in .gz are touched, so the setting is harmless for the rest).
    gzipped = "gz" in picked
    if gzipped:
        picked = [ext for ext in picked if ext != "gz"] + ["gz"]
    decompress = (f"    decompress: true      # {counts['gz']} .gz file(s): served decompressed, as what they hold\n"
                  if gzipped else "")
    glob = "**/*" if not picked else (f"**/*.{picked[0]}" if len(picked) == 1 else "**/*.{" + ",".join(picked) + "}")
    url = _relative_within(folder.resolve(), manifest_path.resolve().parent) or str(folder.resolve())
    where = "relative to this manifest" if url.startswith(".") else "absolute: outside this manifest's folder"
    found = ", ".join(f"{counts[e]} .{e}" for e in picked) or "no files yet"
    return f"""\
# yaml-language-server: $schema={_comment(_schema_reference(manifest_path))}
# Starter manifest written by `aggregator init` for {_comment(str(folder))} ({found}).
# Check it:   aggregator validate {_comment(manifest_path.name)}
# Serve it:   aggregator serve {_comment(manifest_path.name)}          (stdio; add --http 8000 for Streamable HTTP)
# Reference:  docs/manifest-reference.md, or `aggregator schema`.
version: 1

server:
  name: {_yaml_name(server)}
  instructions: {_yaml_text(f"Files from {folder.resolve().name}, listed under {server}://. Read what you need by URI.")}

defaults:
  ttl: 5m                 # how long content is cached (and the ttlMs hint clients get)
  maxBytes: 10MiB         # bigger files are refused with an error naming the URI

sources:
  files:
    url: {_yaml_text(url)}            # {where}

collections:
  # One listed resource per matching file; {{path}}, {{name}}, {{stem}} and {{ext}} are available.
  - source: files
    glob: {_yaml_text(glob)}
    exclude: ["**/node_modules/**", "**/draft-*"]
{decompress}    uri: "{server}://{{path}}"
    name: "{{path}}"

templates:
  # Any file by path, listed or not ('..' and absolute paths are refused).
  - uriTemplate: "{server}://file/{{+path}}"
    name: file
    description: Read any file of the folder by its relative path.
    source: files
    path: "{{path}}"
{"    decompress: true" + chr(10) if gzipped else ""}
# More: access scopes, rendered digests (render:), SQL/S3/HTTP/git sources, include: and extends: - see the README.
"""
