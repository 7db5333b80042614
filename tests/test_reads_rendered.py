"""reads/rendered.py: what each render read is remembered (bounded), so a change reaches the renders that read it,
in turn the renders that read those, and with a listing change the renders that listed resources. Rendering itself
is tested through the server in test_render.py."""

from __future__ import annotations

from aggregator.reads.rendered import RENDER_INPUTS_KEPT, RenderInputs


def _inputs() -> RenderInputs:
    inputs = RenderInputs()
    inputs.record("digest://week", {"reports://a.md", "reports://b.md"}, listed=True)
    inputs.record("summary://a", {"reports://a.md"}, listed=False)
    inputs.record("front://page", {"summary://a", "digest://week"}, listed=False)
    return inputs


def test_dependents_follow_renders_of_renders() -> None:
    inputs = _inputs()
    assert inputs.dependents({"reports://b.md"}) == {"digest://week", "front://page"}
    assert inputs.dependents({"reports://a.md"}) == {"digest://week", "summary://a", "front://page"}
    assert inputs.dependents({"reports://c.md"}) == set()


def test_a_listing_change_reaches_the_renders_that_listed() -> None:
    inputs = _inputs()
    assert inputs.dependents((), listing_changed=True) == {"digest://week", "front://page"}


def test_read_by_names_the_inputs_of_every_render_or_of_some_and_their_inputs() -> None:
    inputs = _inputs()
    assert inputs.read_by() == {"reports://a.md", "reports://b.md", "summary://a", "digest://week"}
    assert inputs.read_by({"front://page"}) == {"summary://a", "digest://week", "reports://a.md", "reports://b.md"}
    assert inputs.read_by({"summary://a", "reports://a.md"}) == {"reports://a.md"}


def test_a_new_render_replaces_what_the_last_one_read_and_the_map_is_bounded() -> None:
    inputs = _inputs()
    inputs.record("summary://a", {"reports://c.md"}, listed=False)
    assert "summary://a" not in inputs.dependents({"reports://a.md"})
    for i in range(RENDER_INPUTS_KEPT + 1):  # template URIs are chosen by clients
        inputs.record(f"echo://{i}", {"reports://x.md"}, listed=False)
    assert len(inputs.dependents({"reports://x.md"})) == RENDER_INPUTS_KEPT
