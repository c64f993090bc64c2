"""Single sign-on settings (OpenID Connect through mozilla-django-oidc; docs/registry-and-teams.md
"SSO"). Off unless OIDC_RP_CLIENT_ID is set; then every other value must be set and valid, or the
process stops at start. The provider's URLs are a trust boundary (env_identity_provider_url):
https, or http to a loopback host outside production."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

from stack.env import env_float, env_identity_provider_url, env_int, env_str

SIGNING_ALGORITHMS = {"RS256", "RS384", "RS512", "ES256", "ES384", "ES512"}


def sso_lifetimes() -> tuple[int, int]:
    """How long an SSO login holds before the session re-authenticates silently at the provider
    (which resyncs memberships and ends the session of a user the provider dropped), and how long
    an SSO user's API keys keep working after that user's last login (a key cannot ask the
    provider; a user who stops signing in loses the keys' access after this bound)."""
    return (
        env_int("SWITCHYARD_SSO_SESSION_SECONDS", 3600, minimum=60),
        env_int("SWITCHYARD_SSO_KEY_SECONDS", 7 * 24 * 3600, minimum=60),
    )


def oidc_groups_claim() -> str:
    """The claim listing the user's groups; "switchyard:<team-slug>:<role>" entries become team
    memberships (registry.services.team_memberships_sync_from_claims)."""
    claim = env_str("SWITCHYARD_OIDC_GROUPS_CLAIM", "groups").strip()
    if not claim:
        raise ImproperlyConfigured("SWITCHYARD_OIDC_GROUPS_CLAIM must name a claim")
    return claim


def oidc_settings(
    *, production: bool, session_seconds: int, backends: list[str], middleware: list[str]
) -> dict[str, Any]:
    """The OIDC_* settings when SSO is on; adds the SSO backend and the session-refresh
    middleware to the lists given."""

    def idp_url(name: str) -> str:
        return env_identity_provider_url(name, allow_loopback_http=not production)

    secret = env_str("OIDC_RP_CLIENT_SECRET")
    if not secret.strip():
        raise ImproperlyConfigured("OIDC_RP_CLIENT_SECRET must be set when OIDC_RP_CLIENT_ID is")
    # Asymmetric signatures only: HS256 would make the client secret the token-signing key.
    algorithm = env_str("OIDC_RP_SIGN_ALGO", "RS256")
    if algorithm not in SIGNING_ALGORITHMS:
        raise ImproperlyConfigured(
            f"OIDC_RP_SIGN_ALGO must be RS256/384/512 or ES256/384/512; got {algorithm!r}"
        )
    # Add "groups" where the provider releases the group claim under that scope.
    scopes = env_str("OIDC_RP_SCOPES", "openid email profile")
    if "openid" not in scopes.split():
        raise ImproperlyConfigured(f"OIDC_RP_SCOPES must include openid; got {scopes!r}")
    backends.append("registry.auth.sso.SwitchyardOIDCBackend")
    middleware.insert(
        middleware.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
        "mozilla_django_oidc.middleware.SessionRefresh",
    )
    return {
        "OIDC_RP_CLIENT_ID": env_str("OIDC_RP_CLIENT_ID").strip(),
        "OIDC_RP_CLIENT_SECRET": secret,
        # mozilla-django-oidc does not check the ID token's issuer or audience; the backend
        # (registry.auth.sso) checks both against these.
        "OIDC_OP_ISSUER": idp_url("OIDC_OP_ISSUER").rstrip("/"),
        "OIDC_OP_AUTHORIZATION_ENDPOINT": idp_url("OIDC_OP_AUTHORIZATION_ENDPOINT"),
        "OIDC_OP_TOKEN_ENDPOINT": idp_url("OIDC_OP_TOKEN_ENDPOINT"),
        "OIDC_OP_USER_ENDPOINT": idp_url("OIDC_OP_USER_ENDPOINT"),
        "OIDC_OP_JWKS_ENDPOINT": idp_url("OIDC_OP_JWKS_ENDPOINT"),
        "OIDC_RP_SIGN_ALGO": algorithm,
        "OIDC_RP_SCOPES": scopes,
        "OIDC_USE_PKCE": True,
        "OIDC_PKCE_CODE_CHALLENGE_METHOD": "S256",
        "OIDC_TIMEOUT": env_float("OIDC_TIMEOUT_SECONDS", 10.0, minimum=0.1),
        "OIDC_CREATE_USER": True,
        # A refused login (bad claims, a username taken by a local account) lands on the login page.
        "LOGIN_REDIRECT_URL_FAILURE": "/login/?sso=failed",
        # A failed callback (a silent re-authentication included) also ends the session it ran in.
        "OIDC_CALLBACK_CLASS": "registry.auth.sso.SwitchyardOIDCCallbackView",
        # An SSO session re-authenticates at the provider (prompt=none, no user interaction) every
        # SWITCHYARD_SSO_SESSION_SECONDS; that login resyncs the groups claim into memberships, and
        # a user the provider no longer signs in is logged out (SECURITY.md "Single sign-on").
        "OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS": session_seconds,
        "OIDC_EXEMPT_URLS": ["login", "logout"],
    }
