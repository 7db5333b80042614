"""Why a connection could not be made, in the operator's words: one wording for every client here that connects
(HTTP sources, the S3 client of sources and of manifests read from `s3://` URLs)."""

from __future__ import annotations

import errno

import aiohttp

__all__ = ["connect_failure"]


def connect_failure(exc: aiohttp.ClientConnectorError) -> str:
    """Why a connection failed, for the operator: the host and port and the system's reason (never headers)."""
    where = f"{exc.host}:{exc.port}"
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return f"DNS name not resolved: {exc.host}"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return f"TLS certificate refused for {where}: {exc.certificate_error}"
    if isinstance(exc, aiohttp.ClientConnectorSSLError):
        return f"TLS handshake with {where} failed"
    os_error = exc.os_error
    if isinstance(os_error, ConnectionRefusedError) or os_error.errno == errno.ECONNREFUSED:
        return f"connection refused {where}"
    if isinstance(os_error, TimeoutError):
        return f"connection to {where} timed out"
    reason = os_error.strerror or type(os_error).__name__
    return f"cannot connect to {where}: {reason[:1].lower()}{reason[1:]}"
