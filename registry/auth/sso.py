"""Single sign-on through OpenID Connect: mozilla-django-oidc's backend, told how Switchyard
finds and keeps its users (docs/registry-and-teams.md, "SSO").

The library runs the authorisation-code flow (state, nonce, PKCE), fetches the token, checks
the ID token's signature against the provider's JWKS and reads the userinfo endpoint. This
backend adds what the library leaves to its users: the ID token's issuer and audience are
checked (with `exp`, `iat` and `sub` required, and `azp` for a token with several audiences),
every refused token is a failed login rather than an error page, the user is found by
(issuer, subject) rather than by email, and the groups claim is turned into team memberships
(registry.services.sso_user_login). SwitchyardOIDCCallbackView logs out a session whose
silent re-authentication (SessionRefresh, every SWITCHYARD_SSO_SESSION_SECONDS) we refuse.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import jwt
import requests
from django.conf import settings
from django.contrib import auth
from django.contrib.auth.models import User
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView

from registry.audit.origin import Surface, audit_origin
from registry.services import RegistryError, sso_user_login

logger = logging.getLogger(__name__)

# Clock skew allowed between the provider and us when checking exp, iat and nbf.
ID_TOKEN_LEEWAY_SECONDS = 60


class SwitchyardOIDCBackend(OIDCAuthenticationBackend):  # type: ignore[misc]
    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> User | None:
        # A refused token or an unreachable provider is a failed login (the callback sends the
        # browser back to the login page with a message), not an error page.
        try:
            user: User | None = super().authenticate(request, **kwargs)
        # KeyError: the library indexes the token's header ("kid") and the JWKS unchecked.
        except (SuspiciousOperation, jwt.PyJWTError, KeyError) as error:
            logger.warning("SSO: login refused: %s", error)
            return None
        except requests.RequestException as error:
            logger.warning("SSO: the identity provider did not answer as expected: %s", error)
            return None
        return user

    def _verify_jws(self, payload: str, key: Any) -> dict[str, Any]:
        # The library decodes with the audience unchecked and `exp` optional; pyjwt checks all
        # of OIDC Core 3.1.3.7 that it can here, and every way a token fails is a refusal
        # (expired, not yet valid, wrong issuer or audience, bad signature, malformed).
        algorithm = jwt.get_unverified_header(payload).get("alg")
        if algorithm != self.OIDC_RP_SIGN_ALGO:
            raise SuspiciousOperation(
                f"the ID token is signed with {algorithm!r}, not {self.OIDC_RP_SIGN_ALGO}"
            )
        try:
            claims: dict[str, Any] = jwt.decode(
                payload,
                key,
                algorithms=[self.OIDC_RP_SIGN_ALGO],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=settings.OIDC_OP_ISSUER,
                leeway=ID_TOKEN_LEEWAY_SECONDS,
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.InvalidIssuerError:
            raise SuspiciousOperation("the ID token was issued by another provider") from None
        except jwt.InvalidAudienceError:
            raise SuspiciousOperation("the ID token was issued to another client") from None
        except jwt.PyJWTError as error:
            raise SuspiciousOperation(f"the ID token is not valid: {error}") from None
        return claims

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        payload: dict[str, Any] = super().verify_token(token, **kwargs)
        # Issuer and audience are checked again here: OIDC_RP_IDP_SIGN_KEY or
        # OIDC_ALLOW_UNSECURED_JWT would route around _verify_jws.
        if payload.get("iss") != settings.OIDC_OP_ISSUER:
            raise SuspiciousOperation("the ID token was issued by another provider")
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if self.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation("the ID token was issued to another client")
        # A token for several audiences names the party it was issued to (OIDC Core 3.1.3.7,
        # items 4 and 5): it must be us, or another audience could replay it here.
        authorised_party = payload.get("azp")
        if (
            len(audiences) > 1 or authorised_party is not None
        ) and authorised_party != self.OIDC_RP_CLIENT_ID:
            raise SuspiciousOperation("the ID token was issued to another party (azp)")
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


class SwitchyardOIDCCallbackView(OIDCAuthenticationCallbackView):  # type: ignore[misc]
    """The callback, whose failure also ends the session it ran in: a silent re-authentication
    (mozilla_django_oidc SessionRefresh) refused by us (the user's claims no longer sign in)
    must log the user out, as the library already does when the provider refuses."""

    def login_failure(self) -> HttpResponse:
        if self.request.user.is_authenticated:
            auth.logout(self.request)
        response: HttpResponse = super().login_failure()
        return response
