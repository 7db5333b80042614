"""The copy-on-write containers of chunked.py against plain models: a sorted list of keys and items edited again
and again, and a dict, over random edits (hypothesis); an edit shares what it did not touch."""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator import chunked as chunked_module
from aggregator.chunked import Chunked, Layered, chunked, edited, find_left, find_right

KEYS = st.text(alphabet="abcd/", max_size=5)
_edits = st.lists(st.tuples(st.sets(KEYS, max_size=12), st.sets(KEYS, max_size=40)), min_size=1, max_size=12)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 4 (and a merge past 3 added to one), so a few dozen keys split, merge and empty chunks."""
    monkeypatch.setattr(chunked_module, "LOAD", 4)
    monkeypatch.setattr(chunked_module, "_FEW", 3)


def _assert_sequence(got: Chunked[str], want: list[str]) -> None:
    assert list(got) == want and len(got) == len(want) and list(reversed(got)) == want[::-1]
    assert [got[i] for i in range(-len(want), len(want))] == want + want if want else True
    for i in range(len(want) + 1):
        for j in range(i, len(want) + 2):
            assert got[i:j] == want[i:j]
    assert got[::2] == want[::2]
    with pytest.raises(IndexError):
        got[len(want)]
    for probe in ["", "a", "ab", "b/", "c", "dddddd", *want]:
        assert got.bisect_left(probe) == bisect_left(want, probe)
        assert got.bisect_right(probe) == bisect_right(want, probe)
        assert got.bisect_right(probe[:1], lambda k: k[:1]) == bisect_right(want, probe[:1], key=lambda k: k[:1])
        assert bisect_left(got, probe) == bisect_left(want, probe)  # the generic protocol works too
        for lo in {0, len(want) // 2, len(want)}:
            cut = lambda k: k[: len(probe)]  # noqa: E731 (as prefix_range bisects)
            assert find_left(got, probe, lo) == bisect_left(want, probe, lo) == find_left(want, probe, lo)
            assert find_right(got, probe, lo, cut) == bisect_right(want, probe, lo, key=cut)


@settings(max_examples=150, deadline=None)
@given(initial=st.sets(KEYS, max_size=30), edits=_edits)
def test_edited_equals_a_sorted_list_edited(initial: set[str], edits: list[tuple[set[str], set[str]]]) -> None:
    want = sorted(initial)
    keys, items = chunked(want), chunked([k.upper() for k in want])
    for drop, add in edits:
        add -= set(want) - drop  # `add` brings keys not otherwise present
        before = list(keys)
        chunks_before = list(keys._chunks)
        new_keys, new_items = edited(keys, items, drop, sorted((k, k.upper()) for k in add))
        want = sorted((set(want) - drop) | add)
        _assert_sequence(new_keys, want)
        assert list(new_items) == [k.upper() for k in want]
        assert list(keys) == before  # the one edited is not changed
        assert all(chunk for chunk in new_keys._chunks) and all(len(c) <= 8 for c in new_keys._chunks)
        assert [len(c) for c in new_keys._chunks] == [len(c) for c in new_items._chunks]
        untouched = sum(1 for c in new_keys._chunks if any(c is old for old in chunks_before))
        assert untouched >= len(chunks_before) - len(drop) - len(add)  # chunks the edit did not touch are shared
        keys, items = new_keys, new_items


@settings(max_examples=150, deadline=None)
@given(initial=st.dictionaries(KEYS, st.integers(), max_size=30),
       edits=st.lists(st.tuples(st.sets(KEYS, max_size=8), st.dictionaries(KEYS, st.integers(), max_size=8)),
                      min_size=1, max_size=40))
def test_layered_equals_a_dict_edited(initial: dict[str, int], edits: list[tuple[set[str], dict[str, int]]]
                                      ) -> None:
    want = dict(initial)
    got = Layered.of(dict(initial))
    for drop, add in edits:
        before = dict(got.items())
        new = got.edited(drop, add)
        for key in drop:
            want.pop(key, None)
        want.update(add)
        assert dict(new.items()) == want and len(new) == len(want) and sorted(new) == sorted(want)
        assert sorted(new.values()) == sorted(want.values()) and len(new.values()) == len(want)
        for key in ["", "zz", *initial, *drop, *add]:
            assert new.get(key) == want.get(key) and (key in new) == (key in want)
            assert new.get(key, "none") == want.get(key, "none")
            if key in want:
                assert new[key] == want[key]
            else:
                with pytest.raises(KeyError):
                    new[key]
        assert dict(got.items()) == before  # the one edited is not changed
        got = new
