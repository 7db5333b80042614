"""A `RenderTarget` read: the manifest's `render:` template run (render.py) over other reads made for the same caller
from the same snapshot, its failures sorted into over budget, broken (the template) or unavailable (what it read);
and, per rendered URI, what its last render read, so a change to those reaches it."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

from cachetools import LRUCache

from aggregator.catalog import Entry, RenderTarget
from aggregator.content import Content
from aggregator.errors import (ResourceNotFound, ResourceOverBudget, ResourceRenderFailed, ResourceTooLarge,
                               ResourceUnavailable)
from aggregator.snapshot import Snapshot

__all__ = ["RENDER_INPUTS_KEPT", "ReadContent", "RenderInputs", "read_rendered"]

logger = logging.getLogger("aggregator")
RENDER_INPUTS_KEPT = 4096
"""Rendered URIs whose inputs are remembered (template URIs are chosen by clients: the map must be bounded)."""

ReadContent = Callable[[str], Awaitable[Content]]
"""Another read for the same caller from the same snapshot (the reader's own `read`)."""


class RenderInputs:
    """Rendered URI -> (URIs its last render read, whether it listed resources): who to tell when those change."""

    def __init__(self) -> None:
        self._inputs: LRUCache[str, tuple[frozenset[str], bool]] = LRUCache(maxsize=RENDER_INPUTS_KEPT)

    def record(self, uri: str, reads: Iterable[str], listed: bool) -> None:
        self._inputs[uri] = (frozenset(reads), listed)

    def read_by(self, of: Iterable[str] | None = None) -> set[str]:
        """The URIs recent renders read: of every render, or of the renders `of` names and those they read."""
        if of is None:
            return {uri for reads, _ in self._inputs.values() for uri in reads}
        found: set[str] = set()
        frontier = {uri for uri in of if uri in self._inputs}
        while frontier:
            reads = {uri for render in frontier for uri in self._inputs.get(render, ((), False))[0]}
            frontier = {uri for uri in reads - found if uri in self._inputs}
            found |= reads
        return found

    def dependents(self, changed: Iterable[str], listing_changed: bool = False) -> set[str]:
        """Rendered URIs whose last render read one of `changed` (or listed resources, when the listing changed),
        and, in turn, the renders that read those."""
        found: set[str] = set()
        frontier = set(changed)
        while True:
            more = {uri for uri, (reads, listed) in self._inputs.items()
                    if uri not in found and (not reads.isdisjoint(frontier) or (listing_changed and listed))}
            if not more:
                return found
            found |= more
            frontier, listing_changed = more, False


async def read_rendered(snapshot: Snapshot, target: RenderTarget, scopes: frozenset[str] | None, read: ReadContent,
                        inputs: RenderInputs) -> Content:
    """Run a `render:` template; it reads (`read`) and lists other resources as the caller would (hidden ones stay
    hidden), from `snapshot`. It runs in a worker thread within the manifest's `render:` budget (its reads come back
    to this loop); what it read is recorded in `inputs`, failed or not."""
    from aggregator.render import RenderError, RenderOverBudget, RenderTooLarge, render

    template = target.render
    read_uris: set[str] = set()
    listed = False

    async def read_text(written: str) -> str:
        uri = template.uri(written)
        read_uris.add(uri)
        content = await read(uri)
        if content.text is None:
            raise RenderError(f"{uri} is binary ({content.mime_type}): only text resources can be rendered")
        return content.text

    def list_resources(prefix: str) -> list[dict[str, object]]:
        nonlocal listed
        listed = True
        return [_entry_facts(e) for e in snapshot.catalog.under(template.uri(prefix), scopes)]

    limit = snapshot.manifest.defaults.max_bytes
    try:
        text = await render(template.text, dict(target.params), read_text, list_resources, limit,
                            snapshot.manifest.render)
    except RenderTooLarge:
        raise ResourceTooLarge(target.uri, limit + 1, limit) from None
    except (RenderOverBudget, ResourceOverBudget) as exc:  # the latter: a render this one read, same budget
        logger.warning("render %s failed: %s", target.uri, exc)
        raise ResourceOverBudget(target.uri) from None
    except (RenderError, ResourceRenderFailed) as exc:  # the latter: a render this one read failed by itself
        # The template itself is wrong (an undefined name ...): permanent until the manifest changes. What failed
        # may name another URI or a data value: the log gets it, the client a generic error.
        reason = _render_reason(exc)
        logger.warning("render %s failed: %s", target.uri, reason)
        raise ResourceRenderFailed(target.uri, reason) from None
    except (ResourceNotFound, ResourceTooLarge, ResourceUnavailable) as exc:
        # A resource it reads is missing or down: that may pass, so the render is unavailable, not broken.
        reason = _render_reason(exc)
        logger.warning("render %s failed: %s", target.uri, reason)
        raise ResourceUnavailable(target.uri, reason) from None
    finally:
        inputs.record(target.uri, read_uris, listed)
    return Content(target.mime_type or "text/markdown", text=text)


def _render_reason(exc: Exception) -> str:
    """Why a render failed, for the log and validate: the inner reason of a read it made, when there is one."""
    if isinstance(exc, (ResourceRenderFailed, ResourceUnavailable)) and exc.reason:
        # Nested renders: the innermost failure, named once rather than once per level.
        return exc.reason if exc.reason.startswith("reading ") else f"reading {exc.uri}: {exc.reason}"
    return exc.message if isinstance(exc, (ResourceNotFound, ResourceTooLarge, ResourceUnavailable)) else str(exc)


def _entry_facts(entry: Entry) -> dict[str, object]:
    """What a render template sees of a listed resource."""
    return {"uri": entry.uri, "name": entry.name, "title": entry.title, "description": entry.display.description,
            "mimeType": entry.mime_type, "size": entry.size, "lastModified": entry.last_modified}
