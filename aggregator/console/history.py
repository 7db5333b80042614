"""The last reloads of the manifest, for the console: when, which generation, what changed, or why it was refused.

The supervisor records every reload here. Each change line keeps the scopes an entry needs, so the console shows a
caller only the lines about what its token may see. The diff is computed in a worker thread (catalogs are immutable
values) and only when a console is there to show it (`keep_diffs`), so a reload without a console costs nothing more;
it compares only the entries the reload says may differ (`Differing`), so it costs what the reload changed, not the
catalog.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import anyio.to_thread

from aggregator.catalog import Catalog
from aggregator.entry_spans import Differing
from aggregator.manifest.model import Manifest, ManifestIssue

__all__ = ["ChangeLine", "ReloadHistory", "ReloadRecord"]

logger = logging.getLogger("aggregator.console")

KEPT_RELOADS = 20
KEPT_LINES = 1000
"""Change lines kept per reload: a reload that touches 100,000 URIs keeps its first lines and says how many more."""


@dataclass(frozen=True, slots=True)
class ChangeLine:
    """One line of `aggregator diff`, and the scopes a caller needs to see what it names."""

    text: str
    access: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ReloadRecord:
    at: float
    """time.time() when it finished."""
    generation: int
    """The catalog generation served after it (the old one when it was refused)."""
    ok: bool
    lines: tuple[ChangeLine, ...] = ()
    more: int = 0
    """Change lines past KEPT_LINES, not kept."""
    issues: tuple[ManifestIssue, ...] = ()
    """Why a refused save was refused, located (files as this host names them: the view makes them relative)."""
    error: str | None = None
    """A refusal without located issues (an unexpected failure): a summary, the log has the rest."""
    resources: int = 0
    digest: str = ""
    """The sha256 of the manifest this reload applied (`Manifest.digest`)."""
    accesses: frozenset[frozenset[str]] = frozenset()
    """The scopes each change line needs, kept lines and those past KEPT_LINES alike."""
    lines_known: bool = True
    """False when the diff was not computed (it failed, or no console kept diffs): `lines` says nothing then."""

    def seen_by(self, scopes: frozenset[str] | None) -> bool:
        """Whether a caller holding `scopes` may learn of this reload: a refusal or a save that changed nothing
        (it hides nothing), or one that changed something the caller may see; not one about hidden things alone,
        nor a save whose lines are unknown (it may be about hidden things alone), unless `scopes` is None."""
        if scopes is None or not self.ok:
            return True
        if not self.lines_known:
            return False
        return not self.accesses or any(access <= scopes for access in self.accesses)


@dataclass
class ReloadHistory:
    """The last KEPT_RELOADS reloads, newest last, and who to tell of a new one."""

    keep_diffs: bool = False
    records: deque[ReloadRecord] = field(default_factory=lambda: deque(maxlen=KEPT_RELOADS))
    listeners: list[Callable[[ReloadRecord], None]] = field(default_factory=list)

    async def succeeded(self, old: Catalog, old_manifest: Manifest, new: Catalog, new_manifest: Manifest,
                        differing: Differing) -> None:
        """Record a reload that swapped `new` in for `old`, whose entries differ only within `differing` (the diff
        only when a console shows it)."""
        lines: list[ChangeLine] = []
        known = False
        if self.keep_diffs:
            try:
                lines = await anyio.to_thread.run_sync(_change_lines, old, old_manifest, new, new_manifest, differing,
                                                       abandon_on_cancel=True)
                known = True
            except Exception:  # the reload itself succeeded: a diff that cannot be made must not undo its report
                logger.exception("the change lines of generation %d could not be computed", new.generation)
        self._add(ReloadRecord(time.time(), new.generation, True, tuple(lines[:KEPT_LINES]),
                               max(0, len(lines) - KEPT_LINES), resources=len(new), digest=new_manifest.digest,
                               accesses=frozenset(line.access for line in lines), lines_known=known))

    def failed(self, generation: int, issues: Iterable[ManifestIssue] = (), error: str | None = None) -> None:
        """Record a refused reload: the located issues of a bad save, or a summary of another failure. The same
        refusal again (the supervisor retries a broken save on every check) is recorded once."""
        record = ReloadRecord(time.time(), generation, False, issues=tuple(issues), error=error)
        last = self.records[-1] if self.records else None
        if last is not None and not last.ok and (last.generation, last.issues, last.error) == (
                record.generation, record.issues, record.error):
            return
        self._add(record)

    def _add(self, record: ReloadRecord) -> None:
        self.records.append(record)
        for listener in list(self.listeners):
            listener(record)

    def last(self, count: int) -> Sequence[ReloadRecord]:
        """The newest `count` records, newest first."""
        return list(reversed(self.records))[:count]


def _change_lines(old: Catalog, old_manifest: Manifest, new: Catalog, new_manifest: Manifest,
                  differing: Differing) -> list[ChangeLine]:
    """The lines of `aggregator diff` for this reload, each with the scopes of what it names (both sides': a line
    about an entry that gained or lost a scope is shown only to callers who could see it before and after)."""
    from aggregator.diff import diff_change, diff_sources  # only with a console: a reload without one diffs nothing

    diff = diff_change(old, new, differing)
    diff.sources = diff_sources(old_manifest, new_manifest)
    lines = [ChangeLine(text, diff.access[key]) for key, text in diff.entry_lines()]
    lines += [ChangeLine(text, _source_access(old_manifest, sid) | _source_access(new_manifest, sid))
              for sid, text in diff.source_lines()]
    return lines


def _source_access(manifest: Manifest, sid: str) -> frozenset[str]:
    spec = manifest.sources.get(sid)
    return spec.access if spec is not None else frozenset()
