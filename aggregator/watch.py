"""Filesystem watchers: the manifest (with its folder, for editors' atomic renames and Kubernetes ConfigMap
symlink swaps) and the folders of local sources. Each calls back with debounced batches of changes."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Iterable

import anyio
from watchfiles import Change, awatch

__all__ = ["Change", "watch_folders", "watch_manifest"]

logger = logging.getLogger("aggregator.watch")

DEBOUNCE_MS = 50
STEP_MS = 20
# How often the watcher thread looks at its stop flag: bounds how long shutting a watcher down takes.
RUST_TIMEOUT_MS = 200


async def watch_manifest(paths: Iterable[str], on_change: Callable[[], Awaitable[None]],
                         stop: anyio.Event | None = None) -> None:
    """Call `on_change` after any change in the folders holding `paths` (the caller decides if content changed).

    Watching the folder, not the file, sees a file replaced by rename and a `..data` symlink swapped.
    """
    folders = sorted({os.path.dirname(os.path.abspath(p)) for p in paths})
    async for _ in awatch(*folders, debounce=DEBOUNCE_MS, step=STEP_MS, stop_event=stop, recursive=False,
                          rust_timeout=RUST_TIMEOUT_MS, ignore_permission_denied=True):
        await on_change()


async def watch_folders(roots: dict[str, str], on_change: Callable[[str, set[tuple[Change, str]]], Awaitable[None]],
                        stop: anyio.Event | None = None) -> None:
    """Call `on_change(source_id, {(change, relative path)})` for file changes under each root."""
    if not roots:
        return
    by_root = {os.path.realpath(root): sid for sid, root in roots.items()}
    async for batch in awatch(*by_root, debounce=DEBOUNCE_MS, step=STEP_MS, stop_event=stop,
                              rust_timeout=RUST_TIMEOUT_MS, ignore_permission_denied=True):
        grouped: dict[str, set[tuple[Change, str]]] = {}
        for change, path in batch:
            for root, sid in by_root.items():
                if path.startswith(root + os.sep):
                    grouped.setdefault(sid, set()).add((change, os.path.relpath(path, root).replace(os.sep, "/")))
                    break
        for sid, changes in grouped.items():
            await on_change(sid, changes)
