"""Budgets: hard limits (refusals, reservations and their cost in statements) and the forecast."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing.budgets import (
    BudgetExhausted,
    budget_admission,
    budget_admit,
    budget_forecast,
    budget_may_spend,
    budget_period_bounds,
    budget_save,
    budget_settle,
    spend_target,
)
from billing.models import Budget, BudgetPeriod
from registry.models import Cluster
from tests.billing.budgets import PRICE, bill_hours, make_budget, open_period
from tests.factories import api_client, make_cluster, make_workflow
from training.models import ProbeJob
from training.services import DispatchError, probe_job_create

pytestmark = pytest.mark.django_db


# --- Hard limits --------------------------------------------------------------------------------------


def test_a_spent_hard_limit_refuses_with_a_message_naming_the_budget_and_writes_nothing(
    cluster: Cluster,
) -> None:
    budget = make_budget(
        name="gpu-monthly",
        scope=Budget.Scope.PROVIDER,
        provider=cluster.provider,
        limit_amount=Decimal("2.20"),
    )
    budget.hard_limit = True
    budget_save(budget=budget)
    bill_hours(cluster, "2")  # 2.20: exactly the limit
    before = BudgetPeriod.objects.values_list("spent", "reserved").get(budget=budget)
    with pytest.raises(BudgetExhausted) as refused:
        budget_admit(estimate=Decimal("0.01"), target=spend_target(cluster=cluster))
    message = str(refused.value)
    assert "'gpu-monthly'" in message and "2.20" in message and "USD" in message
    start, end = budget_period_bounds(budget=budget, at=timezone.now()) or ()
    assert f"{start:%Y-%m-%d}" in message and f"{end:%Y-%m-%d}" in message
    assert BudgetPeriod.objects.values_list("spent", "reserved").get(budget=budget) == before
    assert budget_may_spend(target=spend_target(cluster=cluster)) == (False, message)


def test_admission_reserves_the_estimate_and_settling_releases_it(cluster: Cluster, operator: User) -> None:
    hard = make_budget(
        scope=Budget.Scope.CLUSTER, cluster=cluster, limit_amount=Decimal("1"), hard_limit=True
    )
    soft = make_budget(scope=Budget.Scope.PROVIDER, provider=cluster.provider, limit_amount=Decimal("0"))
    admission = budget_admit(estimate=Decimal("0.6"), target=spend_target(cluster=cluster))
    assert admission.budget_names == (hard.name,)  # a soft budget never refuses nor reserves
    assert (open_period(hard).reserved, open_period(hard).spent) == (Decimal("0.6"), Decimal("0"))
    assert not BudgetPeriod.objects.filter(budget=soft).exists()
    budget_admit(estimate=Decimal("0.3"), target=spend_target(cluster=cluster))  # 0.6 < 1: admitted
    budget_admit(
        estimate=Decimal("0.3"), target=spend_target(cluster=cluster)
    )  # 0.9 < 1: admitted (the one request over)
    with pytest.raises(BudgetExhausted):
        budget_admit(estimate=Decimal("0.3"), target=spend_target(cluster=cluster))  # 1.2 >= 1: refused
    budget_settle(admission=admission)
    budget_settle(admission=admission)  # twice: a no-op
    assert open_period(hard).reserved == Decimal("0.6")
    # No hard budget applies to another cluster or a workflow: admitted with nothing reserved.
    assert budget_admit(estimate=Decimal("5"), target=spend_target(cluster=make_cluster())).reservations == ()


def test_the_admission_context_settles_even_when_the_spend_fails(cluster: Cluster) -> None:
    hard = make_budget(
        scope=Budget.Scope.CLUSTER, cluster=cluster, limit_amount=Decimal("5"), hard_limit=True
    )
    with budget_admission(estimate=Decimal("1.10"), target=spend_target(cluster=cluster)):
        bill_hours(cluster, "1")
    with (
        pytest.raises(RuntimeError),
        budget_admission(estimate=Decimal("1.10"), target=spend_target(cluster=cluster)),
    ):
        raise RuntimeError("provider timed out")
    assert (open_period(hard).spent, open_period(hard).reserved) == (Decimal("1.1"), Decimal("0"))


def test_a_probe_job_is_refused_when_a_hard_limit_of_its_cluster_or_provider_is_spent(
    cluster: Cluster, operator: User
) -> None:
    make_budget(
        name="probe-cap", scope=Budget.Scope.PROVIDER, provider=cluster.provider, limit_amount=Decimal("1")
    )
    bill_hours(cluster, "1")  # 1.10 > 1, but the budget is soft: dispatch goes on
    assert probe_job_create(cluster=cluster, created_by=operator, steps=5).pk
    budget = Budget.objects.get(name="probe-cap")
    budget.hard_limit = True
    budget_save(budget=budget)
    with pytest.raises(DispatchError, match="probe-cap"):
        probe_job_create(cluster=cluster, created_by=operator, steps=5)

    response = api_client(operator).post(
        "/api/probe-jobs/", {"cluster": cluster.slug, "steps": 20}, format="json"
    )
    assert response.status_code == 400
    assert "budget 'probe-cap' is spent" in response.json()["cluster"][0]
    client = Client()
    client.force_login(operator)
    page = client.post("/jobs/", {"cluster": cluster.slug, "steps": 20})
    assert page.status_code == 400
    assert "budget &#x27;probe-cap&#x27; is spent" in page.content.decode()
    assert ProbeJob.objects.count() == 1


# --- Forecast -----------------------------------------------------------------------------------------


def test_the_forecast_names_the_day_the_budget_runs_out_at_the_current_rate() -> None:
    start, end = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC)
    now = datetime(2026, 1, 11, tzinfo=UTC)  # ten days in, 40 spent: 4 a day
    forecast = budget_forecast(spent=Decimal("40"), limit=Decimal("100"), start=start, end=end, now=now)
    assert forecast.runs_out_at == datetime(2026, 1, 26, tzinfo=UTC)
    assert forecast.text == "at this rate the budget runs out on 2026-01-26 00:00 UTC"
    assert forecast.projected_spend == Decimal("124")


def test_the_forecast_says_within_budget_when_the_rate_lasts_the_period() -> None:
    start, end = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC)
    now = datetime(2026, 1, 11, tzinfo=UTC)
    lasting = budget_forecast(spent=Decimal("10"), limit=Decimal("100"), start=start, end=end, now=now)
    assert lasting.runs_out_at is None
    assert lasting.text.startswith("within budget at this rate") and "31.00" in lasting.text
    idle = budget_forecast(spent=Decimal("0"), limit=Decimal("100"), start=start, end=end, now=now)
    assert (idle.runs_out_at, idle.projected_spend) == (None, Decimal("0"))
    spent = budget_forecast(spent=Decimal("100"), limit=Decimal("100"), start=start, end=end, now=now)
    assert spent.text == "the budget is spent"


def test_far_from_its_limit_a_hard_budget_still_reserves_every_admission_and_refuses_when_spent(
    cluster: Cluster,
) -> None:
    # Issue 25 finding 5: an admission that skipped its reservation far from the limit let
    # simultaneous calls from other processes spend past it together.
    budget = make_budget(
        scope=Budget.Scope.CLUSTER, cluster=cluster, limit_amount=Decimal("100"), hard_limit=True
    )
    small = Decimal("0.01")
    first = budget_admit(estimate=small, target=spend_target(cluster=cluster), cached_budgets=True)
    second = budget_admit(estimate=small, target=spend_target(cluster=cluster), cached_budgets=True)
    assert first.reservations and second.reservations and open_period(budget).reserved == 2 * small
    budget_settle(admission=first)
    budget_settle(admission=second)
    assert open_period(budget).reserved == 0
    bill_hours(cluster, str((Decimal("100") / PRICE).quantize(Decimal("0.000001"))))
    with pytest.raises(BudgetExhausted):
        budget_admit(estimate=small, target=spend_target(cluster=cluster), cached_budgets=True)


def test_an_admission_under_two_hard_budgets_costs_three_statements_and_its_settle_two(
    cluster: Cluster, operator: User
) -> None:
    # The /v1 hot path under hard budgets (issue 28): one query finds the open periods, one
    # locks them, one UPDATE reserves in both; the settle is one UPDATE per period.
    workflow = make_workflow(owner=operator, team="vision")
    make_budget(scope=Budget.Scope.CLUSTER, cluster=cluster, limit_amount=Decimal("100"), hard_limit=True)
    make_budget(scope=Budget.Scope.TEAM, team="vision", limit_amount=Decimal("100"), hard_limit=True)
    target = spend_target(cluster=cluster, workflow=workflow)
    budget_settle(admission=budget_admit(estimate=Decimal("0.01"), target=target, cached_budgets=True))

    def statements(capture: CaptureQueriesContext) -> list[str]:
        return [q["sql"].split()[0] for q in capture.captured_queries if "SAVEPOINT" not in q["sql"]]

    with CaptureQueriesContext(connection) as admitting:
        admission = budget_admit(estimate=Decimal("0.01"), target=target, cached_budgets=True)
    assert len(admission.reservations) == 2
    assert statements(admitting) == ["SELECT", "SELECT", "UPDATE"]
    with CaptureQueriesContext(connection) as settling:
        budget_settle(admission=admission)
    assert statements(settling) == ["UPDATE", "UPDATE"]
    assert set(BudgetPeriod.objects.values_list("reserved", flat=True)) == {Decimal("0")}
