"""Prometheus multiprocess mode for `serve --workers N`: one scrape, answered by any worker, covers them all.

The parent makes a private folder before forking and names it in PROMETHEUS_MULTIPROC_DIR, so the request
counters and histograms each worker makes write their own files there; it removes the folder at exit (a folder
left by a killed run is never reused: each run makes a new one). Figures read at scrape time (cache, catalog,
upstreams: a collector's families) are written by each worker as a snapshot, whole files replaced atomically,
and a scrape reads every file through prometheus_client's MultiProcessCollector.

The snapshot files are written with prometheus_client's own file writer (mmap_dict: MmapedDict, mmap_key), the
format its MultiProcessCollector reads; tests/test_metrics_multiprocess.py reads them back through it.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any, Protocol

__all__ = ["ENV", "Snapshot", "private_folder", "process_ended", "use_files"]

logger = logging.getLogger("aggregator.metrics")

ENV = "PROMETHEUS_MULTIPROC_DIR"


class Collector(Protocol):
    def collect(self) -> Iterable[Any]: ...


@contextmanager
def private_folder() -> Iterator[str]:
    """A new, empty folder named in PROMETHEUS_MULTIPROC_DIR for the block (children forked in it inherit it);
    removed, and the variable restored, on the way out."""
    folder = tempfile.mkdtemp(prefix="aggregator-metrics-")
    previous = os.environ.get(ENV)
    os.environ[ENV] = folder
    try:
        yield folder
    finally:
        if previous is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = previous
        shutil.rmtree(folder, ignore_errors=True)


def process_ended(folder: str, pid: int) -> None:
    """Forget the live figures of a worker that ended (prometheus_client's mark_process_dead, without importing
    it in the parent): its `live*` gauges leave the sums; its counters stay, as counters never go down."""
    for path in glob.glob(os.path.join(glob.escape(folder), f"gauge_live*_{pid}.db")):
        try:
            os.remove(path)
        except FileNotFoundError:  # a second call raced us
            pass
        except OSError as exc:  # the parent must go on waiting for the other workers
            logger.warning("cannot forget the figures of ended worker %d: %s", pid, exc)


def use_files() -> None:
    """Make metrics created from now on in this process write to the folder in PROMETHEUS_MULTIPROC_DIR, even if
    prometheus_client was imported before the variable was set (it picks its value class at import)."""
    from prometheus_client import values

    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue()


class Snapshot:
    """Writes what `collector` reports, now, as this process's figure files in `folder`.

    Counter families go to a counter file (summed over every worker that ever wrote one); gauge families to a
    gauge file of the mode `modes` gives their name (default `livesum`: summed over live workers). Each file is
    rewritten whole, so a series the collector no longer reports (a source a reload removed, the previous manifest
    digest) disappears from the next scrape. Other family types are not exported (logged once).
    """

    def __init__(self, collector: Collector, folder: str, modes: Mapping[str, str]) -> None:
        self.collector = collector
        self.folder = folder
        self.modes = modes
        self._skipped: set[str] = set()
        self._written: set[str] = set()

    def write(self) -> None:
        from prometheus_client.mmap_dict import MmapedDict, mmap_key

        pid = os.getpid()
        files: dict[str, list[tuple[str, float]]] = {}
        for family in self.collector.collect():
            if family.type == "counter":
                name = f"counter_live-{pid}.db"  # not counter_{pid}.db: that one is the worker's request counters
            elif family.type == "gauge":
                name = f"gauge_{self.modes.get(family.name, 'livesum')}_{pid}.db"
            else:
                if family.name not in self._skipped:
                    self._skipped.add(family.name)
                    logger.warning("metric %s (%s) is not exported with --workers", family.name, family.type)
                continue
            samples = files.setdefault(name, [])
            for sample in family.samples:
                key = mmap_key(family.name, sample.name, list(sample.labels), list(sample.labels.values()),
                               family.documentation)
                samples.append((key, float(sample.value)))
        for name in self._written - files.keys():
            os.remove(os.path.join(self.folder, name))
        for name, samples in files.items():
            path = os.path.join(self.folder, name)
            partial = path + ".partial"  # not *.db: a scrape reading the folder meanwhile does not see it
            with suppress(FileNotFoundError):  # left by a write that failed half-way: it would keep old keys
                os.remove(partial)
            written = MmapedDict(partial)
            try:
                for key, value in samples:
                    written.write_value(key, value, 0.0)
            finally:
                written.close()
            os.replace(partial, path)
        self._written = set(files)
