"""`server.cluster.secret`: what replicas write to Redis carries an HMAC, so a replica ignores what no holder of the
secret wrote (anyone who can write the Redis database could otherwise make every replica serve content of their
choosing, or tell listeners of changes that never happened).

A sealed value is `SEALED` + HMAC-SHA256 (32 bytes) + the value, the MAC taken over where the value lives (key and
field, or channel) and the exact bytes, with a key derived from the secret: a value moved to another key, field or
channel does not verify. Without a secret values pass as they are, and a sealed one is refused (a replica cannot
check it). Sealing authenticates, it does not hide: whoever reads Redis reads the values.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Callable

__all__ = ["SEALED", "Seal", "Unsealed"]

SEALED = b"aggregator-sealed/1\n"
"""First bytes of every sealed value."""
_MAC_BYTES = hashlib.sha256().digest_size
_KEY_LABEL = b"aggregator cluster secret v1"


class Unsealed(ValueError):
    """A value without a valid MAC where a secret is set (or sealed where none is): never trusted."""


class Seal:
    """Seals values with the key derived from `secret`; with None, leaves them as they are. `refused` counts what
    `open` refused, by kind (event, content, versions), for /metrics."""

    def __init__(self, secret: str | None) -> None:
        # The secret itself is never kept, so no repr or traceback of this object can show it.
        self._key = None if secret is None else hmac.new(secret.encode(), _KEY_LABEL, hashlib.sha256).digest()
        self.refused: dict[str, int] = {}

    @property
    def on(self) -> bool:
        return self._key is not None

    def _mac(self, where: str, data: bytes) -> bytes:
        assert self._key is not None
        return hmac.new(self._key, where.encode(errors="surrogateescape") + b"\0" + data, hashlib.sha256).digest()

    def close(self, where: str, data: bytes) -> bytes:
        """`data` as stored or sent at `where` (a key and field, or a channel)."""
        if self._key is None:
            return data
        return SEALED + self._mac(where, data) + data

    def open(self, where: str, raw: bytes, kind: str, warn: Callable[[str, int], None] | None = None) -> bytes:
        """The value sealed in `raw` at `where`; Unsealed (counted under `kind`, and passed to `warn` with the count
        at the 1st, 2nd, 4th, 8th... time) when it is not sealed with this replica's key."""
        if self._key is None:
            if not raw.startswith(SEALED):
                return raw
            reason = "sealed with a server.cluster.secret this replica does not have"
        else:
            body = raw[len(SEALED) + _MAC_BYTES:]
            mac = raw[len(SEALED):len(SEALED) + _MAC_BYTES]
            if raw.startswith(SEALED) and len(mac) == _MAC_BYTES and hmac.compare_digest(mac, self._mac(where, body)):
                return body
            reason = "no valid MAC under server.cluster.secret" if raw.startswith(SEALED) else \
                "not sealed, and server.cluster.secret is set"
        count = self.refused[kind] = self.refused.get(kind, 0) + 1
        if warn is not None and math.log2(count).is_integer():
            warn(reason, count)
        raise Unsealed(reason)
