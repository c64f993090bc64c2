"""`Authorization: Bearer <token>` authentication for the API.

A token, its user and its principal come from registry.auth.access's per-process cache, the
one the /v1 gateway uses, valid only while the authorisation version has not moved: a revoked
token or a deactivated user is refused on the next request, and while nothing changed a request
reads no key, user or role row. What the token may reach is that principal (roles, the key's
team, the workflows a token is limited to).
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from registry.auth.access import token_allows_workflow, token_for_raw_token, token_workflow_scope
from registry.auth.principal import principal_keep

__all__ = ["BearerTokenAuthentication", "token_allows_workflow", "token_workflow_scope"]


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[User, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer":
            return None
        raw = raw.strip()
        if not raw:
            raise exceptions.AuthenticationFailed("empty bearer token")
        found = token_for_raw_token(raw)
        if found is None:  # no token, revoked, or its user deactivated
            raise exceptions.AuthenticationFailed("invalid or revoked token")
        token, grant = found
        if grant.expires_at is not None and grant.expired(timezone.now()):
            raise exceptions.AuthenticationFailed(
                f"this API key expired at {grant.expires_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
            )
        principal_keep(request, grant.principal)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="switchyard"'
