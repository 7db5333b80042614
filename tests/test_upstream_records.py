"""An upstream's listing kept as columns (`upstream.records`) and its published resources as compact catalog rows
(`upstream_rows`): every record, published resource and catalog entry rebuilt from them equals the one built from
`ListedResource` records as before, whatever text the upstream sent (control characters, lone surrogates, empty
strings beside absent fields)."""

from __future__ import annotations

import math

import anyio
import mcp_types as types

from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.rows_change import rows_change
from aggregator.catalog_rows import Rows
from aggregator.entry import listed_fields
from aggregator.manifest.model import namespaced_uri
from aggregator.sources.base import Published, PublishedResource
from aggregator.sources.mcp import McpSource
from aggregator.upstream import Upstream
from aggregator.upstream.answers import ListedResource, listed
from aggregator.upstream.records import Packed, PublishedRecords, ResourceRecords
from aggregator.upstream_rows import published_entry, published_rows
from tests.test_upstream import FAST, mcpserver

TEXT = st.text(st.characters(codec=None, blacklist_categories=()), max_size=12)
"""Any text, with control characters, NUL and lone surrogates (what a hostile upstream may send uncleaned)."""
URIS = st.sampled_from(["x://", "x://a/", "y:"]).flatmap(lambda start: st.text("ab/é.", min_size=0, max_size=6).map(
    lambda rest: start + rest))
RESOURCE = st.builds(ListedResource, uri=URIS, name=TEXT, title=st.none() | TEXT, description=st.none() | TEXT,
                     mime_type=st.none() | st.sampled_from(["text/plain", "", "application/json; q=1"]),
                     size=st.none() | st.integers(0, 2**62), mtime=st.none() | st.floats(0, 2e9))


def unique(items: list[ListedResource]) -> list[ListedResource]:
    """The first of each URI (as `UpstreamValues` keeps them)."""
    seen: dict[str, ListedResource] = {}
    for item in items:
        seen.setdefault(item.uri, item)
    return list(seen.values())


def published_before(items: list[ListedResource], namespace: str, root: str) -> list[PublishedResource]:
    """What `McpSource.published` built from the records before they were kept as columns."""
    return [PublishedResource(namespaced_uri(namespace, r.uri), r.uri[len(root):], r.name, r.title, r.description,
                              r.mime_type, r.size, r.mtime)
            for r in items if r.uri.startswith(root) and len(r.uri) > len(root)]


@settings(max_examples=300, deadline=None)
@given(st.lists(RESOURCE, max_size=20), st.sampled_from(["", "up+"]))
def test_records_rebuild_what_was_listed(items: list[ListedResource], prefix: str) -> None:
    items = unique(items)
    records = ResourceRecords(items, prefix)
    assert list(records) == sorted(items, key=lambda r: r.uri)
    assert records.uris == sorted(prefix + r.uri for r in items)
    for i, item in enumerate(records):
        assert records[i] == item and records.find(prefix + item.uri) == i
    assert records.find(prefix + "nowhere") is None
    assert ResourceRecords(reversed(items), prefix) == records == list(records)
    assert (ResourceRecords(items[1:], prefix) == records) == (len(items) < 2 and not items)


@settings(max_examples=300, deadline=None)
@given(st.lists(RESOURCE, max_size=20), st.sampled_from(["", "x://", "x://a/"]),
       st.sampled_from([frozenset(), frozenset({"team"})]))
def test_published_rows_are_the_entries_built_before(items: list[ListedResource], root: str,
                                                     access: frozenset[str]) -> None:
    """The compact rows of a namespace's published records list and read as the explicit entries did."""
    items = unique(items)
    published = PublishedRecords(ResourceRecords(items, "up+"), root)
    before = published_before(items, "up", root)
    assert sorted(published, key=lambda r: r.uri) == sorted(before, key=lambda r: r.uri)
    assert published == PublishedRecords(ResourceRecords(list(reversed(items)), "up+"), root) == list(published)
    assert list(published.locations()) == [(r.uri, r.path) for r in published]
    for paths in ({r.path for r in before[::2]} | {"", "nowhere"}, set()):
        assert set(Published(published).locations(paths)) == set(Published(before).locations(paths)) == {
            (r.uri, r.path) for r in before if r.path in paths}
    rows = published_rows(published, "up", access)
    explicit = Rows.of(published_entry(res, "up", access) for res in before)
    assert list(rows) == list(explicit) and rows[:] == explicit[:]
    assert [listed_fields(e) for e in rows] == [listed_fields(e) for e in explicit]
    assert not rows_change(rows, explicit).listing.listing_changed
    assert not rows_change(explicit, rows).listing.listing_changed
    for entry in explicit:
        assert rows.get(entry.uri) == entry and rows.is_compact(entry.uri)
    assert rows.files() == explicit.files()
    if len(explicit) > 2:  # a page that is not a run of the records (one gone from its middle)
        middle = explicit[len(explicit) // 2].uri
        assert rows.edited({middle}, ())[:] == [e for e in explicit if e.uri != middle]
    assert rows.count_needing_scopes() == explicit.count_needing_scopes()
    again = published_rows(PublishedRecords(ResourceRecords(list(reversed(items)), "up+"), root), "up", access)
    assert not rows_change(rows, again).listing.listing_changed


def test_absent_and_empty_fields_stay_apart() -> None:
    items = [ListedResource("x://a", "", "", None, ""), ListedResource("x://b", "b", None, "", None, 0, 0.0),
             ListedResource("x://c", "c\x00d", "t\x00", "d", "m", None, math.inf)]
    assert list(ResourceRecords(items)) == items
    broken = [ListedResource("x://a\nb", "a"), ListedResource("x://c", "c")]  # a line break (none once cleaned)
    assert list(ResourceRecords(broken, "up+")) == broken and ResourceRecords(broken, "up+").uris[0] == "up+x://a\nb"
    assert ResourceRecords([], "up+").uris == [] and list(ResourceRecords([ListedResource("", "")], "up+")) == [
        ListedResource("", "")]


@settings(max_examples=300, deadline=None)
@given(st.lists(RESOURCE, max_size=20), st.lists(RESOURCE, max_size=20), st.sampled_from(["", "up+"]))
def test_a_changed_relisting_keeps_the_uri_strings_it_had(before: list[ListedResource], after: list[ListedResource],
                                                          prefix: str) -> None:
    """Records made again (a relisting that changed) hold the kept records' string of each URI both list, not a
    new copy (the catalog's rows share those: a million made anew would be strewn over the heap)."""
    kept = ResourceRecords(unique(before), prefix)
    records = Packed(unique(after), prefix).records(kept)
    assert records == ResourceRecords(unique(after), prefix) and list(records) == sorted(unique(after),
                                                                                          key=lambda r: r.uri)
    held = {id(uri) for uri in kept.uris}
    assert [id(uri) in held for uri in records.uris] == [uri in kept.uris for uri in records.uris]


def test_an_unchanged_relisting_shares_the_records_kept() -> None:
    """Listing an upstream again that lists the same gives the records listed before (the catalog holds those: one
    copy, not one more each relisting); the upstream's records under the namespace, rebuilt as it listed them."""

    async def main() -> None:
        source = McpSource("up", Upstream("up", mcpserver(UPSTREAM_RESOURCES="30"), **FAST), namespace="up")
        try:
            first = await source.records()
            assert len(first) >= 30 and first.prefix == "up+" and "up+test://res/7" in first.uris
            assert first[first.find("up+test://res/7") or 0].uri == "test://res/7"
            again = await source.records()  # within the reuse window: the listing itself
            fresh = (await source.listing(fresh=True)).items
            assert again is first and fresh is first
        finally:
            await source.aclose()

    anyio.run(main)


def test_a_changed_relisting_shares_the_uri_strings_kept() -> None:
    """Listing an upstream again after it added a resource gives new records whose URIs listed before are the
    strings kept (the catalog's rows share them), not a copy of each made anew."""

    async def main() -> None:
        upstream = Upstream("up", mcpserver(UPSTREAM_RESOURCES="30", UPSTREAM_CHANGES="1"), **FAST)
        source = McpSource("up", upstream, namespace="up")
        try:
            first = await source.records()
            await source.read("test://add/x", 1000)  # the upstream adds test://added/x
            again = (await source.listing(fresh=True)).items
            assert "up+test://added/x" in again.uris and len(again) == len(first) + 1
            kept = {id(uri) for uri in first.uris}
            assert all(id(uri) in kept for uri in again.uris if uri != "up+test://added/x")
        finally:
            await source.aclose()

    anyio.run(main)


def test_a_size_past_64_bits_is_no_size() -> None:
    """A hostile upstream's size of 2**70 bytes is listed as none (the columns hold signed 64-bit sizes)."""
    for size, kept in ((2**70, None), (2**63, None), (2**63 - 1, 2**63 - 1), (-1, None), (0, 0)):
        resource = listed(types.Resource(uri="x://a", name="a", size=size))
        assert resource.size == kept and ResourceRecords([resource])[0] == resource


@settings(max_examples=300, deadline=None)
@given(st.lists(RESOURCE, max_size=12), st.lists(RESOURCE, max_size=12))
def test_changed_records_are_what_differs_resource_by_resource(before: list[ListedResource],
                                                                now: list[ListedResource]) -> None:
    """`PublishedRecords.changed` (one walk of the columns) names what comparing every resource names."""
    old, new = (PublishedRecords(ResourceRecords(unique(items), "up+"), "x://") for items in (before, now))
    by_uri_old, by_uri_new = {r.uri: r for r in old}, {r.uri: r for r in new}
    gone, came = new.changed(old)
    assert set(gone) == {uri for uri, r in by_uri_old.items() if by_uri_new.get(uri) != r}
    assert came == [r for uri, r in by_uri_new.items() if by_uri_old.get(uri) != r]
    assert new.changed(new) == ([], [])
