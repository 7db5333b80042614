"""ToldVersions: which polled or received versions are news to this replica's listeners (issue 24 item 11: each
change told once, across Redis outages). The end-to-end cases are in tests/test_cluster_outages.py."""

from __future__ import annotations

from aggregator.cluster.told import ToldVersions


def test_an_outage_change_told_alone_is_not_told_again_by_the_holder_or_an_event() -> None:
    holder, other = ToldVersions(), ToldVersions()
    assert holder.polled("fp", {"a.md": "v1", None: "r1"}, {}) == (set(), set())  # the first poll: a baseline
    # Redis out: each polls alone. The holder compares with what it polled last; the other, with no baseline
    # yet, takes one, then tells what changes after it.
    assert holder.alone("fp", {"a.md": "v2", None: "r1"}, {}) == {"a.md"}
    assert other.alone("fp", {"a.md": "v1"}, {}) == set()
    assert other.alone("fp", {"a.md": "v2"}, {"a.md": "v1"}) == {"a.md"}
    assert other.alone("fp", {"a.md": "v2"}, {"a.md": "v2"}) == set()
    # Redis back: the holder compares with the versions kept before the outage, publishes, tells nobody twice.
    changed, news = holder.polled("fp", {"a.md": "v2", None: "r1"}, {"a.md": "v1", None: "r1"})
    assert (changed, news) == ({"a.md"}, set())
    assert other.received("fp", {"a.md"}, {"a.md": "v2"}) == set()
    # The next change is news everywhere, once.
    assert holder.polled("fp", {"a.md": "v3", None: "r2"}, {"a.md": "v2", None: "r1"}) == ({"a.md", None},) * 2
    assert other.received("fp", {"a.md", None}, {"a.md": "v3", None: "r2"}) == {"a.md", None}
    assert other.received("fp", {"a.md", None}, {"a.md": "v3", None: "r2"}) == set()


def test_a_change_nobody_here_was_told_of_is_news_when_it_arrives() -> None:
    told = ToldVersions()
    # A first poll alone that already sees the change is not remembered: the holder's event then tells it.
    assert told.alone("fp", {"a.md": "v2"}, {}) == set()
    assert told.received("fp", {"a.md"}, {"a.md": "v2"}) == {"a.md"}
    # An event without versions (an older replica's) is always news; fingerprints are separate.
    assert told.received("fp", {"a.md"}, {}) == {"a.md"}
    assert told.received("other", {"a.md"}, {"a.md": "v2"}) == {"a.md"}
    # A holder that took over with no versions kept in Redis still compares with what it was told.
    assert told.polled("fp", {"a.md": "v3"}, {}) == ({"a.md"}, {"a.md"})


def test_memory_is_bounded_and_a_forgotten_path_is_news() -> None:
    told = ToldVersions(max_paths=2, max_sources=2)
    told.remember("fp", {"a": "1", "b": "1", "c": "1"})
    assert told.received("fp", {"a"}, {"a": "1"}) == {"a"}  # forgotten (oldest), so told again rather than lost
    assert told.received("fp", {"c"}, {"c": "1"}) == set()
    told.remember("x", {"a": "1"})
    told.remember("y", {"a": "1"})  # "fp" was used least recently: dropped
    assert told.received("fp", {"c"}, {"c": "1"}) == {"c"}
