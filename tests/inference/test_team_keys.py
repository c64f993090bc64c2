"""Team keys on /v1 through the real gateway and a loopback provider: a key's own daily hard
budget and its team's answer 402 once the ledger has reached them, the ledger rows name the team
and the key that caused them, an expired key answers 401, and a team key reaches neither another
team's workflows (404, as unknown) nor sees them in /v1/models."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from bench.mockprovider import MockProviderServer
from billing.models import Budget, UsageRecord
from billing.selectors import ledger_verify
from registry.auth.roles import Role
from registry.models import ApiToken, Team, Workflow
from registry.services import api_token_create
from stack.keys import KeyBudget, api_key_issue
from tests.factories import api_client, make_member, make_team, make_user
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db(transaction=True)
Start = Callable[..., MockProviderServer]
# The loopback provider reports 7 prompt and 3 completion tokens per call: at these prices
# every call costs exactly $1.75 + $0.75 = $2.50.
IN_PRICE = Decimal("250000")  # $ per 1M input tokens
OUT_PRICE = Decimal("250000")


def _team_workflow(owner: User, start: Start, team: Team) -> Workflow:
    deployment = priced_deployment(start(text="ok"), in_price=IN_PRICE, out_price=OUT_PRICE)
    return routed_workflow(owner, [deployment], team=team)


def _ask(raw: str, workflow: str) -> Any:
    body = json.dumps({"model": workflow, "messages": [{"role": "user", "content": "ping"}]})
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
        "/v1/chat/completions", body, content_type="application/json"
    )


def test_a_key_with_a_5_dollar_daily_hard_budget_gets_402_once_the_ledger_shows_5_dollars(
    operator: User, mock_provider: Start
) -> None:
    team = make_team("search")
    workflow = _team_workflow(operator, mock_provider, team)
    issued = api_key_issue(
        user=operator,
        name="capped",
        team=team,
        budget=KeyBudget(limit_amount=Decimal("5"), period=Budget.Period.DAILY, hard=True),
    )
    other = api_key_issue(user=operator, name="uncapped", team=team)
    assert _ask(issued.secret, workflow.slug).status_code == 200
    assert _ask(issued.secret, workflow.slug).status_code == 200
    ledger_settled()
    rows = UsageRecord.objects.filter(api_key=issued.token)
    assert sum(r.amount for r in rows) == Decimal("5")

    refused = _ask(issued.secret, workflow.slug)
    assert refused.status_code == 402
    error = refused.json()["error"]
    assert error["code"] == "budget_exhausted" and issued.token.prefix in error["message"]
    assert sum(r.amount for r in UsageRecord.objects.filter(api_key=issued.token)) == Decimal("5")
    # The budget is the key's own: another key of the same team still spends.
    assert _ask(other.secret, workflow.slug).status_code == 200
    ledger_settled()
    assert {(r.team, r.api_key_id) for r in UsageRecord.objects.all()} == {
        ("search", issued.token.pk),
        ("search", other.token.pk),
    }
    assert ledger_verify().ok


def test_a_team_hard_budget_refuses_every_key_of_the_team_with_402(
    operator: User, mock_provider: Start
) -> None:
    team, elsewhere = make_team("vision"), make_team("speech")
    workflow = _team_workflow(operator, mock_provider, team)
    other_workflow = _team_workflow(operator, mock_provider, elsewhere)
    Budget.objects.create(
        name="vision daily",
        scope=Budget.Scope.TEAM,
        team="vision",
        period=Budget.Period.DAILY,
        limit_amount=Decimal("2.5"),
        hard_limit=True,
    )
    _, first = api_token_create(user=operator, name="a", team=team)
    _, second = api_token_create(user=operator, name="b", team=team)
    _, outsider = api_token_create(user=operator, name="c", team=elsewhere)
    assert _ask(first, workflow.slug).status_code == 200
    assert _ask(second, workflow.slug).status_code == 402
    assert _ask(first, workflow.slug).status_code == 402
    assert _ask(outsider, other_workflow.slug).status_code == 200


def test_an_expired_key_answers_401_on_v1_and_on_the_api_saying_so(
    operator: User, mock_provider: Start
) -> None:
    team = make_team("search")
    workflow = _team_workflow(operator, mock_provider, team)
    token, raw = api_token_create(
        user=operator, name="short", team=team, expires_at=timezone.now() + timedelta(hours=1)
    )
    assert _ask(raw, workflow.slug).status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    token.save(update_fields=["name"])  # moves the authorisation version, as any key change does

    refused = _ask(raw, workflow.slug)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "expired_api_key"
    assert "expired at" in refused.json()["error"]["message"]
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get("/api/workflows/")
    assert api.status_code == 401 and "expired at" in api.json()["detail"]
    ledger_settled()
    assert UsageRecord.objects.count() == 2  # the one request before: input and output tokens


def test_a_team_key_gets_404_for_another_teams_workflow_and_lists_only_its_own(
    operator: User, mock_provider: Start
) -> None:
    mine, theirs = make_team("search"), make_team("vision")
    own = _team_workflow(operator, mock_provider, mine)
    foreign = _team_workflow(operator, mock_provider, theirs)
    platform = routed_workflow(operator, [priced_deployment(mock_provider(text="ok"))])
    _, raw = api_token_create(user=operator, name="search key", team=mine)

    assert _ask(raw, own.slug).status_code == 200
    for slug in (foreign.slug, platform.slug):
        refused = _ask(raw, slug)
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "model_not_found"
    listed = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get("/v1/models").json()["data"]
    assert [(m["id"], m["owned_by"]) for m in listed] == [(own.slug, "search")]
    # A platform key of a platform-wide user still reaches every team's workflow.
    _, platform_key = api_token_create(user=operator, name="platform")
    assert _ask(platform_key, foreign.slug).status_code == 200
    ledger_settled()
    assert UsageRecord.objects.filter(api_key__isnull=True).count() == 0


def test_a_team_operator_raising_a_platform_budget_is_refused_and_calls_still_get_402(
    operator: User, mock_provider: Start
) -> None:
    team = make_team("vision")
    workflow = _team_workflow(operator, mock_provider, team)
    platform = api_client(make_user(Role.ADMIN))
    created = platform.post(
        "/api/budgets/",
        {
            "name": "vision daily",
            "scope": "team",
            "team": "vision",
            "period": "daily",
            "limit_amount": "2.5",
            "hard_limit": True,
        },
        format="json",
    )
    assert created.status_code == 201, created.json()
    team_operator = make_member(team, Role.OPERATOR)
    raised = api_client(team_operator, team=team).patch(
        f"/api/budgets/{created.json()['id']}/", {"limit_amount": "1000000"}, format="json"
    )
    assert raised.status_code == 400 and "limit_amount" in raised.json()
    _, raw = api_token_create(user=team_operator, name="a", team=team)
    assert _ask(raw, workflow.slug).status_code == 200
    assert _ask(raw, workflow.slug).status_code == 402
