"""Single sign-on through OpenID Connect: mozilla-django-oidc's backend, told how Switchyard
finds and keeps its users (README "SSO").

The library runs the authorisation-code flow (state, nonce, PKCE), fetches the token, checks
the ID token's signature against the provider's JWKS and reads the userinfo endpoint. This
backend adds what the library leaves to its users: the ID token's issuer and audience are
checked, the user is found by (issuer, subject) rather than by email, and the groups claim is
turned into team memberships (stack.registry.services.sso_user_login).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import requests
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from stack.registry.audit_origin import Surface, audit_origin
from stack.registry.services import RegistryError, sso_user_login

logger = logging.getLogger(__name__)


class SwitchyardOIDCBackend(OIDCAuthenticationBackend):  # type: ignore[misc]
    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> User | None:
        # A refused token or an unreachable provider is a failed login (the callback sends the
        # browser back to the login page with a message), not an error page.
        try:
            user: User | None = super().authenticate(request, **kwargs)
        except SuspiciousOperation as error:
            logger.warning("SSO: login refused: %s", error)
            return None
        except requests.RequestException as error:
            logger.warning("SSO: the identity provider did not answer as expected: %s", error)
            return None
        return user

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        payload: dict[str, Any] = super().verify_token(token, **kwargs)
        # The library checks the signature and the nonce only (pyjwt with verify_aud off).
        if payload.get("iss") != settings.OIDC_OP_ISSUER:
            raise SuspiciousOperation("the ID token was issued by another provider")
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if self.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation("the ID token was issued to another client")
        self._id_token_subject = payload.get("sub")
        return payload

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        # The userinfo answer must be about the user the ID token names (OIDC Core 5.3.2).
        subject = getattr(self, "_id_token_subject", None)
        if subject is None or claims.get("sub") != subject:
            logger.warning("SSO: userinfo subject differs from the ID token's; login refused")
            return False
        return True

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> User | None:
        claims = self.get_userinfo(access_token, id_token, payload)
        if not self.verify_claims(claims):
            raise SuspiciousOperation("Claims verification failed")
        # Groups may come in the ID token only (some providers leave them out of userinfo).
        groups_claim = settings.SWITCHYARD_OIDC_GROUPS_CLAIM
        if groups_claim not in claims and groups_claim in payload:
            claims = {**claims, groups_claim: payload[groups_claim]}
        try:
            # The memberships this login changes are recorded as the provider's doing, for
            # this user (the request has no signed-in user yet).
            label = "sso:" + re.sub(r"[^\w.@+-]", "?", str(claims.get("sub")))[:140]
            with audit_origin(surface=Surface.WEB, label=label):
                user, sync = sso_user_login(
                    issuer=settings.OIDC_OP_ISSUER, claims=claims, groups_claim=groups_claim
                )
        except RegistryError as error:
            logger.warning("SSO: login refused: %s", error)
            return None
        if sync.added or sync.changed or sync.removed:
            logger.info(
                "SSO: %s memberships added %s, changed %s, removed %s",
                user.get_username(),
                sync.added,
                sync.changed,
                sync.removed,
            )
        return user
