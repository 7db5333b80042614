"""The figure files of `--workers N` (aggregator.metrics_multiprocess), read back by prometheus_client's own
MultiProcessCollector: what a scrape sees as workers write, reload and end."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from aggregator.metrics_multiprocess import ENV, Snapshot, private_folder, process_ended

pytest.importorskip("prometheus_client", reason="the metrics extra (prometheus-client) is not installed")


class Figures:
    """A collector whose families the test sets: a counter, a summed gauge and a labelled max gauge."""

    def __init__(self) -> None:
        self.hits = 0.0
        self.entries = 0.0
        self.digest = "aaa"

    def collect(self) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        info = GaugeMetricFamily("t_manifest_info", "digest", labels=["sha256"])
        info.add_metric([self.digest], 1.0)
        return [CounterMetricFamily("t_hits", "hits", value=self.hits),
                GaugeMetricFamily("t_entries", "entries", value=self.entries), info,
                HistogramMetricFamily("t_unsupported", "not exported", buckets=[("+Inf", 1.0)], sum_value=1.0)]


def scrape(folder: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample values by name and labels, as one scrape of the folder would show them."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=folder)
    seen: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in registry.collect():
        for sample in family.samples:
            seen.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return seen


def test_snapshots_replace_their_series_and_an_ended_worker_leaves_the_live_gauges(tmp_path: Path) -> None:
    figures = Figures()
    snapshot = Snapshot(figures, str(tmp_path), {"t_manifest_info": "livemax"})
    figures.hits, figures.entries = 3, 2
    snapshot.write()
    seen = scrape(str(tmp_path))
    assert seen["t_hits_total"] == {(): 3.0} and seen["t_entries"] == {(): 2.0}
    assert seen["t_manifest_info"] == {(("sha256", "aaa"),): 1.0}
    assert "t_unsupported_sum" not in seen  # a histogram snapshot could not be summed: not exported
    # Another worker's figures (its pid in the file names), as it would have written them.
    other = tmp_path / "other"
    other.mkdir()
    Snapshot(figures, str(other), {"t_manifest_info": "livemax"}).write()
    for written in other.iterdir():
        written.rename(tmp_path / written.name.replace(str(os.getpid()), "999999999"))
    figures.hits, figures.digest = 5, "bbb"  # a reload: the old digest must go, not linger at 1
    snapshot.write()
    seen = scrape(str(tmp_path))
    assert seen["t_hits_total"] == {(): 8.0} and seen["t_entries"] == {(): 4.0}
    assert seen["t_manifest_info"] == {(("sha256", "aaa"),): 1.0, (("sha256", "bbb"),): 1.0}  # workers disagree
    process_ended(str(tmp_path), 999999999)
    seen = scrape(str(tmp_path))
    assert seen["t_entries"] == {(): 2.0} and seen["t_manifest_info"] == {(("sha256", "bbb"),): 1.0}
    assert seen["t_hits_total"] == {(): 8.0}  # counters never go down, even when a worker ends
    assert not list(tmp_path.glob("*.partial"))


def test_private_folder_is_new_named_in_the_environment_and_removed(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv(ENV, str(tmp_path))  # a folder of an earlier run, or the operator's: never reused
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    with private_folder() as folder:
        assert os.environ[ENV] == folder and Path(folder).is_dir() and folder != str(tmp_path)
        assert list(Path(folder).iterdir()) == []
        (Path(folder) / "counter_1.db").write_bytes(b"")
    assert os.environ[ENV] == str(tmp_path) and not Path(folder).exists()
