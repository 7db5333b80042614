"""What a change did to the listings (`resources/list`, `resources/templates/list`), by who may see it.

Entries and templates carry `access` (the scopes a caller needs to see them), so one change may alter what one
caller lists and not another's: a reload that only opens a source to a scope changes no entry, yet the holders of
that scope list more. A `ListingChange` keeps the access sets of what changed, not the entries, so asking whether
a caller sees it costs the number of distinct access sets involved, whatever the catalog's size; it never says
what changed, only whether to tell a caller to list again. It also keeps whose view of other facts the operator's
console shows changed (`detail`: an entry's source, a template's source, values or kind), which no listing shows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["EVERYONE", "NO_CHANGE", "ListingChange", "compare"]

Item = TypeVar("Item")
"""An entry or a template."""


@dataclass(frozen=True, slots=True)
class ListingChange:
    """Whose listings a change altered; `seen_by(scopes)` decides for one caller."""

    shown: frozenset[frozenset[str]] = frozenset()
    """Access of the entries and templates that came, went or show other fields (before and after): a caller
    holding any one of these sees the change."""
    moved: frozenset[tuple[frozenset[str], frozenset[str]]] = frozenset()
    """(access before, access after) of entries and templates listed the same whose access changed: a caller
    holding one and not the other sees them come or go."""
    detail: frozenset[frozenset[str]] = frozenset()
    """Access (before and after, joined) of entries and templates listed the same whose facts only the console shows
    changed: a caller holding one sees the change in the console; no MCP client is told (its listing is the same)."""

    @property
    def listing_changed(self) -> bool:
        """Whether a caller who sees everything (stdio) lists something else now."""
        return bool(self.shown)

    @property
    def any(self) -> bool:
        """Whether some caller may list something else now."""
        return bool(self.shown or self.moved)

    def seen_by(self, scopes: frozenset[str] | None) -> bool:
        """Whether a caller holding `scopes` (None: it sees everything) lists something else now."""
        if scopes is None:
            return self.listing_changed
        return any(access <= scopes for access in self.shown) or any(
            (before <= scopes) != (after <= scopes) for before, after in self.moved)

    def shown_to(self, scopes: frozenset[str] | None) -> bool:
        """Whether a caller holding `scopes` (None: it sees everything) sees something else in the console: its
        listing (`seen_by`), or the detail the console shows beside it."""
        return self.seen_by(scopes) or any(scopes is None or access <= scopes for access in self.detail)

    def __or__(self, other: ListingChange) -> ListingChange:
        return ListingChange(self.shown | other.shown, self.moved | other.moved, self.detail | other.detail)


NO_CHANGE = ListingChange()
EVERYONE = ListingChange(shown=frozenset({frozenset()}))
"""A change every caller is told of (as if to an entry that needs no scope): what is told when it is not known
whose listings changed."""


def compare(before: Mapping[str, Item], after: Mapping[str, Item], shown: Callable[[Item], object],
            access: Callable[[Item], frozenset[str]], detail: Callable[[Item], object] | None = None) -> ListingChange:
    """The change from `before` to `after` (by URI or URI template, the items that may have changed), given what a
    listing shows of an item, the scopes it needs and what else the console shows of it (`detail`): O(items),
    `shown` and `detail` asked only of items on both sides."""
    seen: set[frozenset[str]] = set()
    moved: set[tuple[frozenset[str], frozenset[str]]] = set()
    details: set[frozenset[str]] = set()
    for key, old in before.items():
        new = after.get(key)
        if new is None:
            seen.add(access(old))
            continue
        if shown(old) != shown(new):
            seen |= {access(old), access(new)}
            continue
        if access(old) != access(new):
            moved.add((access(old), access(new)))
        if detail is not None and detail(old) != detail(new):
            details.add(access(old) | access(new))
    seen.update(access(new) for key, new in after.items() if key not in before)
    return ListingChange(frozenset(seen), frozenset(moved), frozenset(details))
