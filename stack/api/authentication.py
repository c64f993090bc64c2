"""`Authorization: Bearer <token>` authentication for the API."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from stack.services import api_token_authenticate


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
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="switchyard"'
