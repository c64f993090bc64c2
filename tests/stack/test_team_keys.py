"""Making API keys for teams: who may make one for which team, what a team key may be scoped
to, its expiry, and the keys page showing a new key once with its limits and budget."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from billing.models import Budget
from registry.auth.roles import Role
from registry.errors import MultiFieldError
from registry.models import ApiToken, Team, TeamMembership
from registry.services import RegistryError, api_token_create
from stack.keys import KeyBudget, api_key_issue
from tests.factories import make_team, make_user, make_workflow

pytestmark = pytest.mark.django_db


def _member(team: Team, role: str) -> User:
    user = make_user()
    TeamMembership.objects.create(team=team, user=user, role=role)
    return user


def test_every_member_of_a_team_makes_its_keys_and_an_outsider_cannot() -> None:
    # Every role may hold keys (a key acts with its user's roles), as before teams.
    search, vision = make_team("search"), make_team("vision")
    for role in (Role.VIEWER, Role.OPERATOR, Role.AUDITOR, Role.ADMIN):
        token, _ = api_token_create(user=_member(search, role), name="k", team=search)
        assert token.team == search
    outsider = _member(search, Role.OPERATOR)
    with pytest.raises(RegistryError) as refused:
        api_token_create(user=outsider, name="k", team=vision)
    assert refused.value.field == "team"
    assert not ApiToken.objects.filter(user=outsider).exists()


def test_a_team_scoped_users_key_must_name_a_team_and_reach_only_its_workflows(operator: User) -> None:
    search, vision = make_team("search"), make_team("vision")
    member = _member(search, Role.OPERATOR)
    with pytest.raises(RegistryError) as refused:
        api_token_create(user=member, name="platform?")
    assert refused.value.field == "team"
    own = make_workflow(owner=operator, team=search)
    foreign = make_workflow(owner=operator, team=vision)
    with pytest.raises(RegistryError) as scoped:
        api_token_create(user=member, name="k", team=search, workflows=[own, foreign])
    assert scoped.value.field == "workflows" and foreign.slug in str(scoped.value)
    token, _ = api_token_create(user=member, name="k", team=search, workflows=[own])
    assert list(token.workflows.all()) == [own]
    # A platform-wide operator makes platform keys and keys of any team.
    assert api_token_create(user=operator, name="p")[0].team is None
    assert api_token_create(user=operator, name="v", team=vision)[0].team == vision


def test_an_expiry_must_be_aware_and_in_the_future(operator: User) -> None:
    with pytest.raises(RegistryError) as past:
        api_token_create(user=operator, name="k", expires_at=timezone.now() - timedelta(minutes=1))
    assert past.value.field == "expires_at"
    with pytest.raises(RegistryError):
        api_token_create(user=operator, name="k", expires_at=timezone.now().replace(tzinfo=None))
    assert not ApiToken.objects.exists()


def test_a_key_and_its_budget_are_made_together_or_not_at_all(operator: User) -> None:
    team = make_team("search")
    issued = api_key_issue(
        user=operator,
        name="capped",
        team=team,
        budget=KeyBudget(limit_amount=Decimal("5"), period=Budget.Period.DAILY),
    )
    assert issued.budget is not None
    assert (issued.budget.scope, issued.budget.api_key, issued.budget.hard_limit) == (
        Budget.Scope.API_KEY,
        issued.token,
        True,
    )
    assert issued.budget.target_key() == ("api_key", str(issued.token.pk))
    with pytest.raises(MultiFieldError) as bad:
        api_key_issue(user=operator, name="bad", team=team, budget=KeyBudget(limit_amount=Decimal("-1")))
    assert "budget_limit_amount" in bad.value.errors
    assert not ApiToken.objects.filter(name="bad").exists()


def test_the_keys_page_shows_a_new_team_key_once_with_its_limits_and_budget(operator: User) -> None:
    make_team("search", rpm_limit=600)
    client = Client()
    client.force_login(operator)
    created = client.post(
        "/tokens/",
        {
            "name": "search bot",
            "team": "search",
            "rpm_limit": "60",
            "expires_at": "2099-01-01T00:00:00Z",
            "budget_limit_amount": "5",
            "budget_period": "daily",
            "budget_hard": "on",
        },
    )
    assert created.status_code == 200, created.content
    html = created.content.decode()
    token = ApiToken.objects.get(name="search bot")
    assert (token.team.slug, token.rpm_limit) == ("search", 60)
    assert token.expires_at is not None and token.expires_at.year == 2099
    assert f"sy_{token.prefix}_" in html
    assert "5.00 USD daily, hard (402 once spent)" in html and "2099-01-01 00:00" in html
    assert "60 requests" in html and "600 / unlimited" in html
    later = client.get("/tokens/").content.decode()
    assert 'id="new-token"' not in later and "5.00 USD daily (hard)" in later

    refused = client.post("/tokens/", {"name": "x", "team": "no-such-team"})
    assert refused.status_code == 400 and "no team no-such-team" in refused.content.decode()
    past = client.post("/tokens/", {"name": "x", "expires_at": "2001-01-01T00:00:00Z"})
    assert past.status_code == 400 and "the expiry must be in the future" in past.content.decode()
    assert not ApiToken.objects.filter(name="x").exists()


def test_the_apitoken_command_makes_a_team_key_with_an_expiry(
    operator: User, capsys: pytest.CaptureFixture[str]
) -> None:
    make_team("search")
    call_command(
        "apitoken", "create", "--user", operator.username, "--team", "search", "--expires", "2099-01-01"
    )
    raw = capsys.readouterr().out.strip()
    token = ApiToken.objects.get(prefix=raw.split("_")[1])
    assert token.team.slug == "search" and token.expires_at is not None
    with pytest.raises(CommandError, match="no team"):
        call_command("apitoken", "create", "--user", operator.username, "--team", "nope")
    with pytest.raises(CommandError, match="--expires"):
        call_command("apitoken", "create", "--user", operator.username, "--expires", "tomorrow")
