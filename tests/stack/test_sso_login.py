"""Single sign-on end to end against a real OpenID Connect provider.

The provider is panva's oidc-provider (npm; tests/oidc_provider/server.mjs) run by node on
loopback, with this server registered as a confidential client and an account whose groups
claim names a team role. Switchyard runs as gunicorn with the production web configuration,
configured from the provider's discovery document through the environment, as a deployment
would be. A requests session plays the browser: the login page's "Sign in with SSO" link, the
provider's login and consent forms, the redirect back with the code; the server exchanges the
code, checks the RS256 ID token against the provider's JWKS and reads userinfo itself.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest
import requests
from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session

from registry.audit.models import AuditEntry
from registry.auth.roles import Role
from registry.models import SsoIdentity, TeamMembership
from tests.factories import make_member, make_team
from tests.integration.processes import session_database_url, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(settings.BASE_DIR)
PROVIDER_DIR = ROOT / "tests" / "oidc_provider"
GUNICORN_CONF = ROOT / "stack" / "gunicorn_conf.py"
CLIENT_ID = "switchyard-test"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


class Provider:
    """oidc-provider on loopback; `accounts` is rewritten to change what the next login says."""

    def __init__(self, tmp_path: Path, *, redirect_uri: str, client_secret: str) -> None:
        self.port = _free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.accounts_file = tmp_path / "accounts.json"
        self.log = tmp_path / "oidc-provider.log"
        self.set_accounts({})
        env = {
            **os.environ,
            "OP_PORT": str(self.port),
            "OP_CLIENT_ID": CLIENT_ID,
            "OP_CLIENT_SECRET": client_secret,
            "OP_REDIRECT_URI": redirect_uri,
            "OP_ACCOUNTS_FILE": str(self.accounts_file),
        }
        self.process = subprocess.Popen(  # noqa: S603 (node and our own script)
            [_node(), str(PROVIDER_DIR / "server.mjs")],
            cwd=PROVIDER_DIR,
            env=env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        discovery = f"{self.issuer}/.well-known/openid-configuration"
        wait_until(lambda: self._up() and _answers(discovery), timeout=60, what="the OIDC provider")
        self.discovery: dict[str, Any] = requests.get(discovery, timeout=5).json()

    def _up(self) -> bool:
        assert self.process.poll() is None, f"oidc-provider exited:\n{self.log.read_text()}"
        return True

    def set_accounts(self, accounts: dict[str, dict[str, Any]]) -> None:
        self.accounts_file.write_text(json.dumps(accounts))


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail("the SSO test runs its OIDC provider with node (Debian: apt-get install nodejs npm)")
    if not (PROVIDER_DIR / "node_modules" / "oidc-provider").is_dir():
        # `make test` installs it; a bare pytest run installs the same locked versions here.
        subprocess.run(  # noqa: S603
            [shutil.which("npm") or "npm", "ci", "--no-audit", "--no-fund"],
            cwd=PROVIDER_DIR,
            check=True,
            timeout=300,
        )
    return node


class Switchyard:
    """gunicorn serving stack.wsgi on the test database, with SSO configured from `provider`."""

    def __init__(
        self, tmp_path: Path, *, port: int, provider: Provider, client_secret: str, issuer: str | None = None
    ) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = tmp_path / "gunicorn.log"
        found = provider.discovery
        env = {
            **os.environ,
            "DATABASE_URL": session_database_url(),  # committed rows: transactional tests only
            "DEBUG": "0",
            "PYTHONUNBUFFERED": "1",
            "SWITCHYARD_WEB_BIND": f"127.0.0.1:{port}",
            "SWITCHYARD_WEB_WORKERS": "1",
            "OIDC_RP_CLIENT_ID": CLIENT_ID,
            "OIDC_RP_CLIENT_SECRET": client_secret,
            "OIDC_OP_ISSUER": issuer or found["issuer"],
            "OIDC_OP_AUTHORIZATION_ENDPOINT": found["authorization_endpoint"],
            "OIDC_OP_TOKEN_ENDPOINT": found["token_endpoint"],
            "OIDC_OP_USER_ENDPOINT": found["userinfo_endpoint"],
            "OIDC_OP_JWKS_ENDPOINT": found["jwks_uri"],
            "OIDC_RP_SCOPES": "openid email profile groups",
        }
        self.process = subprocess.Popen(  # noqa: S603 (our interpreter, fixed arguments)
            [sys.executable, "-m", "gunicorn", "-c", str(GUNICORN_CONF), "stack.wsgi:application"],
            cwd=ROOT,
            env=env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(self._healthy, timeout=60, what="gunicorn to answer /healthz")

    def _healthy(self) -> bool:
        assert self.process.poll() is None, f"gunicorn exited:\n{self.log.read_text()}"
        return _answers(f"{self.url}/healthz")


@pytest.fixture
def sso(
    transactional_db: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Provider, Switchyard]]:
    """The provider and Switchyard; `@pytest.mark.parametrize("sso", [ISSUER], indirect=True)`
    configures Switchyard with another issuer than the provider's."""
    web_port = _free_port()
    secret = secrets.token_urlsafe(24)
    provider = Provider(
        tmp_path, redirect_uri=f"http://127.0.0.1:{web_port}/oidc/callback/", client_secret=secret
    )
    try:
        issuer = getattr(request, "param", None)
        web = Switchyard(tmp_path, port=web_port, provider=provider, client_secret=secret, issuer=issuer)
        try:
            yield provider, web
        finally:
            _stop(web.process)
    finally:
        _stop(provider.process)


class _FirstForm(HTMLParser):
    """The first form of a page: its action and the values of its named inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.action: str | None = None
        self.fields: dict[str, str] = {}
        self._inside = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "form" and self.action is None:
            self.action, self._inside = named.get("action") or "", True
        elif tag == "input" and self._inside and named.get("name"):
            self.fields[named["name"] or ""] = named.get("value") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._inside = False


def sso_login(
    session: requests.Session, *, web: Switchyard, provider: Provider, login: str
) -> requests.Response:
    """Click "Sign in with SSO" and answer the provider's forms (login, consent) until it sends
    the browser back to Switchyard."""
    page = session.get(f"{web.url}/login/", timeout=10)
    link = re.search(r'id="sso-login" href="([^"]+)"', page.text)
    assert link, "the login page has no SSO link"
    answer = session.get(urljoin(page.url, link.group(1).replace("&amp;", "&")), timeout=30)
    for _ in range(5):
        if not answer.url.startswith(provider.issuer):
            return answer
        assert answer.status_code == 200, answer.text
        form = _FirstForm()
        form.feed(answer.text)
        assert form.action, f"no form on the provider's page {answer.url}: {answer.text[:500]}"
        if "login" in form.fields:
            form.fields.update(login=login, password="any password: development interactions")  # noqa: S105
        answer = session.post(urljoin(answer.url, form.action), data=form.fields, timeout=30)
    raise AssertionError(f"still at the provider after five forms: {answer.url}")


def logged_in_user_ids() -> set[int]:
    return {
        int(s.get_decoded()["_auth_user_id"])
        for s in Session.objects.all()
        if "_auth_user_id" in s.get_decoded()
    }


def test_an_oidc_login_lands_in_the_team_of_its_group_claim_and_a_later_login_drops_it(
    sso: tuple[Provider, Switchyard],
) -> None:
    provider, web = sso
    red, blue = make_team("red"), make_team("blue")
    provider.set_accounts(
        {
            "alice": {
                "preferred_username": "alice",
                "email": "alice@example.com",
                "groups": ["staff", "switchyard:red:operator"],
            }
        }
    )
    browser = requests.Session()

    landed = sso_login(browser, web=web, provider=provider, login="alice")

    assert landed.status_code == 200, web.log.read_text()[-3000:]
    assert landed.url == f"{web.url}/", landed.url
    alice = User.objects.get(username="alice")
    assert (alice.email, alice.has_usable_password()) == ("alice@example.com", False)
    assert SsoIdentity.objects.get(user=alice).issuer == provider.issuer
    assert alice.pk in logged_in_user_ids()
    membership = TeamMembership.objects.get(user=alice)
    assert (membership.team, membership.role, membership.source) == (red, Role.OPERATOR, "sso")
    created = AuditEntry.objects.get(
        content_type__model="teammembership", object_pk=str(membership.pk), action=AuditEntry.Action.CREATE
    )
    assert (created.actor_label, created.surface) == ("sso:alice", "web")

    # Logging out ends the Switchyard session (the provider's own session is the provider's).
    csrf = (
        browser.get(f"{web.url}/login/", timeout=10).cookies.get("csrftoken") or browser.cookies["csrftoken"]
    )
    out = browser.post(f"{web.url}/logout/", headers={"X-CSRFToken": csrf}, timeout=10)
    assert out.url.startswith(f"{web.url}/login/")
    assert alice.pk not in logged_in_user_ids()

    # An admin adds alice to blue by hand; the provider drops her red group.
    make_member(blue, Role.VIEWER, user=alice)
    provider.set_accounts(
        {"alice": {"preferred_username": "alice", "email": "alice@example.com", "groups": ["staff"]}}
    )

    again = sso_login(browser, web=web, provider=provider, login="alice")

    assert again.url == f"{web.url}/", again.url
    assert alice.pk in logged_in_user_ids()
    assert User.objects.filter(username="alice").count() == 1
    assert {(m.team.slug, m.role, m.source) for m in TeamMembership.objects.filter(user=alice)} == {
        ("blue", "viewer", "manual")
    }
    assert AuditEntry.objects.filter(
        content_type__model="teammembership", object_pk=str(membership.pk), action=AuditEntry.Action.DELETE
    ).exists()


def test_an_oidc_login_whose_name_belongs_to_a_local_account_is_refused_and_its_password_still_works(
    sso: tuple[Provider, Switchyard],
) -> None:
    provider, web = sso
    local = User.objects.create_user(username="root", password="a-local-password-1")
    provider.set_accounts({"intruder": {"preferred_username": "root", "groups": ["switchyard:red:admin"]}})

    landed = sso_login(requests.Session(), web=web, provider=provider, login="intruder")

    assert landed.url.startswith(f"{web.url}/login/?sso=failed"), landed.url
    assert 'id="sso-failed"' in landed.text
    assert local.pk not in logged_in_user_ids()
    assert not SsoIdentity.objects.exists()

    # The password form beside the SSO link still logs the local account in.
    browser = requests.Session()
    browser.get(f"{web.url}/login/", timeout=10)
    form = {
        "username": "root",
        "password": "a-local-password-1",
        "csrfmiddlewaretoken": browser.cookies["csrftoken"],
    }
    landed = browser.post(f"{web.url}/login/", data=form, timeout=10)
    assert landed.url == f"{web.url}/", landed.url
    assert local.pk in logged_in_user_ids()


@pytest.mark.parametrize("sso", ["http://127.0.0.1:9/another-issuer"], indirect=True)
def test_an_id_token_from_another_issuer_than_the_configured_one_is_refused(
    sso: tuple[Provider, Switchyard],
) -> None:
    provider, web = sso
    provider.set_accounts({"alice": {"preferred_username": "alice", "groups": ["switchyard:red:operator"]}})

    landed = sso_login(requests.Session(), web=web, provider=provider, login="alice")

    assert landed.url.startswith(f"{web.url}/login/?sso=failed"), landed.url
    assert not User.objects.filter(username="alice").exists()
    assert "issued by another provider" in web.log.read_text()
