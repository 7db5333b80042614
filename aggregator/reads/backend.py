"""One source call made for a read: traced as a span, its failures turned into client-safe errors naming the URI
(details go to the log only), and every failure but not-found counted per source."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aggregator.catalog import FileTarget, QueryTarget
from aggregator.errors import RequestError, ResourceNotFound, ResourceTooLarge, ResourceUnavailable
from aggregator.snapshot import Snapshot
from aggregator.sources import SourceError, SourceNotFound, SourceTooLarge, SourceUnsupported
from aggregator.tracing import NO_SPAN, enabled, span

__all__ = ["SourceCalls"]

logger = logging.getLogger("aggregator")
T = TypeVar("T")


class SourceCalls:
    """Runs the backend calls of reads, and keeps per source id how many failed and why the last one did."""

    def __init__(self) -> None:
        self.errors: Counter[str] = Counter()
        """Failed backend calls per source id, since start (for /metrics)."""
        self.last_error: dict[str, tuple[float, str]] = {}
        """Per source id, when (time.time()) and why its last backend call failed (operator detail: the console)."""
        self.last_success: dict[str, float] = {}
        """Per source id, when (time.time()) its last backend call succeeded (a not-found answer counts: it came)."""

    async def call(self, name: str, snapshot: Snapshot, target: FileTarget | QueryTarget, path: str | None,
                   call: Callable[[], Awaitable[T]]) -> T:
        """`call()` in a span `name` (source id and kind, path, URI: never the source's URL or content); a source's
        failure becomes ResourceNotFound, ResourceTooLarge or ResourceUnavailable for `target`'s URI."""
        with span(name, source_id=target.source, source_kind=snapshot.manifest.sources[target.source].kind,
                  path=path, uri=target.uri) if enabled() else NO_SPAN:
            try:
                result = await call()
            except SourceError as exc:
                raise self.failure(snapshot, target, exc) from None
            self.succeeded(target.source)
            return result

    def succeeded(self, source: str) -> None:
        """A backend call of `source` answered."""
        self.last_success[source] = time.time()

    def failure(self, snapshot: Snapshot, target: FileTarget | QueryTarget, exc: SourceError) -> RequestError:
        """What a client is told of a source's failure `exc` reading `target` (counted and logged here)."""
        source = snapshot.sources[target.source]
        if isinstance(exc, (SourceNotFound, SourceUnsupported)):
            self.succeeded(target.source)
            logger.info("read %s: not found (%s)", target.uri, exc)
            return ResourceNotFound(target.uri)
        if isinstance(exc, SourceTooLarge):
            self._failed(target.source, str(exc))
            self.succeeded(target.source)  # the backend answered: the file is the problem
            logger.warning("read %s: %s", target.uri, exc)
            return ResourceTooLarge(target.uri, exc.size, exc.limit)
        self._failed(target.source, f"{source.describe()}: {exc}")
        logger.error("read %s from %s failed: %s", target.uri, source.describe(), exc)
        return ResourceUnavailable(target.uri, f"{source.describe()}: {exc}")

    def _failed(self, source: str, why: str) -> None:
        self.errors[source] += 1
        self.last_error[source] = (time.time(), why)
