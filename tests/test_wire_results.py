"""The fast paths' memory of accepted modern envelopes: an envelope is known again only when it is the very one
accepted (equal, and of the same types where `==` cannot tell 1, 1.0 and true apart); anything else is classified
and validated by the SDK as before, and refused when the SDK refuses it."""

from __future__ import annotations

import copy
from typing import Any

from aggregator.wire_results import Envelopes

READ = "resources/read"
MODERN = "2026-07-28"
VERSION, INFO, CAPABILITIES = (f"io.modelcontextprotocol/{key}"
                               for key in ("protocolVersion", "clientInfo", "clientCapabilities"))
META: dict[str, Any] = {VERSION: MODERN, INFO: {"name": "client", "version": "1"},
                        CAPABILITIES: {"roots": {"listChanged": True}, "experimental": {"x": {"n": 1, "f": 1.5}}},
                        "progressToken": 1}


def _with(path: tuple[str, ...], value: object) -> dict[str, Any]:
    """META with the value at `path` replaced (a fresh copy)."""
    meta = copy.deepcopy(META)
    node = meta
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return meta


def test_an_accepted_envelope_is_known_again_only_when_it_is_the_same() -> None:
    envelopes = Envelopes()
    assert envelopes.known(READ, META) is None  # nothing accepted yet
    assert envelopes.valid(READ, MODERN, {"uri": "a://b", "_meta": META})
    assert envelopes.known(READ, copy.deepcopy(META)) == MODERN  # the same envelope, decoded afresh
    assert envelopes.known("resources/list", META) is None  # accepted on one method only
    variants = [
        _with((CAPABILITIES, "roots", "listChanged"), 1),  # equal to True, another type
        _with((CAPABILITIES, "roots", "listChanged"), 1.0),
        _with(("progressToken",), True),
        _with(("progressToken",), 1.0),
        _with((CAPABILITIES, "experimental", "x", "n"), 1.0),
        _with((INFO, "version"), "2"),  # one value differs
        _with((VERSION,), "2025-11-25"),
        {**META, "extra": None},  # one key more
        {key: value for key, value in META.items() if key != "progressToken"},  # one key fewer
        None, [META], "x",
    ]
    for variant in variants:
        assert envelopes.known(READ, variant) is None, variant
    assert envelopes.known(READ, META) == MODERN  # misses do not forget it


def test_a_different_envelope_is_still_validated_and_refused_as_before() -> None:
    envelopes = Envelopes()
    assert envelopes.valid(READ, MODERN, {"uri": "", "_meta": META})
    refused = [_with((INFO, "version"), 1), _with((CAPABILITIES, "experimental", "x"), 1),
               _with((CAPABILITIES, "experimental", "x"), True)]
    for meta in refused:
        assert not envelopes.valid(READ, MODERN, {"uri": "", "_meta": meta}), meta
        assert envelopes.known(READ, meta) is None
    accepted = _with((CAPABILITIES, "roots", "listChanged"), 1)  # the SDK takes 1 for a boolean: validated, then kept
    assert envelopes.valid(READ, MODERN, {"uri": "", "_meta": accepted})
    assert envelopes.known(READ, accepted) == MODERN
    assert envelopes.valid(READ, MODERN, {"uri": "", "_meta": META})  # the first one is still valid


def test_the_kept_envelope_is_a_copy() -> None:
    """A caller changing the envelope it passed (the decoded request is the caller's) does not change what is
    known."""
    envelopes = Envelopes()
    meta = copy.deepcopy(META)
    assert envelopes.valid(READ, MODERN, {"uri": "", "_meta": meta})
    meta[INFO]["version"] = 1
    assert envelopes.known(READ, meta) is None
    assert envelopes.known(READ, META) == MODERN


def test_a_deeply_nested_envelope_is_validated_each_time_it_is_not_kept() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(200):
        node["n"] = {}
        node = node["n"]
    meta = _with((CAPABILITIES, "experimental", "x"), deep)
    envelopes = Envelopes()
    assert envelopes.valid(READ, MODERN, {"uri": "", "_meta": meta})
    assert envelopes.valid(READ, MODERN, {"uri": "", "_meta": copy.deepcopy(meta)})
    assert envelopes.known(READ, meta) is None  # too deep to keep for a comparison: validated as before


def test_a_long_envelope_is_validated_each_time_it_is_not_kept() -> None:
    """An envelope of megabytes (a request line may be 16 MB) is validated but not kept: 256 of them would be kept."""
    meta = _with((CAPABILITIES, "experimental", "x"), {"padding": "p" * Envelopes.KEPT_CHARS})
    envelopes = Envelopes()
    assert envelopes.valid(READ, MODERN, {"uri": "", "_meta": meta})
    assert envelopes.known(READ, meta) is None and not envelopes._valid  # noqa: SLF001
    assert envelopes.valid(READ, MODERN, {"uri": "", "_meta": META})
    assert envelopes.known(READ, META) == MODERN


# The read result's own sieve: what `read_sieved` makes of a result is what the SDK's sieve makes of it, keys in the
# same order; any result it does not take is left to the SDK.

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from mcp_types import methods as sdk_methods  # noqa: E402

from aggregator.content import Content  # noqa: E402
from aggregator.mcp_shapes import ReadResult, read_result  # noqa: E402
from aggregator.wire_results import read_sieved, shaped  # noqa: E402

_VALUE = st.one_of(st.text(), st.none(), st.integers(), st.booleans(), st.floats(allow_nan=False), st.binary())
_ITEM = st.one_of(
    st.fixed_dictionaries({"uri": st.text(), "mimeType": st.text(), "text": st.text()}),
    st.fixed_dictionaries({"uri": st.text(), "mimeType": st.text(), "blob": st.text()}),
    st.dictionaries(st.sampled_from(["uri", "mimeType", "text", "blob", "_meta", "x"]), _VALUE, max_size=4),
    _VALUE)
_RESULT = st.fixed_dictionaries(
    {"contents": st.one_of(st.lists(_ITEM, max_size=3), _VALUE)},
    optional={"ttlMs": st.one_of(st.integers(min_value=-5, max_value=2**70), _VALUE),
              "cacheScope": st.one_of(st.sampled_from(["public", "private", "shared"]), _VALUE),
              "resultType": st.one_of(st.just("complete"), st.text(max_size=3), _VALUE),
              "_meta": st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), "other": _VALUE})


_GOOD = st.fixed_dictionaries({
    "contents": st.lists(st.one_of(_ITEM.filter(lambda item: type(item) is dict and len(item) == 3)), max_size=3),
    "ttlMs": st.integers(min_value=-1, max_value=2**64), "cacheScope": st.sampled_from(["public", "private", "x"]),
    "resultType": st.sampled_from(["complete", "input_required", ""])})
"""Results of our handler's shape, values in and out of range, the strings anything."""


def _sieve(version: str, result: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return sdk_methods.serialize_server_result(READ, version, result)
    except Exception:  # noqa: BLE001 - refused: the fast shape must not take it
        return None


@settings(max_examples=600, deadline=None)
@given(version=st.sampled_from(["2025-11-25", MODERN, "2025-06-18"]), result=st.one_of(_RESULT, _GOOD))
def test_the_read_sieve_gives_what_the_sdks_gives_or_leaves_it_to_the_sdk(version: str, result: dict[str, Any]
                                                                           ) -> None:
    fast = read_sieved(version, result)
    if fast is not None:
        expected = _sieve(version, result)
        assert fast == expected and list(fast) == list(expected)  # type: ignore[arg-type]
        assert all(list(a) == list(b) for a, b in zip(fast["contents"], expected["contents"]))  # type: ignore[index]


def test_the_reads_our_handler_builds_take_the_fast_sieve() -> None:
    """Text and blob reads on both wires (the results `resources.read_resource` builds) never reach the models."""
    for item in ({"uri": "docs://a.md", "mimeType": "text/markdown", "text": "# A\n\u00fc"},
                 {"uri": "docs://b.png", "mimeType": "image/png", "blob": "iVBORw0KGgo="}):
        for version in ("2025-11-25", MODERN):
            result = {"contents": [item], "ttlMs": 60000, "cacheScope": "public", "resultType": "complete"}
            fast = read_sieved(version, result)
            assert fast is not None and fast == _sieve(version, result) and list(fast) == list(_sieve(version, result))


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(["2025-11-25", MODERN]), result=_GOOD)
def test_a_result_of_our_shape_is_sieved_fast_when_its_values_are_valid(version: str, result: dict[str, Any]
                                                                          ) -> None:
    valid = all(type(v) is str for item in result["contents"] for v in item.values()) and (
        version == "2025-11-25" or (result["ttlMs"] >= 0 and result["cacheScope"] in ("public", "private")))
    assert (read_sieved(version, result) is not None) == valid


class _Server:
    """What `shaped` uses of the SDK's server: its cache hints and its `serverInfo` stamp."""

    cache_hints: dict[str, Any] = {}
    server_info_stamp = {"name": "t", "version": "1"}


_CONTENTS = st.builds(lambda mime, text, blob: Content(mime, text, None) if blob is None else Content(mime, None, blob),
                      st.text(max_size=8), st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=20)))


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(["2025-11-25", MODERN, "2025-06-18"]), uri=st.text(max_size=10), content=_CONTENTS,
       ttl=st.floats(min_value=-5, max_value=1e9), private=st.booleans())
def test_a_read_result_is_shaped_as_the_sdks_sieve_shapes_the_same_dict(version: str, uri: str, content: Content,
                                                                         ttl: float, private: bool) -> None:
    """`shaped` takes a `ReadResult` without checking it again: what it gives must be what the sieve gives the same
    result as a plain dict, keys in the same order, on every version (those it does not know go to the sieve)."""
    result = read_result(uri, content, ttl, private)
    assert type(result) is ReadResult
    fast, slow = shaped(_Server(), READ, version, result), shaped(_Server(), READ, version, dict(result))
    assert fast == slow and list(fast) == list(slow)
    assert all(list(a) == list(b) for a, b in zip(fast["contents"], slow["contents"]))
    sieved = _sieve(version, dict(result))
    assert sieved is not None and sieved["contents"] == fast["contents"]
