"""The live catalog: reload the manifest when it is saved, notice changed files, and tell clients.

Reloads run off the request path, one at a time; saves that arrive during a reload fold into one more. A save
that does not change the file's bytes, or does not change what is listed, sends nothing; a broken save keeps
the last good catalog serving and logs the located error. A reload reads the files only once they stayed
unchanged for `server.reloadSettle` (a save may be written in chunks), and one that would leave a source without
resources, or the catalog empty, waits one more such window before it applies.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

import anyio

from aggregator.cache_keys import Forget
from aggregator.cluster.bus import ChangeBus, ChangeEvent, Kind
from aggregator.cluster.leases import DATA, RETRY_FRACTION, PollLeases, pollable
from aggregator.cluster.link import source_fingerprint
from aggregator.cluster.told import SourcePath, ToldVersions
from aggregator.console.history import ReloadHistory
from aggregator.service import ResourceService, SuspiciousReload
from aggregator.manifest.compose import open_regular_file
from aggregator.manifest.model import DEFAULT_MAX_MANIFEST_BYTES, ManifestError
from aggregator.notify import Notifier
from aggregator.watch import Change, watch_folders, watch_manifest

__all__ = ["Supervisor"]

logger = logging.getLogger("aggregator.supervisor")

FALLBACK_CHECK_SECONDS = 2.0
INBOUND_EVENTS = 1000
"""Other replicas' change events waiting to be handled; past it they are dropped (and logged)."""
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


class Supervisor:
    """Keeps an ResourceService in step with its manifest and its local folders, and notifies through a Notifier."""

    def __init__(self, service: ResourceService, notifier: Notifier, *, reload: bool = True,
                 cluster: ChangeBus | None = None) -> None:
        self.service = service
        self.notifier = notifier
        self.cluster = cluster
        """The change bus shared with the other replicas (`server.cluster`); None: this process is alone."""
        self._leases = PollLeases(cluster.link) if cluster is not None else None
        self._told = ToldVersions() if cluster is not None else None
        """Versions this replica's listeners were told of (with a cluster): each change is told once."""
        self._inbound_send, self._inbound = anyio.create_memory_object_stream[ChangeEvent](INBOUND_EVENTS)
        self._overflowed = False
        self.reload_enabled = reload
        self.reloads = 0
        self.reload_errors = 0
        self.suspicious_reloads = 0
        """Reloads held back one more settle window because they would empty a source or the catalog."""
        self.last_error: str | None = None
        """Why the last reload failed, for /healthz: a count, never the messages (they name files on this host)."""
        self._last_logged_error: str | None = None
        self.history = ReloadHistory()
        """The last reloads, for the console (which turns on their diffs)."""
        self._manifest_path = Path(service.manifest.path)
        self._digest = self._files_digest()
        self._dirty = anyio.Event()
        self._sources_changed = anyio.Event()
        self._watched: set[str] = set()  # local sources whose watcher is running
        self._stop = anyio.Event()
        # Sources that push their own changes: what they told, handled off their connection's task.
        self._pushers_changed = anyio.Event()
        self._pushed = anyio.Event()
        self._pushed_paths: dict[str, set[str]] = {}
        self._pushed_listings: set[str] = set()
        self._wants_dirty = anyio.Event()
        notifier.subscription_listeners.append(self._wants_changed)
        service.change_listeners.append(lambda files: self._wants_changed() if files is None else None)
        if cluster is not None:
            cluster.listeners.append(self._event_arrived)
            cluster.on_reconnect.append(self._rejoined)

    async def run(self) -> None:
        """Watch until `stop()`; run it in a task group beside the server."""
        async with anyio.create_task_group() as tg:
            if self.reload_enabled:
                # The manifest and every local file it includes or extends (a file added by a later reload is
                # still seen by the periodic digest check).
                files = {str(self._manifest_path), *(str(f) for f in self.service.manifest.files)}
                tg.start_soon(watch_manifest, sorted(files), self._manifest_touched, self._stop)
                tg.start_soon(self._reload_loop)
            tg.start_soon(self._watch_sources)
            tg.start_soon(self._poll_sources)
            tg.start_soon(self._source_events)
            if self.cluster is not None:
                tg.start_soon(self.cluster.run)
                tg.start_soon(self._cluster_events)
            await self._stop.wait()
            tg.cancel_scope.cancel()
        if self._leases is not None:  # another replica takes over at once rather than when they expire
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                await self._leases.release_all()

    def stop(self) -> None:
        self._stop.set()
        if self.cluster is not None:
            self.cluster.stop()
        self.notifier.close()

    # --- the manifest --------------------------------------------------------------------------------

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
        watch_plan = self._watch_plan()
        files_before, server_before = self.service.manifest.files, self.service.manifest.server
        before = self.service.snapshot
        try:
            changed, content_changed = await self.service.reload(watched=self._watched, guard=guard)
        except SuspiciousReload:
            raise
        except ManifestError as exc:
            self.reload_errors += 1
            self.last_error = f"the manifest has {len(exc.issues)} problem(s); see the server log"
            self.history.failed(self.service.catalog.generation, exc.issues)
            # The same broken files are tried again on every check (a source may come back); said once.
            if str(exc) != self._last_logged_error:
                self._last_logged_error = str(exc)
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
        self._last_logged_error = None
        server = self.service.manifest.server
        fixed = [key for key, attr in _FIXED_AT_START if getattr(server, attr) != getattr(server_before, attr)]
        if fixed:
            logger.warning("server.%s changed: it applies when the server restarts (the reload applied everything "
                           "else)", ", server.".join(fixed))
        if self._watch_plan() != watch_plan:
            self._sources_changed.set()  # restart watchers and pollers only when what they watch changed
            self._pushers_changed.set()
        logger.info("reloaded %s: generation %d, %d resources, %d templates%s", self._manifest_path,
                    self.service.catalog.generation, len(self.service.catalog),
                    len(self.service.catalog.templates), "; listing changed" if changed else "")
        if changed:
            await self.notifier.list_changed()
        dependents = self.service.rendered_dependents(content_changed, listing_changed=changed)
        subscribed = (content_changed | dependents) & self.notifier.subscribed_uris()
        if subscribed:
            await self.notifier.updated(sorted(subscribed))
        await self.history.succeeded(before.catalog, before.manifest, self.service.catalog, self.service.manifest)
        return changed

    def _watch_plan(self) -> tuple[object, ...]:
        """What the watchers and pollers cover: local roots and polled sources (by source object: a source whose
        settings changed is another one, with another poll lease) and poll intervals."""
        sources = self.service.sources
        return (tuple(sorted((sid, id(src)) for sid, src in sources.items() if src.watch_root() is not None)),
                tuple(sorted((sid, spec.poll, id(sources.get(sid))) for sid, spec in
                             self.service.manifest.sources.items() if spec.poll)),
                tuple(sorted((sid, id(src)) for sid, src in sources.items() if src.pushes_changes)))

    # --- local folders -------------------------------------------------------------------------------

    async def _watch_sources(self) -> None:
        """Watch the local folders of the current manifest; start again when a reload changes them."""
        while True:
            roots = {sid: root for sid, src in self.service.sources.items() if (root := src.watch_root()) is not None}
            self._watched = set(roots)
            self._sources_changed = anyio.Event()
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_folders, roots, self.files_changed, stop)

                async def restart(stop: anyio.Event) -> None:
                    await self._sources_changed.wait()
                    stop.set()

                tg.start_soon(restart, stop)
                if not roots:
                    await self._sources_changed.wait()
                    tg.cancel_scope.cancel()

    async def files_changed(self, source: str, changes: set[tuple[Change, str]]) -> None:
        """Invalidate, send `updated` to subscribers, and relist collections when files came or went."""
        paths = {path for _, path in changes}
        self.service.invalidate(source, paths)
        subscribed = self.notifier.subscribed_uris()
        if subscribed:
            backed = self.service.uris_for(source, paths, subscribed | self.service.render_inputs())
            uris = (backed | self.service.rendered_dependents(backed)) & subscribed
            if uris:
                await self.notifier.updated(sorted(uris))
        if any(change != Change.modified for change, _ in changes) and self._has_collection(source):
            await self._relist()

    async def _relist(self) -> bool:
        """List collections again; if the listing changed, send list_changed, and `updated` to subscribed renders
        that listed resources (they may read differently now). True if it changed."""
        try:
            changed = await self.service.refresh_listing()
        except ManifestError as exc:  # the manifest's own entries collide over what a source lists now: said once
            if str(exc) != self._last_logged_error:
                self._last_logged_error = str(exc)
                logger.error("relisting failed; still serving generation %d:\n%s", self.service.catalog.generation, exc)
            return False
        if not changed:
            return False
        await self.notifier.list_changed()
        uris = self.service.rendered_dependents((), listing_changed=True) & self.notifier.subscribed_uris()
        if uris:
            await self.notifier.updated(sorted(uris))
        return True

    # --- sources that tell of their own changes (MCP upstreams) ------------------------------------------

    async def _source_events(self) -> None:
        """Listen to every source that pushes changes, ask it for the paths subscribers want, and handle what it
        tells; listen again when a reload changes those sources."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._handle_pushed)
            tg.start_soon(self._keep_wants)
            while True:
                self._pushers_changed = anyio.Event()
                for sid, src in self.service.sources.items():
                    if src.pushes_changes:
                        src.changes(functools.partial(self.source_changed, sid))
                self._wants_changed()
                await self._pushers_changed.wait()

    async def source_changed(self, source: str, paths: frozenset[str] | None) -> None:
        """A source's own change event (paths changed, or None: its listing may have): noted, handled later."""
        if paths is None:
            self._pushed_listings.add(source)
        else:
            self._pushed_paths.setdefault(source, set()).update(paths)
        self._pushed.set()

    async def _handle_pushed(self) -> None:
        while True:
            await self._pushed.wait()
            self._pushed = anyio.Event()
            paths, self._pushed_paths = self._pushed_paths, {}
            listings, self._pushed_listings = self._pushed_listings, set()
            try:
                for sid, changed in paths.items():
                    if sid in self.service.sources:
                        await self.files_changed(sid, {(Change.modified, path) for path in changed})
                # Our own list_changed only when our listing changed (an upstream's may not touch what we list).
                if any(self._has_collection(sid) for sid in listings):
                    await self._relist()
            except Exception:
                logger.exception("handling the change events of source(s) %s failed",
                                 ", ".join(map(repr, sorted({*paths, *listings}))))

    def _wants_changed(self) -> None:
        self._wants_dirty.set()

    async def _keep_wants(self) -> None:
        """Tell each pushing source the paths our subscribers (and the renders they subscribed to) read."""
        while True:
            await self._wants_dirty.wait()
            self._wants_dirty = anyio.Event()
            subscribed = self.notifier.subscribed_uris()
            wanted = self.service.paths_by_source(subscribed | self.service.render_inputs(subscribed))
            for sid, src in self.service.sources.items():
                if src.pushes_changes:
                    src.want(wanted.get(sid, set()))

    # --- remote sources --------------------------------------------------------------------------------

    async def _poll_sources(self) -> None:
        """Poll every remote source that sets `poll:`; start again when a reload changes them."""
        while True:
            polled = {sid: spec.poll for sid, spec in self.service.manifest.sources.items()
                      if spec.poll and sid in self.service.sources
                      and self.service.sources[sid].watch_root() is None}
            changed = self._sources_changed
            async with anyio.create_task_group() as tg:
                for sid, interval in polled.items():
                    tg.start_soon(self._poll_source, sid, interval)
                await changed.wait()
                tg.cancel_scope.cancel()
            if self._leases is not None:  # the pollers start again: a source no longer polled is not kept held
                with anyio.move_on_after(2):
                    await self._leases.release_all()
            await anyio.sleep(0)

    async def _poll_source(self, source: str, interval: float) -> None:
        seen: dict[str, str | None] = {}  # by URI, when polling alone
        seen_paths: dict[str | None, str | None] = {}  # by path, when polling for the cluster
        wait = interval
        while True:
            await anyio.sleep(wait)
            wait = interval
            try:
                if self.cluster is not None and self.cluster.connected and \
                        await self.poll_for_cluster(source, interval, seen_paths):
                    if self._leases is not None and \
                            not self._leases.holds(source_fingerprint(self.service.manifest.sources[source])):
                        wait = interval * RETRY_FRACTION  # another replica polls: be ready to take over soon
                    seen.clear()
                else:  # alone, or the cluster's Redis is unavailable: poll for this replica's subscribers
                    seen_paths.clear()
                    await self.poll_once(source, seen)
            except Exception:
                logger.exception("polling source %r failed; trying again in %gs", source, interval)

    async def poll_once(self, source: str, seen: dict[str, str | None]) -> None:
        """Compare versions of the subscribed URIs of `source` with the last poll; relist its collections."""
        subscribed = self.notifier.subscribed_uris()
        # What subscribed renders read is polled too: their `updated` follows from it.
        versions = await self.service.versions(source, subscribed | self.service.render_inputs(subscribed))
        changed = [uri for uri, version in versions.items() if uri in seen and seen[uri] != version]
        if self._told is not None:  # Redis is out: what the lease holder publishes when it is back is not news
            reads = self.service.reads_of(source, versions)
            news = self._told.alone(source_fingerprint(self.service.manifest.sources[source]),
                                    {reads[uri]: v for uri, v in versions.items() if uri in reads},
                                    {reads[uri]: v for uri, v in seen.items() if uri in reads})
            changed = [uri for uri in versions if uri in reads and reads[uri] in news]
        seen.clear()
        seen.update(versions)
        if changed:
            self.service.invalidate_uris(changed)
            told = {*changed, *self.service.rendered_dependents(changed)} & subscribed
            if told:
                await self.notifier.updated(sorted(told))
        if self._has_collection(source):
            await self._relist()

    def _has_collection(self, source: str) -> bool:
        """Whether what `source` lists shows in the catalog: a collection over it, or its own published entries."""
        backend = self.service.sources.get(source)
        return (backend is not None and backend.publishes) or any(
            c.source == source for c in self.service.manifest.collections)

    # --- the cluster (server.cluster): one replica polls each remote source, every replica hears of changes ---

    async def poll_for_cluster(self, source: str, interval: float, seen: dict[str | None, str | None]) -> bool:
        """Record what this replica's subscribers want of `source`; if this replica holds its poll lease, poll
        what every replica wants, and apply and publish what changed. False if Redis failed (poll alone then)."""
        assert self.cluster is not None and self._leases is not None and self._told is not None
        spec = self.service.manifest.sources[source]
        fingerprint = source_fingerprint(spec)
        subscribed = self.notifier.subscribed_uris()
        mine = set(self.service.reads_of(source, subscribed | self.service.render_inputs(subscribed)).values())
        try:
            await self._leases.want(fingerprint, {DATA if p is None else p for p in mine}, interval)
            if not await self._leases.hold(fingerprint, interval):
                seen.clear()  # another replica polls; taking over, this one starts from the versions that one kept
                return True
            union = await self._leases.wanted(fingerprint)
            if not seen:  # just took the lease: compare with what the last holder saw
                seen.update(await self._leases.seen(fingerprint))
        except Exception as exc:  # Redis down or slow: the bus logs it once and marks the cluster down
            logger.debug("cluster call for source %r failed: %r", source, exc)
            return False
        paths = pollable(union)
        async with self.service.lease() as snapshot:
            backend = snapshot.sources.get(source)
            versions = dict(await backend.poll(paths)) if backend is not None and paths else {}
        changed, news = self._told.polled(fingerprint, versions, seen)
        if versions != seen:
            seen.clear()
            seen.update(versions)
            try:
                await self._leases.record(fingerprint, versions)
            except Exception as exc:
                logger.debug("cluster: keeping the versions of source %r failed: %r", source, exc)
        if changed:
            files = {path for path in changed if path is not None}
            data = None in changed
            await self.service.forget_shared(source, files, data)
            await self.apply_change(source, files, data, news)
            await self.cluster.publish(self._event(fingerprint, files, data, "updated",
                                                   {path: versions[path] for path in changed}))
        if self._has_collection(source):
            before = self.service.catalog.listing_of(source)
            # Only this source's entries are told: a relist also picks up other sources' changes, which their own
            # replicas see for themselves (local folders) or publish themselves.
            if await self._relist() and self.service.catalog.listing_of(source) != before:
                await self.cluster.publish(self._event(fingerprint, (), False, "listing"))
        return True

    def _event(self, fingerprint: str, paths: Iterable[str], data: bool, kind: Kind,
               versions: dict[SourcePath, str | None] | None = None) -> ChangeEvent:
        assert self.cluster is not None
        return ChangeEvent(self.cluster.link.replica, self.service.manifest.digest, fingerprint,
                           tuple(sorted(paths)), data, kind, versions or {})

    async def apply_change(self, source: str, files: set[str], data: bool,
                           news: set[SourcePath] | None = None) -> None:
        """These files (and, with `data`, the query results) of `source` changed: invalidate them and send
        `updated` to this replica's subscribers on both wires (with their scope filters, as for any change); of
        `news` only (None: all), the others were told already."""
        told = files if news is None else files & news
        if files - told:
            self.service.invalidate(source, files - told)
        if told:
            await self.files_changed(source, {(Change.modified, path) for path in told})
        if data:
            self.service.cache.invalidate_where(Forget.of(queries={source}))
            if news is not None and None not in news:
                return
            subscribed = self.notifier.subscribed_uris()
            queries = {uri for uri, path in self.service.reads_of(
                source, subscribed | self.service.render_inputs(subscribed)).items() if path is None}
            told = (queries | self.service.rendered_dependents(queries)) & subscribed
            if told:
                await self.notifier.updated(sorted(told))

    def _event_arrived(self, event: ChangeEvent) -> None:
        try:
            self._inbound_send.send_nowait(event)
        except anyio.WouldBlock:  # events are lost: recover as after a reconnect, once the backlog is handled
            if not self._overflowed:
                logger.warning("cluster: %d change events wait to be handled; dropping further ones, then "
                               "starting over as after a reconnect", INBOUND_EVENTS)
            self._overflowed = True

    async def _cluster_events(self) -> None:
        """Handle other replicas' events: for each of this manifest's sources with that fingerprint (never a local
        folder or a source that pushes its own changes), invalidate and notify this replica's subscribers."""
        async for event in self._inbound:
            if self._overflowed and not self._inbound.statistics().current_buffer_used:
                self._overflowed = False
                await self._rejoined()
            try:
                sids = self._sources_of(event.source)  # none: not ours, so nothing to remember of it either
                news = None if self._told is None or event.kind == "listing" or not sids else self._told.received(
                    event.source, {*event.paths, *([None] if event.data else [])}, event.versions)
                for sid in sids:
                    if event.kind == "listing":
                        if self._has_collection(sid):
                            await self._relist()
                    else:
                        await self.apply_change(sid, set(event.paths), event.data, news)
            except Exception:
                logger.exception("handling a cluster change event of source %s failed", event.source)

    def _sources_of(self, fingerprint: str) -> list[str]:
        return [sid for sid, src in self._remote_sources().items()
                if source_fingerprint(self.service.manifest.sources[sid]) == fingerprint]

    def _remote_sources(self) -> dict[str, object]:
        """Sources whose changes travel on the bus: neither local folders nor sources that push their own."""
        return {sid: src for sid, src in self.service.sources.items()
                if src.watch_root() is None and not src.pushes_changes and sid in self.service.manifest.sources}

    async def _rejoined(self) -> None:
        """Back on the bus after events may have been lost: drop remote sources' cached content, end listen streams
        (clients listen again: the SDK's handler takes new streams after close), and tell legacy sessions."""
        remote = set(self._remote_sources())
        self.service.cache.invalidate_where(Forget.of(sources=remote))
        self.notifier.end_streams()
        await self.notifier.list_changed()

    def cluster_health(self) -> dict[str, object] | None:
        """For /healthz: whether the bus is up, this replica's id and the poll leases it holds (no Redis URL)."""
        if self.cluster is None or self._leases is None:
            return None
        connected = self.cluster.connected
        return {"connected": connected, "replica": self.cluster.link.replica,
                "leases": self._leases.count() if connected else 0}

