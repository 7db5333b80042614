"""Bearer-token auth for HTTP serving: static tokens and JWTs (OAuth 2.1 resource server), RFC 9728 metadata.

Built from the SDK's parts (`BearerAuthBackend`, `RequireAuthMiddleware`): a verifier turns a token into an
`AccessToken` or None, and `protect` puts the check in front of the MCP endpoint (and the console's data, under
/console/api/) only, so /healthz, /metrics and the metadata document stay reachable. A caller's token is never passed
on: sources only see the manifest's headers.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import AccessToken
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from aggregator.manifest.model import AuthSettings, JwtSettings, StaticToken

if TYPE_CHECKING:
    from pydantic import AnyHttpUrl

__all__ = ["Verifier", "caller_name", "caller_scopes", "metadata_routes", "metadata_url", "protect", "verifier_for"]

logger = logging.getLogger("aggregator.auth")

_JWKS_REFRESH_S = 300.0  # keys are re-read this often at most, unless an unknown key id appears
_JWKS_MIN_REFETCH_S = 30.0  # tokens naming unknown key ids cannot make us fetch the JWKS more often than this


class StaticTokens:
    """Tokens from the manifest, compared by SHA-256 digest in constant time."""

    def __init__(self, tokens: Sequence[StaticToken]) -> None:
        self._tokens = tuple(tokens)

    async def verify_token(self, token: str) -> AccessToken | None:
        digest = hashlib.sha256(token.encode("utf-8")).hexdigest()
        found = None
        for known in self._tokens:  # every digest is compared, so timing does not tell which one matched
            if hmac.compare_digest(known.sha256, digest):
                found = known
        if found is None:
            return None
        return AccessToken(token="", client_id=found.name, scopes=list(found.scopes), subject=found.name)


class JwtTokens:
    """JWT access tokens: signature by a key of the issuer's JWKS, `iss`, `aud`, `exp` (and `nbf`) checked."""

    def __init__(self, settings: JwtSettings, audience: str) -> None:
        import jwt  # the `auth` extra

        self._jwt = jwt
        self.settings = settings
        self.audience = settings.audience or audience
        self._keys: Any = None
        self._fetched_at = -1e9
        self._tried_at = -1e9
        self._lock = anyio.Lock()

    async def verify_token(self, token: str) -> AccessToken | None:
        jwt = self._jwt
        try:
            header = jwt.get_unverified_header(token)
            key = await self._key(header.get("kid"))
            if key is None:
                logger.info("JWT refused: no key %r in the issuer's JWKS", header.get("kid"))
                return None
            claims = jwt.decode(token, key, algorithms=list(self.settings.algorithms), audience=self.audience,
                                issuer=self.settings.issuer, leeway=self.settings.leeway,
                                options={"require": ["exp", "iss", "aud"]})
        except jwt.PyJWTError as exc:
            logger.info("JWT refused: %s", exc)  # the reason only: never the token
            return None
        except OSError as exc:
            logger.warning("JWKS of %s unreachable: %s", self.settings.issuer, exc)
            return None
        client = str(claims.get("client_id") or claims.get("azp") or claims.get("sub") or "?")
        return AccessToken(token="", client_id=client, scopes=self._scopes(claims), expires_at=int(claims["exp"]),
                           resource=self.audience, subject=claims.get("sub"), claims={"iss": claims.get("iss")})

    def _scopes(self, claims: dict[str, Any]) -> list[str]:
        value = claims.get(self.settings.scopes_claim, claims.get("scp", ""))
        if isinstance(value, str):
            return value.split()
        if isinstance(value, list):
            return [str(v) for v in value]
        return []

    async def _key(self, kid: str | None) -> Any:
        """The signing key named `kid` (or the only key when the token names none), fetching the JWKS when needed."""
        async with self._lock:
            now = time.monotonic()
            key = self._find(kid)
            stale = now - self._fetched_at > _JWKS_REFRESH_S
            # Failed attempts count for the rate limit too, so an issuer's outage is not hammered by every request.
            if (key is None or stale) and now - self._tried_at > _JWKS_MIN_REFETCH_S:
                self._tried_at = now
                try:
                    data = await anyio.to_thread.run_sync(_fetch_json, self.settings.jwks_url)
                    if not isinstance(data, dict):  # from_dict would raise AttributeError on a list, string or null
                        raise ValueError("the JWKS is not a JSON object")
                    self._keys = self._jwt.PyJWKSet.from_dict(data)
                    self._fetched_at = now
                except (OSError, ValueError, self._jwt.PyJWTError) as exc:
                    # The keys fetched before keep verifying: an outage of the JWKS must not log everyone out.
                    logger.warning("JWKS %s could not be refreshed (%s); keeping the keys fetched before",
                                   self.settings.jwks_url, type(exc).__name__)
                key = self._find(kid)
            return key

    def _find(self, kid: str | None) -> Any:
        if self._keys is None:
            return None
        keys = [k for k in self._keys.keys if kid is None or k.key_id == kid]
        return keys[0].key if len(keys) == 1 or (keys and kid is not None) else None


def _fetch_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - the manifest's own JWKS URL
        return json.loads(response.read(1024 * 1024))


class Verifier:
    """Every configured way to present a token: a static token first, then a JWT."""

    def __init__(self, settings: AuthSettings, resource: str) -> None:
        self.settings = settings
        self.resource = resource
        self._ways: list[Any] = []
        if settings.tokens:
            self._ways.append(StaticTokens(settings.tokens))
        if settings.jwt is not None:
            self._ways.append(JwtTokens(settings.jwt, resource))

    async def verify_token(self, token: str) -> AccessToken | None:
        for way in self._ways:
            found = await way.verify_token(token)
            if found is not None:
                return found
        return None


def verifier_for(settings: AuthSettings, resource: str) -> Verifier:
    return Verifier(settings, resource)


def metadata_url(resource: str) -> str:
    """Where RFC 9728 puts the metadata of `resource`: /.well-known/oauth-protected-resource + the resource's path."""
    return str(_metadata_address(resource))


def _metadata_address(resource: str) -> AnyHttpUrl:
    from mcp.server.auth.routes import build_resource_metadata_url
    from pydantic import AnyHttpUrl

    return build_resource_metadata_url(AnyHttpUrl(resource))


def metadata_routes(settings: AuthSettings, resource: str) -> list[Route]:
    """The protected-resource metadata document (RFC 9728), at its path-suffixed and at its root location."""
    document: dict[str, Any] = {"resource": resource, "bearer_methods_supported": ["header"],
                                "resource_name": "aggregator"}
    if settings.jwt is not None:
        document["authorization_servers"] = [settings.jwt.issuer]
    if settings.required_scopes:
        document["scopes_supported"] = list(settings.required_scopes)

    async def metadata(request: Request) -> JSONResponse:
        return JSONResponse(document, headers={"Cache-Control": "public, max-age=3600"})

    path = "/" + metadata_url(resource).split("/", 3)[3]
    paths = dict.fromkeys([path, "/.well-known/oauth-protected-resource"])
    return [Route(p, metadata, methods=["GET"]) for p in paths]


def protect(app: ASGIApp, verifier: Verifier, path: str = "/mcp", prefixes: tuple[str, ...] = ()) -> ASGIApp:
    """`app` with a bearer token required on `path` and every path under `prefixes` (401 with
    `resource_metadata`, or 403 for missing scopes)."""
    guarded = AuthenticationMiddleware(
        RequireAuthMiddleware(AuthContextMiddleware(app), list(verifier.settings.required_scopes),
                              _metadata_address(verifier.resource)),
        backend=BearerAuthBackend(verifier))

    async def gate(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (scope["path"].rstrip("/") == path or scope["path"].startswith(prefixes)):
            await guarded(scope, receive, send)
        else:
            await app(scope, receive, send)

    return gate


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
