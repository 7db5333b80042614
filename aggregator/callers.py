"""Who sent a request, for scopes and the access log: nobody over stdio (the process owner), a bearer token's
holder over HTTP (aggregator.auth checked it), or an anonymous HTTP caller. Apart from auth.py so that stdio serving
does not import the HTTP auth stack."""

from __future__ import annotations

from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser

__all__ = ["caller_expiry", "caller_name", "caller_scopes"]


def _user(request: Any) -> AuthenticatedUser | None:
    user = getattr(request, "scope", {}).get("user")
    return user if isinstance(user, AuthenticatedUser) else None


def caller_scopes(request: Any) -> frozenset[str] | None:
    """The scopes of whoever sent `request`: None (everything) over stdio, where there is no HTTP request and the
    process owner already has the data; the token's scopes over HTTP; none for an anonymous HTTP caller."""
    if request is None:
        return None
    user = _user(request)
    return frozenset(user.scopes) if user is not None else frozenset()


def caller_expiry(request: Any) -> float | None:
    """When (time.time()) the token that sent `request` expires (a JWT's `exp`); None: it does not (a static
    token, stdio, an anonymous caller)."""
    user = _user(request) if request is not None else None
    expires = user.access_token.expires_at if user is not None else None
    return float(expires) if expires is not None else None


def caller_name(request: Any) -> str:
    """Who is asking, for the access log: the token's client, 'anonymous' over HTTP, 'stdio' locally."""
    if request is None:
        return "stdio"
    user = _user(request)
    if user is None:
        return "anonymous"
    token = user.access_token
    return token.subject or token.client_id
