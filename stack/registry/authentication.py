"""`Authorization: Bearer <token>` authentication for the API."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from stack.registry.models import ApiToken, Workflow
from stack.registry.roles import ALL_ROLES, user_has_role
from stack.registry.services import api_token_authenticate


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


def token_workflow_scope(token: ApiToken) -> frozenset[int] | None:
    """The workflow ids a token may call through the inference gateway; None means every
    workflow its user may read (a token with no workflows listed is not scoped)."""
    ids = frozenset(token.workflows.values_list("id", flat=True))
    return ids or None


def token_allows_workflow(*, token: ApiToken, workflow: Workflow) -> bool:
    """May this token call `workflow`? Its user must be able to read workflows at all (any
    role), and a scoped token only the workflows it lists."""
    if not token.user.is_active or not user_has_role(token.user, ALL_ROLES):
        return False
    scope = token_workflow_scope(token)
    return scope is None or workflow.pk in scope
