"""`Authorization: Bearer <token>` authentication for the API.

Every request reads the token and its user from the database, so a revoked token or a
deactivated user is refused on the next request; what the token may reach is
registry.auth.access's answer (roles, and the workflows a token is limited to).
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from registry.auth.access import token_allows_workflow, token_workflow_scope
from registry.services import api_token_authenticate

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
        token = api_token_authenticate(raw=raw)
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("invalid or revoked token")
        if token.expires_at is not None and token.expired(timezone.now()):
            raise exceptions.AuthenticationFailed(
                f"this API key expired at {token.expires_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
            )
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="switchyard"'
