"""The S3 client settings (s3fs on aiobotocore) of S3 sources and of manifests read from `s3://` URLs: bounded
retries for what may pass, none for an endpoint that cannot be connected to, and one retry loop, botocore's.

botocore's default ("legacy", 5 attempts with exponential backoff) retries a refused connection or an unknown
name like a throttled request, so a source on a wrong or stopped endpoint took 7-11 s to report it, on every
probe, read and listing. Here the client is configured with botocore's "standard" mode and 3 attempts (throttling,
5xx answers, resets, connections closed unanswered, timeouts), and its HTTP session raises, for a connection that
could not be made, an error neither botocore nor s3fs retries, and for a request that got no answer, one botocore
retries and s3fs does not: s3fs's own loop ran botocore's 3 attempts 5 times over (and 5 times over that for a
ranged GET), so a store closing connections unanswered cost 15 requests and ~10 s per stat, 75 and ~50 s per read.
The manifest's `options.config_kwargs` still override each setting.

Error answers are the other half: s3fs's loop retries any error answer whose text says SlowDown or "reduce your
request rate", after botocore retried it already, so a store that kept throttling cost 15 requests and ~10 s per
GET (an object's body, a listing's page). `OneRetryLoopS3` ends its loop at an error answer botocore made all its
attempts for (or had no retry quota left for). s3fs still retries, 5 times, what botocore does not: a body cut
short or unparsable, and error answers botocore stopped at before its last attempt (a 400 or 429 whose code it does
not count as throttling but whose text asks to slow down, a checksum mismatch of an upload).
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiobotocore.httpsession import AIOHTTPSession
from aiohttp import ClientConnectorError
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError
from s3fs import S3FileSystem
from s3fs.core import _error_wrapper

from aggregator.connect_errors import connect_failure

__all__ = ["DEFAULT_CONFIG", "AttemptsSpentError", "EndpointUnreachableError", "FailFastSession", "NoAnswerError",
           "OneRetryLoopS3", "s3_options"]

DEFAULT_CONFIG: Mapping[str, Any] = {"retries": {"mode": "standard", "total_max_attempts": 3}}
"""botocore `Config` settings an S3 client gets unless its `options.config_kwargs` names them (s3fs adds its own
connect_timeout of 5 s and read_timeout of 15 s the same way)."""


class EndpointUnreachableError(BotoCoreError):
    """No connection could be made to the endpoint (refused, unknown name, no route to it).

    Neither a botocore `ConnectionError` nor an `HTTPClientError`, so no retry mode of botocore and no retry loop
    of s3fs retries it: waiting a few seconds does not make a wrong endpoint right, and the next read asks again."""

    fmt = 'Could not connect to the endpoint URL ({reason}): "{endpoint_url}"'

    @property
    def strerror(self) -> str:
        """Why, as an OSError says it (what a manifest's include reports): the host, port and system's reason."""
        return str(self.kwargs["reason"])


class NoAnswerError(BotoConnectionError):
    """A request that got no answer once connected: the connection closed before one, none came within the read
    timeout, or the HTTP client failed otherwise. Its message is botocore's own (`ConnectionClosedError`,
    `ReadTimeoutError`, `HTTPClientError`).

    A botocore `ConnectionError`, which botocore's retry modes retry, but no `HTTPClientError`, which s3fs's own
    loop would retry again around botocore's attempts."""

    fmt = "{message}"


class FailFastSession(AIOHTTPSession):
    """aiobotocore's HTTP session, except that a connection that could not be established raises
    `EndpointUnreachableError`, and a request that got no answer raises `NoAnswerError`; a reset of an open
    connection stays botocore's `EndpointConnectionError` (retried by botocore alone, like `NoAnswerError`)."""

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
        except HTTPClientError as exc:
            raise NoAnswerError(endpoint_url=request.url, message=str(exc)) from exc


def s3_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` for `S3FileSystem`, with `DEFAULT_CONFIG` and `FailFastSession` added to its `config_kwargs`
    where they do not name the setting already. The settings are copies: botocore rewrites the `retries` it is
    given in place (`max_attempts` becomes `total_max_attempts`, a `mode` is added), which changed the manifest's
    own options, so that a reload found an unchanged S3 source changed and opened it again."""
    config = {**DEFAULT_CONFIG, "http_session_cls": FailFastSession, **(options.get("config_kwargs") or {})}
    return {**options, "config_kwargs": copy.deepcopy(config)}


class AttemptsSpentError(Exception):
    """An error answer botocore made all its attempts for, or had no retry quota left to retry: the `ClientError`
    it raised, as its `__cause__`, message and `response`.

    No `ClientError` and none of s3fs's retryable errors, so s3fs's loop gives it up at once; s3fs then translates
    it from its `response` (`translate_boto_error` reads only that) into the same exception as the ClientError."""

    def __init__(self, error: ClientError) -> None:
        super().__init__(str(error))
        self.response = error.response


def _attempts_spent(error: ClientError) -> bool:
    """Whether botocore's retries ended `error`: its last attempt made, or its retry quota spent."""
    metadata = error.response.get("ResponseMetadata") or {}
    return bool(metadata.get("MaxAttemptsReached") or metadata.get("RetryQuotaReached"))


def _final_once_spent(call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """`call` (a client's API method), raising `AttemptsSpentError` for a `ClientError` whose attempts are spent."""

    async def final_once_spent(**params: Any) -> Any:
        try:
            return await call(**params)
        except ClientError as exc:
            if _attempts_spent(exc):
                raise AttemptsSpentError(exc) from exc
            raise

    return final_once_spent


class OneRetryLoopS3(S3FileSystem):
    """s3fs's `S3FileSystem`, whose own retry loop around each request leaves alone what botocore gave up on."""

    async def _call_s3(self, method: str, *akwarglist: Any, **kwargs: Any) -> Any:
        # s3fs's `_call_s3` (the same session, client, parameters and loop), the client's method wrapped.
        # tests/test_sdk_compat.py checks the s3fs internals named here are still there.
        await self.set_session()
        client = await self.get_s3(kwargs.get("Bucket"))
        call = getattr(client, method)
        params = self._get_s3_method_kwargs(call, *akwarglist, **kwargs)
        return await _error_wrapper(_final_once_spent(call), kwargs=params, retries=self.retries)
