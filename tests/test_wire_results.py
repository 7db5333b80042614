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
