"""`manage.py apitoken` and the argument checks of `manage.py worker`."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from billing.models import Budget
from registry.auth.roles import Role
from registry.models import ApiToken
from registry.services import api_token_create
from tests.factories import make_cluster, make_member, make_team

pytestmark = pytest.mark.django_db


def _run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def _every_text_value_in_the_database() -> list[str]:
    """All string column values of every table, read with raw SQL."""
    values: list[str] = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            quoted = connection.ops.quote_name(table)
            cursor.execute(f"SELECT * FROM {quoted}")  # noqa: S608 (table names come from introspection)
            values += [v for row in cursor.fetchall() for v in row if isinstance(v, str)]
    return values


def test_apitoken_create_prints_a_token_that_authenticates(viewer: User) -> None:
    raw = _run("apitoken", "create", "--user", viewer.username).strip()
    assert raw.startswith("sy_")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/clusters/").status_code == 200

    token = ApiToken.objects.get(user=viewer)
    assert token.name == "cli"
    assert token.revoked_at is None


def test_apitoken_stores_only_the_sha256_of_the_secret(viewer: User) -> None:
    raw = _run("apitoken", "create", "--user", viewer.username, "--name", "ci").strip()
    _, prefix, secret = raw.split("_", 2)
    token = ApiToken.objects.get(user=viewer, name="ci")
    assert token.prefix == prefix
    assert token.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    stored = _every_text_value_in_the_database()
    assert not any(secret in value for value in stored)
    assert not any(raw in value for value in stored)


def test_apitoken_create_for_an_unknown_user_is_a_command_error() -> None:
    with pytest.raises(CommandError, match="no user named 'ghost'"):
        _run("apitoken", "create", "--user", "ghost")
    assert not ApiToken.objects.exists()


def test_apitoken_list_shows_prefixes_never_values_and_revoke_turns_a_token_off(viewer: User) -> None:
    raw = _run("apitoken", "create", "--user", viewer.username, "--name", "laptop").strip()
    _, prefix, secret = raw.split("_", 2)
    listing = _run("apitoken", "list", "--user", viewer.username)
    assert f"{prefix}\tlaptop\tactive" in listing
    assert secret not in listing

    assert _run("apitoken", "revoke", prefix).strip() == f"revoked {prefix}"
    assert f"{prefix}\tlaptop\trevoked" in _run("apitoken", "list", "--user", viewer.username)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/clusters/").status_code == 401


def test_apitoken_revoke_of_an_unknown_prefix_is_a_command_error() -> None:
    with pytest.raises(CommandError, match="no token with prefix"):
        _run("apitoken", "revoke", "000000000000")


def test_worker_for_an_unregistered_cluster_is_a_command_error() -> None:
    with pytest.raises(CommandError, match="no cluster with slug 'nope'"):
        _run("worker", "--cluster", "nope")


def test_worker_refuses_devices_it_cannot_offer(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = make_cluster()
    monkeypatch.setenv("SWITCHYARD_WORKER_DEVICES", "0,gpu1")
    with pytest.raises(CommandError, match="SWITCHYARD_WORKER_DEVICES must be device ordinals"):
        _run("worker", "--cluster", cluster.slug)


def test_worker_refuses_a_concurrency_below_one() -> None:
    with pytest.raises(CommandError, match="--concurrency must be at least 1"):
        _run("worker", "--control", "--concurrency", "0")


def test_apitoken_create_with_workflows_scopes_the_token_to_them(viewer: User, operator: User) -> None:
    from registry.api.authentication import token_allows_workflow
    from tests.factories import make_workflow

    allowed = make_workflow(owner=operator)
    other = make_workflow(owner=operator)
    _run("apitoken", "create", "--user", viewer.username, "--workflow", allowed.slug)

    token = ApiToken.objects.get(user=viewer)
    assert list(token.workflows.all()) == [allowed]
    assert token_allows_workflow(token=token, workflow=allowed)
    assert not token_allows_workflow(token=token, workflow=other)


def test_apitoken_create_with_an_unknown_workflow_is_a_command_error_and_creates_nothing(
    viewer: User,
) -> None:
    with pytest.raises(CommandError, match="no workflow named 'nope'"):
        _run("apitoken", "create", "--user", viewer.username, "--workflow", "nope")
    assert not ApiToken.objects.filter(user=viewer).exists()


def test_apitoken_list_shows_an_expired_token_as_expired(viewer: User) -> None:
    raw = _run("apitoken", "create", "--user", viewer.username, "--name", "old").strip()
    _, prefix, _ = raw.split("_", 2)
    ApiToken.objects.filter(prefix=prefix).update(expires_at=timezone.now() - timedelta(minutes=1))
    assert f"{prefix}\told\texpired" in _run("apitoken", "list", "--user", viewer.username)


def test_the_keys_and_team_pages_show_an_expired_key_as_expired(viewer: User) -> None:
    team = make_team("keys-team")
    make_member(team, Role.ADMIN, user=viewer)
    expired, _ = api_token_create(user=viewer, name="lapsed", team=team)
    live, _ = api_token_create(user=viewer, name="current", team=team)
    ApiToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    client = Client()
    client.force_login(viewer)
    for page in (client.get("/tokens/"), client.get(reverse("team-page", args=[team.slug]))):
        assert page.status_code == 200
        rows = {name: row for name, row in _key_rows(page.content.decode())}
        assert ">expired<" in rows["lapsed"] and ">active<" not in rows["lapsed"]
        assert ">active<" in rows["current"]


def _key_rows(html: str) -> list[tuple[str, str]]:
    """(key name, its table row) of every row of a keys table."""
    rows = re.findall(r"<tr><td>(.*?)</td>(.*?)</tr>", html, flags=re.S)
    return [(name, row) for name, row in rows if name in ("lapsed", "current")]


def test_apitoken_create_prints_the_secret_alone_and_the_keys_terms_beside_it() -> None:
    """stdout holds only the secret (for `TOKEN=$(...)`); stderr the limits and budget, as documented."""
    operator = make_member("ml", Role.OPERATOR)
    out, err = StringIO(), StringIO()
    call_command(
        "apitoken", "create", "--user", operator.username, "--team", "ml", "--tpm", "5000",
        "--budget", "0.004", "--budget-period", "daily", stdout=out, stderr=err,
    )  # fmt: skip
    secret = out.getvalue().strip()
    assert secret.startswith("sy_") and "\n" not in secret
    terms = err.getvalue()
    token = ApiToken.objects.get(user=operator)
    assert f"prefix: {token.prefix}" in terms and "team: ml" in terms
    assert "rate limits: unlimited requests, 5000 tokens per minute" in terms
    assert "team rate limits: unlimited requests, unlimited tokens per minute" in terms
    assert "budget: 0.004 USD daily, hard (402 once spent)" in terms
    budget = Budget.objects.get(api_key=token)
    assert (budget.limit_amount, budget.period, budget.hard_limit) == (Decimal("0.004"), "daily", True)


def test_apitoken_create_with_a_bad_budget_is_a_command_error_and_creates_nothing(viewer: User) -> None:
    for amount in ("lots", "-1", "NaN"):
        with pytest.raises(CommandError, match="--budget"):
            call_command(
                "apitoken", "create", "--user", viewer.username, "--budget", amount, stdout=StringIO()
            )
    assert not ApiToken.objects.filter(user=viewer).exists()
