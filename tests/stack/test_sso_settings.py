"""Single sign-on's settings: off unless a client id is given; the provider's URLs are a trust
boundary, so a bad one (plain http to another machine, credentials or a fragment in it, http
at all in production) stops the process at start, naming the variable."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from stack.env import env_identity_provider_url

ROOT = Path(__file__).resolve().parents[2]
_KEEP = {"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV", "PYTHONPATH"}

IDP = "http://127.0.0.1:9"
GOOD = {
    "OIDC_RP_CLIENT_ID": "switchyard",
    "OIDC_RP_CLIENT_SECRET": "a-client-secret",
    "OIDC_OP_ISSUER": IDP,
    "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{IDP}/auth",
    "OIDC_OP_TOKEN_ENDPOINT": f"{IDP}/token",
    "OIDC_OP_USER_ENDPOINT": f"{IDP}/me",
    "OIDC_OP_JWKS_ENDPOINT": f"{IDP}/jwks",
}


@pytest.mark.parametrize(
    "url",
    [
        "https://idp.example.com/oauth2/token",
        "https://idp.example.com:8443/realms/x/protocol/openid-connect/certs?v=1",
        "http://127.0.0.1:5556/token",
        "http://localhost:5556/token",
        "http://[::1]:5556/token",
    ],
)
def test_https_and_loopback_http_are_accepted_outside_production(url: str) -> None:
    assert (
        env_identity_provider_url(
            "OIDC_OP_TOKEN_ENDPOINT", allow_loopback_http=True, environ={"OIDC_OP_TOKEN_ENDPOINT": url}
        )
        == url
    )


@pytest.mark.parametrize(
    "url",
    [
        "http://idp.example.com/token",
        "http://10.0.0.5/token",
        "http://127.0.0.1.example.com/token",
        "https://user:pass@idp.example.com/token",
        "https://idp.example.com/token#frag",
        "https:///token",
        "ftp://idp.example.com/token",
        "javascript:alert(1)",
        "https://idp.example.com/to ken",
        "https://idp.example.com:port/token",
        "",
    ],
)
def test_other_urls_are_refused_naming_the_variable(url: str) -> None:
    with pytest.raises(ImproperlyConfigured, match="OIDC_OP_TOKEN_ENDPOINT"):
        env_identity_provider_url(
            "OIDC_OP_TOKEN_ENDPOINT", allow_loopback_http=True, environ={"OIDC_OP_TOKEN_ENDPOINT": url}
        )


def test_production_refuses_plain_http_even_to_loopback() -> None:
    with pytest.raises(ImproperlyConfigured, match="https://"):
        env_identity_provider_url(
            "OIDC_OP_ISSUER", allow_loopback_http=False, environ={"OIDC_OP_ISSUER": "http://127.0.0.1:5556"}
        )


def test_a_missing_url_is_refused() -> None:
    with pytest.raises(ImproperlyConfigured, match="OIDC_OP_JWKS_ENDPOINT must be set"):
        env_identity_provider_url("OIDC_OP_JWKS_ENDPOINT", allow_loopback_http=True, environ={})


def _check(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    child_env = {k: v for k, v in os.environ.items() if k in _KEEP}
    child_env.update(env, SWITCHYARD_VAR_DIR=str(tmp_path / "var"))
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_a_complete_configuration_starts(tmp_path: Path) -> None:
    result = _check(tmp_path, GOOD | {"SWITCHYARD_ENV": "test"})
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"OIDC_OP_TOKEN_ENDPOINT": "http://idp.example.com/token"},
            "OIDC_OP_TOKEN_ENDPOINT must start with https://",
        ),
        ({"OIDC_OP_JWKS_ENDPOINT": None}, "OIDC_OP_JWKS_ENDPOINT must be set"),
        ({"OIDC_RP_CLIENT_SECRET": ""}, "OIDC_RP_CLIENT_SECRET must be set"),
        ({"OIDC_RP_SIGN_ALGO": "HS256"}, "OIDC_RP_SIGN_ALGO must be"),
        ({"OIDC_RP_SCOPES": "email profile"}, "OIDC_RP_SCOPES must include openid"),
    ],
)
def test_a_bad_configuration_stops_the_process_naming_the_variable(
    tmp_path: Path, change: dict[str, str | None], message: str
) -> None:
    env = {**GOOD, "SWITCHYARD_ENV": "test"}
    for name, value in change.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    result = _check(tmp_path, env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr, result.stderr[-2000:]


def test_production_stops_on_a_loopback_http_provider(tmp_path: Path) -> None:
    env = GOOD | {
        "SWITCHYARD_ENV": "production",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "switchyard.example.com",
    }
    result = _check(tmp_path, env)
    assert result.returncode != 0
    assert "ImproperlyConfigured: OIDC_OP_ISSUER must start with https://" in result.stderr, result.stderr[
        -2000:
    ]


@pytest.mark.django_db
def test_without_sso_configured_the_login_page_offers_the_password_form_only() -> None:
    page = Client().get("/login/")
    assert page.status_code == 200
    assert 'id="sso-login"' not in page.content.decode()
    assert 'name="password"' in page.content.decode()
