"""Errors the catalog raises for a request; the server turns each into the right MCP error for the wire.

Messages here are safe for clients: they name the URI, never a server path, secret or upstream body.
"""

from __future__ import annotations

__all__ = ["InvalidCursor", "RequestError", "ResourceCorrupt", "ResourceNotConverted", "ResourceNotFound",
           "ResourceOverBudget",
           "ResourceRenderFailed", "ResourceTooLarge", "ResourceUnavailable"]


class RequestError(Exception):
    """A request the catalog cannot serve. `uri` is None for errors not about one resource.

    `reason` says why for the operator (the log, `validate`): never part of `message`, never sent to a client.
    """

    def __init__(self, message: str, uri: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.uri = uri
        self.reason = reason


class ResourceNotFound(RequestError):
    """Unknown URI, or one refused for safety (indistinguishable on purpose)."""

    def __init__(self, uri: str) -> None:
        super().__init__(f"Resource not found: {uri}", uri)


class ResourceTooLarge(RequestError):
    def __init__(self, uri: str, size: int, limit: int) -> None:
        super().__init__(f"Resource {uri} is too large to serve ({size} bytes; the limit is {limit} bytes)", uri)
        self.size = size
        self.limit = limit


class ResourceUnavailable(RequestError):
    """The backend failed; details went to the server log."""

    def __init__(self, uri: str, reason: str | None = None) -> None:
        super().__init__(f"Resource {uri} could not be read right now", uri, reason)


class ResourceOverBudget(RequestError):
    """A rendered resource passed the server's render time limit or loop iterations (asking again gives the same
    answer); which one went to the server log."""

    def __init__(self, uri: str) -> None:
        super().__init__(f"Resource {uri} could not be rendered within the server's render limits", uri)


class ResourceCorrupt(RequestError):
    """The stored bytes cannot be served as the manifest asks (a `.gz` that is not gzip): asking again gives the
    same answer until the file changes."""

    def __init__(self, uri: str, why: str) -> None:
        super().__init__(f"Resource {uri} cannot be served: {why}", uri)


class ResourceNotConverted(RequestError):
    """A `convert:` file could not be converted (encrypted, corrupt, past a limit the message names): asking again
    gives the same answer until the file or the manifest changes."""

    def __init__(self, uri: str, why: str) -> None:
        super().__init__(f"Resource {uri} could not be converted to Markdown: {why}", uri)


class ResourceRenderFailed(RequestError):
    """A `render:` template failed by itself (an undefined name, a template error): asking again gives the same
    answer until the manifest changes. The cause went to the server log."""

    def __init__(self, uri: str, reason: str | None = None) -> None:
        super().__init__(f"Resource {uri} could not be rendered (see the server log)", uri, reason)


class InvalidCursor(RequestError):
    def __init__(self) -> None:
        super().__init__("Invalid pagination cursor")
