"""The retry policy of S3 sources (s3fs on aiobotocore): bounded retries for what may pass, none for an endpoint
that cannot be connected to.

botocore's default ("legacy", 5 attempts with exponential backoff) retries a refused connection or an unknown
name like a throttled request, so a source on a wrong or stopped endpoint took 7-11 s to report it, on every
probe, read and listing. Here the client is configured with botocore's "standard" mode and 3 attempts (throttling,
5xx answers, resets and timeouts), and its HTTP session reports a connection that could not be made at once, as
an error neither botocore nor s3fs retries. The manifest's `options.config_kwargs` still override each setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiobotocore.httpsession import AIOHTTPSession
from aiohttp import ClientConnectorError
from botocore.exceptions import BotoCoreError, EndpointConnectionError

from aggregator.sources.http import connect_failure

__all__ = ["DEFAULT_CONFIG", "EndpointUnreachableError", "FailFastSession", "s3_options"]

DEFAULT_CONFIG: Mapping[str, Any] = {"retries": {"mode": "standard", "total_max_attempts": 3}}
"""botocore `Config` settings an S3 source gets unless its `options.config_kwargs` names them (s3fs adds its own
connect_timeout of 5 s and read_timeout of 15 s the same way)."""


class EndpointUnreachableError(BotoCoreError):
    """No connection could be made to the endpoint (refused, unknown name, no route to it).

    Neither a botocore `ConnectionError` nor an `HTTPClientError`, so no retry mode of botocore and no retry loop
    of s3fs retries it: waiting a few seconds does not make a wrong endpoint right, and the next read asks again."""

    fmt = 'Could not connect to the endpoint URL ({reason}): "{endpoint_url}"'


class FailFastSession(AIOHTTPSession):
    """aiobotocore's HTTP session, except that a connection that could not be established raises
    `EndpointUnreachableError`; a failure once connected (a reset, a closed connection) stays retryable."""

    async def send(self, request: Any) -> Any:
        try:
            return await super().send(request)
        except EndpointConnectionError as exc:
            cause = exc.kwargs.get("error")
            # aiobotocore maps resets of an open connection (ClientOSError) to this error class too: only
            # aiohttp's connector errors mean no connection was made. Connect timeouts are another class.
            if not isinstance(cause, ClientConnectorError):
                raise
            raise EndpointUnreachableError(endpoint_url=request.url, reason=connect_failure(cause)) from None


def s3_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` for `S3FileSystem`, with `DEFAULT_CONFIG` and `FailFastSession` added to its `config_kwargs`
    where they do not name the setting already."""
    config = {**DEFAULT_CONFIG, "http_session_cls": FailFastSession, **(options.get("config_kwargs") or {})}
    return {**options, "config_kwargs": config}
