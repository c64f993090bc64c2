"""Single sign-on's edges without a provider: crafted ID tokens through the real callback view.

Every way an ID token can be wrong is a failed login (a redirect to the login page saying so),
never a 500; `exp` is required and a token for several audiences must name us as `azp`; failed
callbacks do not lock an address out for every SSO user behind it; an SSO session
re-authenticates at the provider after SWITCHYARD_SSO_SESSION_SECONDS, and an SSO user's API
keys stop working SWITCHYARD_SSO_KEY_SECONDS after the user's last login (SECURITY.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from unittest import mock

import jwt
import pytest
import time_machine
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from registry.auth.sso import SwitchyardOIDCBackend
from registry.models import SsoIdentity, Team, TeamMembership
from registry.services import api_token_create
from tests.factories import make_member, make_team

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.stack.sso_urls")]

ISSUER = "https://idp.example.com"
CLIENT_ID = "switchyard"
FAILED = "/login/?sso=failed"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)

SSO_SETTINGS = {
    "OIDC_RP_CLIENT_ID": CLIENT_ID,
    "OIDC_RP_CLIENT_SECRET": "a-client-secret",
    "OIDC_OP_ISSUER": ISSUER,
    "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{ISSUER}/auth",
    "OIDC_OP_TOKEN_ENDPOINT": f"{ISSUER}/token",
    "OIDC_OP_USER_ENDPOINT": f"{ISSUER}/me",
    "OIDC_OP_JWKS_ENDPOINT": f"{ISSUER}/jwks",
    "OIDC_RP_SIGN_ALGO": "RS256",
    "OIDC_USE_PKCE": True,
    "LOGIN_REDIRECT_URL": "/",
    "LOGIN_REDIRECT_URL_FAILURE": FAILED,
    "AUTHENTICATION_BACKENDS": [
        "axes.backends.AxesStandaloneBackend",
        "django.contrib.auth.backends.ModelBackend",
        "registry.auth.sso.SwitchyardOIDCBackend",
    ],
}


def claims(subject: str = "alice-sub", **changes: Any) -> dict[str, Any]:
    now = int(time.time())
    values: dict[str, Any] = {
        "iss": ISSUER,
        "aud": CLIENT_ID,
        "sub": subject,
        "iat": now,
        "exp": now + 300,
        "nonce": "the-nonce",
    }
    values.update(changes)
    return {name: value for name, value in values.items() if value is not None}


def id_token(values: dict[str, Any], *, key: rsa.RSAPrivateKey = KEY, alg: str = "RS256") -> str:
    return jwt.encode(values, key, algorithm=alg, headers={"kid": "k1"})


@pytest.fixture(autouse=True)
def provider() -> Iterator[dict[str, Any]]:
    """The provider's answers: the next token response, and userinfo that echoes its subject."""
    make_team("red")
    answers: dict[str, Any] = {"id_token": id_token(claims())}

    def userinfo(self: SwitchyardOIDCBackend, access_token: str, token: str, payload: dict[str, Any]) -> dict:
        sub = payload["sub"]
        return {"sub": sub, "preferred_username": sub, "groups": ["switchyard:red:operator"]}

    with (
        override_settings(**SSO_SETTINGS),
        mock.patch.object(
            SwitchyardOIDCBackend,
            "get_token",
            lambda self, payload: {"id_token": answers["id_token"], "access_token": "at"},
        ),
        mock.patch.object(
            SwitchyardOIDCBackend, "retrieve_matching_jwk", lambda self, token: KEY.public_key()
        ),
        mock.patch.object(SwitchyardOIDCBackend, "get_userinfo", userinfo),
    ):
        yield answers


def callback(client: Client, *, address: str = "203.0.113.7") -> Any:
    session = client.session
    session["oidc_states"] = {"the-state": {"nonce": "the-nonce", "code_verifier": "v" * 43}}
    session.save()
    return client.get("/oidc/callback/", {"code": "c", "state": "the-state"}, REMOTE_ADDR=address)


def test_a_valid_token_signs_in_and_syncs_memberships(provider: dict[str, Any]) -> None:
    response = callback(Client())
    assert response.status_code == 302 and response["Location"] == "/"
    user = User.objects.get(username="alice-sub")
    assert TeamMembership.objects.get(user=user).role == "operator"


@pytest.mark.parametrize(
    ("token_claims", "key"),
    [
        pytest.param(claims(exp=int(time.time()) - 3600), KEY, id="expired"),
        pytest.param(claims(exp=None), KEY, id="no-exp"),
        pytest.param(claims(iat=None), KEY, id="no-iat"),
        pytest.param(claims(iat=int(time.time()) + 3600), KEY, id="issued-in-the-future"),
        pytest.param(claims(nbf=int(time.time()) + 3600), KEY, id="not-yet-valid"),
        pytest.param(claims(aud="another-client"), KEY, id="other-audience"),
        pytest.param(claims(aud=[CLIENT_ID, "another-client"]), KEY, id="multi-audience-without-azp"),
        pytest.param(claims(aud=[CLIENT_ID, "another-client"], azp="another-client"), KEY, id="azp-not-us"),
        pytest.param(claims(azp="another-client"), KEY, id="single-audience-azp-not-us"),
        pytest.param(claims(iss="https://evil.example.com"), KEY, id="wrong-issuer"),
        pytest.param(claims(nonce="another-nonce"), KEY, id="nonce-mismatch"),
        pytest.param(claims(), OTHER_KEY, id="bad-signature"),
    ],
)
def test_every_invalid_id_token_is_a_failed_login_not_an_error(
    provider: dict[str, Any], token_claims: dict[str, Any], key: rsa.RSAPrivateKey
) -> None:
    provider["id_token"] = id_token(token_claims, key=key)
    response = callback(Client())
    assert response.status_code == 302
    assert response["Location"] == FAILED
    assert not User.objects.filter(username="alice-sub").exists()


@pytest.mark.parametrize(
    "token", ["not-a-jwt", "a.b.c", jwt.encode({"sub": "x"}, "k" * 32, algorithm="HS256")]
)
def test_a_malformed_or_wrongly_signed_token_is_a_failed_login(provider: dict[str, Any], token: str) -> None:
    provider["id_token"] = token
    response = callback(Client())
    assert (response.status_code, response["Location"]) == (302, FAILED)


def test_a_multi_audience_token_naming_us_as_azp_signs_in(provider: dict[str, Any]) -> None:
    provider["id_token"] = id_token(claims(aud=[CLIENT_ID, "another-client"], azp=CLIENT_ID))
    assert callback(Client())["Location"] == "/"
    assert User.objects.filter(username="alice-sub").exists()


def test_failed_callbacks_from_an_address_do_not_lock_out_another_sso_user_there(
    provider: dict[str, Any],
) -> None:
    provider["id_token"] = id_token(claims(exp=int(time.time()) - 3600))
    for _ in range(8):
        assert callback(Client())["Location"] == FAILED
    provider["id_token"] = id_token(claims("bob-sub"))
    response = callback(Client())
    assert (response.status_code, response["Location"]) == (302, "/")
    assert User.objects.filter(username="bob-sub").exists()


def test_an_sso_session_re_authenticates_at_the_provider_after_the_session_bound(
    provider: dict[str, Any], settings: Any
) -> None:
    settings.MIDDLEWARE = [
        *settings.MIDDLEWARE[
            : settings.MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1
        ],
        "mozilla_django_oidc.middleware.SessionRefresh",
        *settings.MIDDLEWARE[
            settings.MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1 :
        ],
    ]
    settings.OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = 3600
    client = Client()
    assert callback(client)["Location"] == "/"
    assert client.get("/api/teams/").status_code == 200
    with time_machine.travel(timezone.now() + timedelta(seconds=3601), tick=False):
        response = client.get("/api/teams/")
    assert response.status_code == 302
    assert response["Location"].startswith(f"{ISSUER}/auth?")
    assert "prompt=none" in response["Location"]


def test_a_refused_silent_re_authentication_logs_the_user_out(provider: dict[str, Any]) -> None:
    client = Client()
    assert callback(client)["Location"] == "/"
    assert client.get("/api/teams/").status_code == 200
    provider["id_token"] = id_token(claims(exp=int(time.time()) - 3600))
    assert callback(client)["Location"] == FAILED
    assert client.get("/api/teams/").status_code in {401, 403}


def test_the_provider_refusing_a_silent_re_authentication_logs_the_user_out(provider: dict[str, Any]) -> None:
    client = Client()
    assert callback(client)["Location"] == "/"
    response = client.get("/oidc/callback/", {"error": "login_required", "state": "x"})
    assert response.status_code == 302
    assert client.get("/api/teams/").status_code in {401, 403}


def test_an_sso_users_keys_stop_working_after_the_key_bound_without_a_login(
    provider: dict[str, Any], settings: Any
) -> None:
    settings.SWITCHYARD_SSO_KEY_SECONDS = 7 * 24 * 3600
    assert callback(Client())["Location"] == "/"
    user = User.objects.get(username="alice-sub")
    _, raw = api_token_create(user=user, name="k", team=Team.objects.get(slug="red"))
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    later = timezone.now() + timedelta(days=6)
    with time_machine.travel(later, tick=False):
        assert api.get("/api/teams/").status_code == 200
        provider["id_token"] = id_token(claims())
        assert callback(Client())["Location"] == "/"  # a login (or silent renewal) resyncs
    assert SsoIdentity.objects.get(user=user).synced_at == later
    with time_machine.travel(later + timedelta(days=6), tick=False):
        assert api.get("/api/teams/").status_code == 200
    with time_machine.travel(later + timedelta(days=7, seconds=1), tick=False):
        assert api.get("/api/teams/").status_code == 401


def test_keys_of_users_without_sso_are_not_bound_by_the_sso_rule() -> None:
    user = make_member("red", "viewer")
    _, raw = api_token_create(user=user, name="k", team=Team.objects.get(slug="red"))
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    with time_machine.travel(timezone.now() + timedelta(days=365), tick=False):
        assert api.get("/api/teams/").status_code == 200
