"""Reload the manifest when it is saved: one reload at a time, once its files settled, guarded, told once.

Saves that arrive during a reload fold into one more. A save that does not change the files' bytes, or does not
change what any caller lists, sends nothing (list_changed goes to the callers whose listing changed: one that only
changes who may see what tells those it shows things to or hides things from); a broken save keeps the last good
catalog serving and logs the located error. A reload reads the files only once they stayed unchanged for
`server.reloadSettle` (a save may be written in chunks), and one that would leave a source without resources, or
the catalog empty, waits one more such window before it applies.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

import anyio

from aggregator.console.history import ReloadHistory
from aggregator.listing_change import ListingChange
from aggregator.live.plan import Plan, watch_plan
from aggregator.live.updates import CatalogUpdates
from aggregator.manifest.files import open_regular_file
from aggregator.manifest.model import DEFAULT_MAX_MANIFEST_BYTES, ManifestError
from aggregator.service import ResourceService, SuspiciousReload
from aggregator.watch import watch_manifest

__all__ = ["ManifestReloader"]

logger = logging.getLogger("aggregator.supervisor")  # one logger for every side loop

FALLBACK_CHECK_SECONDS = 2.0
SETTLE_STEP_SECONDS = 0.1
"""How often the manifest files are read while they settle."""
_FIXED_AT_START = (("http", "http"), ("auth", "auth"), ("tools", "tools"), ("search", "search"),
                  ("maxSubscriptions", "max_subscriptions"), ("cluster", "cluster"), ("console", "console"))
"""Server settings bound when serving starts (the HTTP app, its auth, registered tools, the notifier)."""


def _digest(path: Path, limit: int = DEFAULT_MAX_MANIFEST_BYTES) -> str | None:
    """A digest of the file's first `limit` + 1 bytes and its size (None if it cannot be read): a FIFO or a huge
    file put where a manifest was is never waited on or read whole (the reload then refuses it, located)."""
    try:
        with open_regular_file(path) as handle:
            info = os.fstat(handle.fileno())
            digest = hashlib.sha256(handle.read(limit + 1))
    except OSError:
        return None
    digest.update(f":{info.st_size}:{info.st_mtime_ns}".encode())
    return digest.hexdigest()


def _said(listing: ListingChange) -> str:
    """What the reload's log line says of the listings."""
    if listing.listing_changed:
        return "; listing changed"
    return "; who may see what changed" if listing.any else ""


class ManifestReloader:
    """Keeps the service's snapshot in step with its manifest files; counts reloads and records them in `history`."""

    def __init__(self, service: ResourceService, updates: CatalogUpdates, plan: Plan, history: ReloadHistory) -> None:
        self.service = service
        self.updates = updates
        self.plan = plan
        self.history = history
        self.reloads = 0
        self.reload_errors = 0
        self.suspicious_reloads = 0
        """Reloads held back one more settle window because they would empty a source or the catalog."""
        self.last_error: str | None = None
        """Why the last reload failed, for /healthz: a count, never the messages (they name files on this host)."""
        self._manifest_path = Path(service.manifest.path)
        self._digest = self._files_digest()
        self._dirty = anyio.Event()

    async def run(self, stop: anyio.Event) -> None:
        """Watch the manifest files and reload on a save (or the periodic digest check) until cancelled."""
        # The manifest and every local file it includes or extends (a file added by a later reload is still seen by
        # the periodic digest check).
        files = {str(self._manifest_path), *(str(f) for f in self.service.manifest.files)}
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_manifest, sorted(files), self._manifest_touched, stop)
            tg.start_soon(self._reload_loop)

    def _files_digest(self) -> str | None:
        """One digest over the manifest and the local files it is built from; None if the manifest is gone."""
        limit = self.service.manifest.server.max_manifest_bytes
        own = _digest(self._manifest_path, limit)
        if own is None:
            return None
        others = sorted(str(f) for f in self.service.manifest.files if Path(f) != self._manifest_path)
        parts = [own, *(f"{f}:{_digest(Path(f), limit)}" for f in others)]
        return hashlib.sha256("".join(parts).encode()).hexdigest()

    async def _manifest_touched(self) -> None:
        self._dirty.set()

    async def _reload_loop(self) -> None:
        while True:
            # Events drive reloads; the periodic digest check catches what no event reported (a save before the
            # watcher started, network filesystems).
            with anyio.move_on_after(FALLBACK_CHECK_SECONDS):
                await self._dirty.wait()
            self._dirty = anyio.Event()  # saves from now on ask for one more reload
            try:
                await self.reload_if_changed()
            except Exception:  # the loop must outlive any one reload: it is what picks up the next save
                logger.exception("checking the manifest for changes failed; still serving the last good catalog")

    async def reload_if_changed(self) -> bool:
        """Reload if the manifest's bytes changed since the last load, once they settled; True if clients were told.

        A reload that would leave a source the new manifest still declares without resources (or empty the
        catalog) is what a half-written save looks like: it applies only if the files stay unchanged for one more
        settle window, and if they changed meanwhile the new content is loaded instead.
        """
        digest = self._files_digest()
        if digest is None or digest == self._digest:
            return False  # deleted (keep serving) or untouched
        digest = await self._settled(digest)
        while digest is not None and digest != self._digest:
            try:
                return await self._reload(digest, guard=True)
            except SuspiciousReload as exc:
                self.suspicious_reloads += 1
                settle = self.service.manifest.server.reload_settle
                logger.warning("%s: %s; it may be half-written, so the reload waits %gs more for it to stay "
                               "unchanged", self._manifest_path, exc, settle)
            settled = await self._settled(digest)
            if settled == digest:
                logger.warning("%s stayed unchanged: applying the reload", self._manifest_path)
                return await self._reload(digest, guard=False)
            logger.info("%s changed again: reloading its new content instead", self._manifest_path)
            digest = settled
        return False

    async def _settled(self, digest: str | None) -> str | None:
        """Wait until the files' digest has stayed the same for `server.reloadSettle`, counting from now with
        `digest` as the content seen; return that digest (None if the manifest is gone)."""
        settle = self.service.manifest.server.reload_settle
        since = time.monotonic()
        while (left := since + settle - time.monotonic()) > 0:
            await anyio.sleep(min(left, SETTLE_STEP_SECONDS))
            now = self._files_digest()
            if now != digest:
                digest, since = now, time.monotonic()
        return digest

    async def _reload(self, digest: str, guard: bool) -> bool:
        """Reload the manifest whose files had `digest` and tell clients; SuspiciousReload passes through."""
        plan = watch_plan(self.service)
        files_before, server_before = self.service.manifest.files, self.service.manifest.server
        try:
            reloaded = await self.service.reload(watched=self.plan.watched, guard=guard)
        except SuspiciousReload:
            raise
        except ManifestError as exc:
            self.reload_errors += 1
            self.last_error = f"the manifest has {len(exc.issues)} problem(s); see the server log"
            self.history.failed(self.service.catalog.generation, exc.issues)
            # The same broken files are tried again on every check (a source may come back); said once.
            if self.updates.errors.first_time(str(exc)):
                logger.error("manifest reload failed; still serving generation %d:\n%s",
                             self.service.catalog.generation, exc)
            return False
        except Exception:
            self.reload_errors += 1
            self.last_error = "the reload failed; see the server log"
            self.history.failed(self.service.catalog.generation, error=self.last_error)
            logger.exception("manifest reload failed; still serving the last good catalog")
            return False
        # The digest taken before loading, so a save during the reload asks for one more instead of being missed;
        # a new file set has no such digest yet, and None makes the next check reload once more to take one.
        self._digest = digest if self.service.manifest.files == files_before else None
        self.reloads += 1
        if self.last_error is not None:
            logger.warning("%s recovered: the last reload failed (%s); this one succeeded", self._manifest_path,
                           self.last_error)
        self.last_error = None
        self.updates.errors.forget()
        server = self.service.manifest.server
        fixed = [key for key, attr in _FIXED_AT_START if getattr(server, attr) != getattr(server_before, attr)]
        if fixed:
            logger.warning("server.%s changed: it applies when the server restarts (the reload applied everything "
                           "else)", ", server.".join(fixed))
        if watch_plan(self.service) != plan:
            self.plan.changed()  # restart watchers and pollers only when what they watch changed
        listing = reloaded.listing
        logger.info("reloaded %s: generation %d, %d resources, %d templates%s", self._manifest_path,
                    self.service.catalog.generation, len(self.service.catalog),
                    len(self.service.catalog.templates), _said(listing))
        await self.updates.reloaded(listing, reloaded.content_changed)
        # The snapshots the reload replaced and swapped in, whose entries differ only where it says (the service's
        # may hold a watcher's later change by now, or have held an earlier one when the reload was asked for).
        before, after = reloaded.previous, reloaded.snapshot
        await self.history.succeeded(before.catalog, before.manifest, after.catalog, after.manifest,
                                     reloaded.differing)
        return listing.any
