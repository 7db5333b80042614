"""An upstream's resources/list pages over stdio on the lean lane (aggregator.upstream.pages): checked on the wire's
dict and made into records without the SDK's models, with what the SDK's client gives or raises for the same page.

End to end, a raw upstream (tests/page_upstream.py) serves pages of every kind of entry on both wires to our
`Upstream` and to the official client: the records, hints and errors are the client's (through `listed`), and the
requests came on the lane. The dict check itself is compared with the SDK's checks on generated pages."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client, StdioServerParameters
from pydantic import ValidationError

from aggregator.sources.base import SourceError
from aggregator.upstream import StdioTarget, Upstream
from aggregator.upstream.answers import hints, listed
from aggregator.upstream.pages import client_result, resource_page
from tests.conftest import MODES
from tests.test_upstream import FAST, HERE

MODERN = {"resultType": "complete", "ttlMs": 60000, "cacheScope": "private"}
ICON = {"src": "https://x/i.png", "mimeType": "image/png", "sizes": ["48x48", "any"], "theme": "dark"}
EVERY_KIND = [
    {"uri": "r://plain", "name": "plain"},
    {"uri": "r://all", "name": "all", "title": "All", "description": "every field", "mimeType": "text/plain",
     "size": 12, "icons": [ICON, {"src": "data:,"}], "_meta": {"k": [1, {"v": None}]},
     "annotations": {"audience": ["user", "assistant"], "priority": 0.5, "lastModified": "2025-01-12T15:00:58Z"},
     "extra": {"ignored": True}},
    {"uri": "r://nulls", "name": "nulls", "title": None, "description": None, "mimeType": None, "size": None,
     "icons": None, "annotations": None, "_meta": None},
    {"uri": "r://sizes/neg", "name": "n", "size": -1},
    {"uri": "r://sizes/big", "name": "b", "size": 2**63},
    {"uri": "r://sizes/huge", "name": "h", "size": 2**64 - 1},  # past 64 bits orjson gives a float (aggregator.codec)
    {"uri": "r://time/odd", "name": "t", "annotations": {"lastModified": "last tuesday", "priority": 1}},
    {"uri": "r://time/offset", "name": "o", "annotations": {"lastModified": "2025-01-12T15:00:58+02:00"}},
    {"uri": "r://empty", "name": "", "annotations": {}, "icons": []},
    {"uri": "r://caf\u00e9/\u2028", "name": "\U0001f600"},
]
COERCED = [  # values the models take by coercing them: the SDK's checks decide these pages
    {"uri": "r://coerced/size-text", "name": "s", "size": "5"},
    {"uri": "r://coerced/size-true", "name": "t", "size": True},
    {"uri": "r://coerced/size-float", "name": "f", "size": 5.0},
]
INVALID = [{"uri": "r://ok", "name": "ok"}, {"uri": 5, "name": "number"}, {"uri": "r://no-name"},
           {"uri": "r://bad", "name": "b", "annotations": {"priority": 2}}, "not an entry"]


def _serve(tmp_path: Path, pages: dict[str, Any]) -> dict[str, str]:
    (tmp_path / "pages.json").write_text(json.dumps(pages))
    return {"PAGE_FILE": str(tmp_path / "pages.json"), "IDS_FILE": str(tmp_path / "ids")}


def _ids(tmp_path: Path) -> list[Any]:
    found = [json.loads(line) for line in (tmp_path / "ids").read_text().splitlines()]
    (tmp_path / "ids").unlink()
    return found


async def _sdk_listing(env: dict[str, str], mode: str) -> tuple[list[Any], tuple[int | None, str | None]]:
    """What the official client lists (every page), made into records as the SDK path makes them."""
    server = StdioServerParameters(command=sys.executable, args=[str(HERE / "page_upstream.py")], env=env)
    async with Client(server, mode=mode, cache=None) as client:
        items, cursor, given_hints = [], None, (None, None)
        while True:
            result = await client.list_resources(cursor=cursor, cache_mode="bypass")
            items += [listed(resource) for resource in result.resources]
            given_hints = hints(client, result)
            if (cursor := result.next_cursor) is None:
                return items, given_hints


def _upstream(env: dict[str, str], mode: str) -> Upstream:
    return Upstream("p", StdioTarget([sys.executable, str(HERE / "page_upstream.py")], env=env), mode=mode, **FAST)


@pytest.mark.parametrize("mode", MODES)
def test_pages_of_every_kind_of_entry_list_on_the_lane_as_the_sdk_client_lists_them(mode: str,
                                                                                   tmp_path: Path) -> None:
    hinted = MODERN if mode == "auto" else {}
    env = _serve(tmp_path, {"0": {"resources": EVERY_KIND, "nextCursor": "c1", "_meta": {"m": 1}, **hinted},
                            "c1": {"resources": COERCED + EVERY_KIND[:2], "nextCursor": None, **hinted}})

    async def main() -> None:
        expected, expected_hints = await _sdk_listing(env, mode)
        assert all(isinstance(rid, int) for rid in _ids(tmp_path))
        up = _upstream(env, mode)
        try:
            listing = await up.list_resources()
        finally:
            await up.aclose()
        assert list(listing.items) == expected and len(expected) == len(EVERY_KIND) + len(COERCED) + 2
        assert (listing.ttl_ms, listing.cache_scope) == expected_hints
        assert expected_hints == ((60000, "private") if mode == "auto" else (None, None))
        sent = _ids(tmp_path)
        assert len(sent) == 2 and all(isinstance(rid, str) and rid.startswith("agg-") for rid in sent)  # the lane's

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_an_invalid_entry_fails_the_listing_as_the_sdk_client_fails_it(mode: str, tmp_path: Path) -> None:
    hinted = MODERN if mode == "auto" else {}
    env = _serve(tmp_path, {"0": {"resources": EVERY_KIND + INVALID, **hinted}})

    async def main() -> None:
        with pytest.raises(BaseException) as raised:  # the client's task group wraps it
            await _sdk_listing(env, mode)
        failure: BaseException = raised.value
        while isinstance(failure, BaseExceptionGroup) and len(failure.exceptions) == 1:
            failure = failure.exceptions[0]
        assert isinstance(failure, ValidationError) and failure.error_count() == 4
        up = _upstream(env, mode)
        try:
            with pytest.raises(SourceError, match=r"resources/list: malformed answer \(4 errors\)"):
                await up.list_resources()
            assert up.status.state == "connected" and up.status.reconnects == 0
            assert str(_ids(tmp_path)[-1]).startswith("agg-")
        finally:
            await up.aclose()

    anyio.run(main)


@pytest.mark.parametrize("answer", ["none", "junk"])
def test_a_page_not_answered_times_out_and_is_cancelled_upstream(answer: str, tmp_path: Path) -> None:
    """No answer, or one that is no JSON-RPC result (the SDK's session drops it): the listing fails at its own
    timeout, the upstream is told it was given up, and the connection stays."""
    env = {**_serve(tmp_path, {"0": {"resources": EVERY_KIND}}), "PAGE_ANSWER": answer}

    async def main() -> None:
        up = Upstream("p", StdioTarget([sys.executable, str(HERE / "page_upstream.py")], env=env), mode="legacy",
                      timeout=30.0, connect_timeout=30.0, list_timeout=0.5)
        try:
            await up.connect()
            with pytest.raises(SourceError, match=r"no answer to resources/list within 0.5s"):
                await up.list_resources()
            with anyio.fail_after(10):
                while len(seen := (tmp_path / "ids").read_text().splitlines()) < 2:
                    await anyio.sleep(0.05)
            sent, cancelled = (json.loads(line) for line in seen)
            assert str(sent).startswith("agg-") and cancelled == {"cancelled": sent}
            assert up.status.state == "connected" and up.status.reconnects == 0
        finally:
            await up.aclose()

    anyio.run(main)


# ---- the dict check against the SDK's checks ----

_TEXT = st.one_of(st.none(), st.text(max_size=4), st.integers(-2, 2), st.booleans(), st.floats(allow_nan=False))
_ANY = st.one_of(_TEXT, st.lists(st.text(max_size=2), max_size=2), st.dictionaries(st.text(max_size=2), _TEXT,
                                                                                    max_size=2))
_SIZES = st.one_of(st.none(), st.integers(-3, 3), st.sampled_from([2**63 - 1, 2**63, 2**70]), st.booleans(),
                   st.sampled_from([5.0, 5.5, "5", " 6 ", "x", math.inf]))
_ANNOTATIONS = st.one_of(_ANY, st.fixed_dictionaries({}, optional={
    "audience": st.one_of(_ANY, st.lists(st.sampled_from(["user", "assistant", "bot", 1]), max_size=3)),
    "priority": st.one_of(_ANY, st.floats(-0.5, 1.5), st.sampled_from([0, 1, 2, True])),
    "lastModified": st.one_of(_TEXT, st.sampled_from(["2025-01-12T15:00:58Z", "2025-01-12", "2025-13-40T00:00:00"])),
}))
_ICON = st.fixed_dictionaries({}, optional={"src": _TEXT, "mimeType": _TEXT, "theme": st.one_of(
    _TEXT, st.sampled_from(["light", "dark", "dim"])), "sizes": st.one_of(_ANY, st.lists(_TEXT, max_size=2))})
_ENTRY = st.one_of(st.fixed_dictionaries({"uri": st.text(max_size=4), "name": st.text(max_size=4)}),
                   st.fixed_dictionaries({"uri": st.one_of(st.text(max_size=4), _TEXT)}, optional={
                       "name": _TEXT, "title": _TEXT, "description": _TEXT, "mimeType": _TEXT, "size": _SIZES,
                       "annotations": _ANNOTATIONS, "icons": st.one_of(_ANY, st.lists(st.one_of(_ICON, _TEXT),
                                                                                       max_size=2)),
                       "_meta": _ANY, "other": _ANY}), _TEXT)
_PAGE = st.fixed_dictionaries({"resources": st.one_of(st.lists(_ENTRY, max_size=6), _ANY)}, optional={
    "nextCursor": _TEXT, "_meta": _ANY, "ttlMs": st.one_of(_SIZES, st.integers(-5, 5)),
    "cacheScope": st.one_of(_TEXT, st.sampled_from(["public", "private", "shared"])),
    "resultType": st.one_of(_TEXT, st.sampled_from(["complete", "input_required"]))})


@settings(max_examples=400, deadline=None)
@given(page=_PAGE, version=st.sampled_from(["2025-11-25", "2026-07-28"]), room=st.integers(0, 7))
def test_the_dict_check_gives_what_the_sdk_checks_give(page: dict[str, Any], version: str, room: int) -> None:
    """Records, hints and cursor equal to the SDK's models made into records, or the same ValidationError."""
    try:
        model = client_result("resources/list", version, copy.deepcopy(page), types.ListResourcesResult)
    except ValidationError as exc:
        with pytest.raises(ValidationError) as ours:
            resource_page(copy.deepcopy(page), version, room)
        assert ours.value.errors(include_url=False) == exc.errors(include_url=False)
        return
    got = resource_page(copy.deepcopy(page), version, room)
    assert got.items == [listed(resource) for resource in model.resources[:room]]
    assert got.parsed == len(model.resources) and got.next_cursor == model.next_cursor
    sent, modern = model.model_fields_set, version == "2026-07-28"
    assert (got.ttl_ms, got.cache_scope) == (model.ttl_ms if modern and "ttl_ms" in sent else None,
                                             model.cache_scope if modern and "cache_scope" in sent else None)


def test_each_entry_dict_is_dropped_once_recorded() -> None:
    page = {"resources": [{"uri": f"r://{i}", "name": str(i)} for i in range(5)]}
    got = resource_page(page, "2025-11-25", 3)
    assert [item.uri for item in got.items] == ["r://0", "r://1", "r://2"] and got.parsed == 5
    assert page["resources"] == [None] * 5
