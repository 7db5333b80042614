"""Operator detail made fit for a browser: credentials and this host's paths taken out of error text."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

__all__ = ["redact", "where"]

# user:password@ in any URL, and the values of query parameters or headers that usually carry a secret.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
_SECRET_PARAM = re.compile(r"(?i)(?P<key>[?&;](?:password|passwd|pwd|token|access_token|secret|key|api_key|apikey|sig|"
                           r"signature|x-amz-signature|x-amz-credential|x-amz-security-token)=)[^&#\s]*")
_SECRET_HEADER = re.compile(r"(?i)(?P<key>\b(?:authorization|proxy-authorization|x-api-key|cookie)\s*[:=]\s*)"
                            r"(?:bearer\s+|basic\s+)?[^\s,;'\"]+")
_PASSWORD_WORD = re.compile(r"(?i)(?P<key>\b(?:password|passwd|pwd|secret|token)\s*[=:]\s*)[^\s,;&'\"]+")
HIDDEN = "***"


def redact(text: str, paths: Mapping[str, str] = {}) -> str:
    """`text` without URL credentials, secret-looking parameters and headers, and with each of `paths` (a folder
    on this host) replaced by its label, longest first, so no file system path reaches a browser."""
    for path in sorted(paths, key=len, reverse=True):
        if path:
            text = text.replace(path.rstrip(os.sep) + os.sep, paths[path] + "/").replace(path, paths[path])
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{HIDDEN}@", text)
    text = _SECRET_PARAM.sub(lambda m: f"{m['key']}{HIDDEN}", text)
    text = _SECRET_HEADER.sub(lambda m: f"{m['key']}{HIDDEN}", text)
    text = _PASSWORD_WORD.sub(lambda m: f"{m['key']}{HIDDEN}", text)
    # What is left of an absolute path (a file outside every known folder) keeps its name only.
    return re.sub(r"(?<![\w:/.])/(?:[^\s/:'\"]+/)+(?P<name>[^\s/:'\"]+)", lambda m: f"…/{m['name']}", text)


def where(file: str, manifest_folder: str) -> str:
    """A manifest file as the console names it: relative to the manifest's folder, else its name alone."""
    if file.startswith(("http://", "https://")):
        return redact(file)
    try:
        relative = os.path.relpath(file, manifest_folder)
    except ValueError:
        return os.path.basename(file)
    return os.path.basename(file) if relative.startswith("..") else relative
