"""Platform limits bind teams (issue 25): rate limits and budgets a platform admin set are caps
that a team's admins and operators may lower but not raise, clear, disable or delete; a key's
owner may only lower its key's limits. The API answers 400 naming the field, pages a form error,
and every surface asks the same service (team_update, budget_save, api_token_limits_set)."""

from __future__ import annotations

from decimal import Decimal
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from billing.models import Budget
from registry.auth.roles import Role
from registry.models import ApiToken, Team
from registry.services import api_token_create
from tests.factories import api_client, make_member, make_team, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def alpha() -> Team:
    return make_team("alpha")


@pytest.fixture
def platform_admin() -> User:
    return make_user(Role.ADMIN)


def _set_team_limits(user: User, **limits: int | None) -> object:
    return api_client(user).patch("/api/teams/alpha/", limits, format="json")


# --- Team rate limits ---------------------------------------------------------------


def test_a_team_admin_cannot_clear_or_raise_a_platform_set_team_limit(
    alpha: Team, platform_admin: User
) -> None:
    assert _set_team_limits(platform_admin, rpm_limit=600, tpm_limit=90000).status_code == 200
    team_admin = make_member(alpha, Role.ADMIN)
    cleared = _set_team_limits(team_admin, rpm_limit=None)
    assert cleared.status_code == 400
    assert "capped this at 600" in cleared.json()["rpm_limit"][0]
    raised = _set_team_limits(team_admin, tpm_limit=90001)
    assert raised.status_code == 400 and "tpm_limit" in raised.json()
    alpha.refresh_from_db()
    assert (alpha.rpm_limit, alpha.tpm_limit) == (600, 90000)


def test_a_team_admin_may_lower_a_platform_set_limit_and_raise_it_back_to_the_cap(
    alpha: Team, platform_admin: User
) -> None:
    assert _set_team_limits(platform_admin, rpm_limit=600).status_code == 200
    team_admin = make_member(alpha, Role.ADMIN)
    assert _set_team_limits(team_admin, rpm_limit=100).status_code == 200
    alpha.refresh_from_db()
    assert (alpha.rpm_limit, alpha.rpm_cap) == (100, 600)
    assert _set_team_limits(team_admin, rpm_limit=600).status_code == 200
    assert _set_team_limits(team_admin, rpm_limit=601).status_code == 400


def test_a_platform_admin_may_raise_or_clear_a_teams_limit(alpha: Team, platform_admin: User) -> None:
    assert _set_team_limits(platform_admin, rpm_limit=600).status_code == 200
    assert _set_team_limits(platform_admin, rpm_limit=6000).status_code == 200
    alpha.refresh_from_db()
    assert (alpha.rpm_limit, alpha.rpm_cap) == (6000, 6000)
    assert _set_team_limits(platform_admin, rpm_limit=None).status_code == 200
    team_admin = make_member(alpha, Role.ADMIN)
    # No cap any more: the team's admin sets what it likes.
    assert _set_team_limits(team_admin, rpm_limit=50).status_code == 200
    assert _set_team_limits(team_admin, rpm_limit=None).status_code == 200


def test_limits_a_team_is_created_with_are_caps(platform_admin: User) -> None:
    created = api_client(platform_admin).post(
        "/api/teams/", {"slug": "alpha", "name": "Alpha", "rpm_limit": 60}, format="json"
    )
    assert created.status_code == 201
    team_admin = make_member(Team.objects.get(slug="alpha"), Role.ADMIN)
    assert _set_team_limits(team_admin, rpm_limit=None).status_code == 400


# --- Budgets --------------------------------------------------------------------------


def _platform_budget(platform_admin: User) -> int:
    created = api_client(platform_admin).post(
        "/api/budgets/",
        {
            "name": "alpha monthly",
            "scope": "team",
            "team": "alpha",
            "limit_amount": "100",
            "hard_limit": True,
        },
        format="json",
    )
    assert created.status_code == 201, created.json()
    return int(created.json()["id"])


def test_a_team_operator_cannot_raise_soften_disable_retarget_or_delete_a_platform_budget(
    alpha: Team, platform_admin: User
) -> None:
    budget_id = _platform_budget(platform_admin)
    operator = api_client(make_member(alpha, Role.OPERATOR))
    url = f"/api/budgets/{budget_id}/"
    raised = operator.patch(url, {"limit_amount": "1000000"}, format="json")
    assert raised.status_code == 400
    assert "lower its limit only" in raised.json()["limit_amount"][0]
    for change, field in (
        ({"hard_limit": False}, "hard_limit"),
        ({"active": False}, "active"),
        ({"period": "yearly"}, "period"),
    ):
        refused = operator.patch(url, change, format="json")
        assert refused.status_code == 400 and field in refused.json(), (change, refused.json())
    assert operator.delete(url).status_code == 400
    budget = Budget.objects.get(pk=budget_id)
    assert (budget.limit_amount, budget.hard_limit, budget.active) == (Decimal("100"), True, True)


def test_a_team_operator_may_lower_a_platform_budget_and_it_stays_platform_set(
    alpha: Team, platform_admin: User
) -> None:
    budget_id = _platform_budget(platform_admin)
    operator = api_client(make_member(alpha, Role.OPERATOR))
    lowered = operator.patch(f"/api/budgets/{budget_id}/", {"limit_amount": "40"}, format="json")
    assert lowered.status_code == 200, lowered.json()
    refused = operator.patch(f"/api/budgets/{budget_id}/", {"limit_amount": "100"}, format="json")
    assert refused.status_code == 400
    budget = Budget.objects.get(pk=budget_id)
    assert (budget.limit_amount, budget.platform_set) == (Decimal("40"), True)


def test_a_platform_admin_may_raise_and_delete_its_budget(alpha: Team, platform_admin: User) -> None:
    budget_id = _platform_budget(platform_admin)
    client = api_client(platform_admin)
    assert (
        client.patch(f"/api/budgets/{budget_id}/", {"limit_amount": "500"}, format="json").status_code == 200
    )
    assert Budget.objects.get(pk=budget_id).limit_amount == Decimal("500")
    assert client.delete(f"/api/budgets/{budget_id}/").status_code == 204


def test_a_team_operators_own_budget_stays_its_to_raise(alpha: Team) -> None:
    operator = api_client(make_member(alpha, Role.OPERATOR))
    created = operator.post(
        "/api/budgets/",
        {"name": "ours", "scope": "team", "team": "alpha", "limit_amount": "10"},
        format="json",
    )
    assert created.status_code == 201, created.json()
    budget_id = created.json()["id"]
    assert (
        operator.patch(f"/api/budgets/{budget_id}/", {"limit_amount": "20"}, format="json").status_code == 200
    )
    assert operator.delete(f"/api/budgets/{budget_id}/").status_code == 204


def test_the_budget_page_refuses_a_team_operator_raising_a_platform_budget(
    alpha: Team, platform_admin: User
) -> None:
    budget_id = _platform_budget(platform_admin)
    client = Client()
    client.force_login(make_member(alpha, Role.OPERATOR))
    page = client.post(
        f"/billing/budgets/{budget_id}/edit/",
        {
            "name": "alpha monthly",
            "scope": "team",
            "team": "alpha",
            "period": "monthly",
            "limit_amount": "1000000",
            "currency": "USD",
            "thresholds_text": "",
            "hard_limit": "on",
            "active": "on",
        },
    )
    assert page.status_code == 400
    assert "lower its limit only" in page.content.decode()
    assert Budget.objects.get(pk=budget_id).limit_amount == Decimal("100")


# --- Key limits -----------------------------------------------------------------------


def _limits(client: Client, token: ApiToken, **values: str) -> object:
    return client.post("/tokens/", {"limits": str(token.pk), **values})


def test_a_key_owner_may_lower_its_keys_limits_but_not_raise_or_clear_them(alpha: Team) -> None:
    owner = make_member(alpha, Role.OPERATOR)
    token, _ = api_token_create(user=owner, name="k", team=alpha, rpm_limit=60, tpm_limit=1000)
    client = Client()
    client.force_login(owner)
    raised = _limits(client, token, rpm_limit="61", tpm_limit="1000")
    assert raised.status_code == 400
    assert "lower this key&#x27;s limit only" in raised.content.decode()
    cleared = _limits(client, token, rpm_limit="60", tpm_limit="")
    assert cleared.status_code == 400
    token.refresh_from_db()
    assert (token.rpm_limit, token.tpm_limit) == (60, 1000)
    lowered = _limits(client, token, rpm_limit="30", tpm_limit="1000")
    assert lowered.status_code == 302
    token.refresh_from_db()
    assert (token.rpm_limit, token.tpm_limit) == (30, 1000)


def test_a_team_admin_may_raise_its_own_team_keys_limits(alpha: Team) -> None:
    owner = make_member(alpha, Role.ADMIN)
    token, _ = api_token_create(user=owner, name="k", team=alpha, rpm_limit=60)
    client = Client()
    client.force_login(owner)
    assert _limits(client, token, rpm_limit="600").status_code == 302
    token.refresh_from_db()
    assert token.rpm_limit == 600


def test_the_apitoken_command_acts_as_the_platform(alpha: Team) -> None:
    owner = make_member(alpha, Role.OPERATOR)
    token, _ = api_token_create(user=owner, name="k", team=alpha, rpm_limit=60)
    call_command("apitoken", "limits", "--rpm", "600", token.prefix, stdout=StringIO())
    token.refresh_from_db()
    assert token.rpm_limit == 600
