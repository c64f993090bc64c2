"""Budgets: periods, exact spend through the ledger, and threshold alerts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from billing.budgets import (
    budget_hard_limit_keys,
    budget_period_bounds,
    budget_state,
    budgets_for_target,
    spend_target,
)
from billing.models import Budget, BudgetAlert, BudgetPeriod
from billing.services import usage_reverse
from registry.models import Cluster
from registry.queues import task_send
from tests.billing.budgets import PRICE, bill_hours, make_budget, open_period
from tests.factories import make_cluster, make_price, make_workflow
from training.models import TrainingRun

pytestmark = pytest.mark.django_db


# --- Periods ------------------------------------------------------------------------------------------


def test_a_monthly_period_is_the_calendar_month_in_utc_and_december_rolls_into_january() -> None:
    budget = Budget(period=Budget.Period.MONTHLY)
    start, end = budget_period_bounds(budget=budget, at=datetime(2025, 12, 31, 23, 59, tzinfo=UTC)) or ()
    assert (start, end) == (datetime(2025, 12, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC))
    # 00:30 on 1 Feb in UTC+2 is still 31 January in UTC.
    plus_two = datetime(2026, 2, 1, 0, 30, tzinfo=UTC).astimezone(timezone.get_fixed_timezone(120))
    assert budget_period_bounds(budget=budget, at=plus_two - timedelta(hours=2)) == (
        datetime(2026, 1, 1, tzinfo=UTC),
        datetime(2026, 2, 1, tzinfo=UTC),
    )


def test_a_weekly_period_is_the_iso_week_from_monday_midnight_utc() -> None:
    budget = Budget(period=Budget.Period.WEEKLY)
    sunday_night = datetime(2026, 1, 4, 23, 59, 59, tzinfo=UTC)
    assert budget_period_bounds(budget=budget, at=sunday_night) == (
        datetime(2025, 12, 29, tzinfo=UTC),
        datetime(2026, 1, 5, tzinfo=UTC),
    )
    assert budget_period_bounds(budget=budget, at=datetime(2026, 1, 5, tzinfo=UTC)) == (
        datetime(2026, 1, 5, tzinfo=UTC),
        datetime(2026, 1, 12, tzinfo=UTC),
    )


def test_a_custom_period_covers_its_start_but_not_its_end() -> None:
    start, end = datetime(2026, 3, 10, tzinfo=UTC), datetime(2026, 3, 20, tzinfo=UTC)
    budget = Budget(period=Budget.Period.CUSTOM, custom_start=start, custom_end=end)
    assert budget_period_bounds(budget=budget, at=start) == (start, end)
    assert budget_period_bounds(budget=budget, at=end) is None
    assert budget_period_bounds(budget=budget, at=start - timedelta(microseconds=1)) is None


# --- Spend through the ledger ---------------------------------------------------------------------


def test_spend_accumulates_exactly_through_the_ledger_in_the_budget_currency_only(cluster: Cluster) -> None:
    budget = make_budget(scope=Budget.Scope.PROVIDER, provider=cluster.provider, limit_amount=Decimal("100"))
    euro_cluster = make_cluster(price=None, provider=cluster.provider)
    make_price(cluster=euro_cluster, unit_price=Decimal("3"), currency="EUR")
    rows = [bill_hours(cluster, hours) for hours in ("0.000277778", "1.333333333", "0.5", "2.123456789")]
    bill_hours(euro_cluster, "1")  # EUR: another currency, not counted in a USD budget
    bill_hours(make_cluster(price=PRICE), "1")  # another provider
    expected = sum((r.amount for r in rows), Decimal("0"))
    assert open_period(budget).spent == expected
    assert budget_state(budget=budget).spent == expected  # type: ignore[union-attr]


def test_a_budget_created_mid_period_opens_with_the_spend_already_in_the_ledger(cluster: Cluster) -> None:
    first = bill_hours(cluster, "2")
    last_month = bill_hours(cluster, "5", at=timezone.now().replace(day=1) - timedelta(days=3))
    budget = make_budget(scope=Budget.Scope.CLUSTER, cluster=cluster)
    # Read-only before any period row exists: summed from the ledger.
    assert budget_state(budget=budget).spent == first.amount  # type: ignore[union-attr]
    second = bill_hours(cluster, "1")
    assert open_period(budget).spent == first.amount + second.amount
    # A late row for last month opens last month's period, with that month's earlier spend.
    late = bill_hours(cluster, "0.5", at=last_month.occurred_at)
    before = BudgetPeriod.objects.get(budget=budget, start__lt=open_period(budget).start)
    assert before.spent == last_month.amount + late.amount
    assert open_period(budget).spent == first.amount + second.amount


def test_training_run_team_and_workflow_budgets_count_the_rows_that_name_them(
    cluster: Cluster, operator: User
) -> None:
    workflow = make_workflow(owner=operator, team="vision")
    run_id = str(TrainingRun.objects.create(name="budgeted", config={}).pk)  # budgets name real runs
    run = make_budget(scope=Budget.Scope.TRAINING_RUN, training_run_id=run_id)
    team = make_budget(scope=Budget.Scope.TEAM, team="vision")
    flow = make_budget(scope=Budget.Scope.WORKFLOW, workflow=workflow)
    training = bill_hours(cluster, "1", subject_type="training_run", subject_id=run_id)
    bill_hours(cluster, "1", subject_type="training_run", subject_id=f"{run_id}0")
    served = bill_hours(cluster, "0.25", workflow=workflow)  # the row takes the workflow's team
    assert open_period(run).spent == training.amount
    assert open_period(team).spent == served.amount
    assert open_period(flow).spent == served.amount


def test_a_budget_and_a_spend_it_covers_share_one_target_key_for_every_scope(
    cluster: Cluster, operator: User
) -> None:
    workflow = make_workflow(owner=operator, team="vision")
    run_id = str(TrainingRun.objects.create(name="budgeted", config={}).pk)
    budgets = [
        make_budget(scope=Budget.Scope.WORKFLOW, workflow=workflow),
        make_budget(scope=Budget.Scope.PROVIDER, provider=cluster.provider, hard_limit=True),
        make_budget(scope=Budget.Scope.CLUSTER, cluster=cluster),
        make_budget(scope=Budget.Scope.TEAM, team="vision", hard_limit=True),
        make_budget(scope=Budget.Scope.TRAINING_RUN, training_run_id=run_id),
    ]
    spend = spend_target(workflow=workflow, cluster=cluster, training_run_id=run_id)
    assert [b.target_key() for b in budgets] == spend.keys()
    assert spend.keys() == [
        ("workflow", str(workflow.pk)),
        ("provider", str(cluster.provider_id)),
        ("cluster", str(cluster.pk)),
        ("team", "vision"),
        ("training_run", run_id),
    ]
    assert budgets_for_target(target=spend) == budgets
    assert budget_hard_limit_keys() == {budgets[1].target_key(), budgets[3].target_key()}
    assert [b.target_label() for b in budgets] == [
        f"Workflow {workflow.slug}",
        f"Provider {cluster.provider.slug}",
        f"Cluster {cluster.slug}",
        "Team vision",
        f"Training run {run_id}",
    ]


def test_a_reversal_takes_its_amount_back_out_of_the_budget(cluster: Cluster) -> None:
    budget = make_budget(scope=Budget.Scope.CLUSTER, cluster=cluster)
    row = bill_hours(cluster, "3")
    usage_reverse(record=row, reason="double billed", occurred_at=timezone.now())
    assert open_period(budget).spent == Decimal("0")


# --- Thresholds -----------------------------------------------------------------------------------


def test_each_threshold_alerts_once_per_period_and_delivery_is_enqueued_after_commit(
    cluster: Cluster, django_capture_on_commit_callbacks: Any
) -> None:
    budget = make_budget(
        scope=Budget.Scope.CLUSTER,
        cluster=cluster,
        limit_amount=Decimal("11"),  # ten hours at 1.10
        thresholds=[100, 50, 80],
        email_to="ops@example.com",
    )
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        bill_hours(cluster, "4")  # 40 %
        assert not BudgetAlert.objects.exists()
        bill_hours(cluster, "1")  # 50 % exactly
        bill_hours(cluster, "4")  # 90 %: crosses 80
        bill_hours(cluster, "1")  # 100 %
        row = bill_hours(cluster, "2")  # 120 %: nothing new
        usage_reverse(record=row, reason="test", occurred_at=timezone.now())
        bill_hours(cluster, "2.5")  # back over 100 % after the reversal: still nothing new
    alerts = list(BudgetAlert.objects.filter(budget=budget).order_by("threshold_percent"))
    assert [(a.threshold_percent, a.spent) for a in alerts] == [
        (50, Decimal("5.5")),
        (80, Decimal("9.9")),
        (100, Decimal("11")),
    ]
    assert all(a.limit_amount == Decimal("11") and a.email_sent_at is None for a in alerts)
    # Sent by name (registry.queues.task_send) once the transaction commits.
    enqueued = [cb.args for cb in callbacks if getattr(cb, "func", None) is task_send]
    assert enqueued == [("billing.budget_alert_deliver", a.pk) for a in alerts]


def test_an_alert_without_email_or_webhook_is_shown_but_nothing_is_enqueued(
    cluster: Cluster, django_capture_on_commit_callbacks: Any
) -> None:
    make_budget(scope=Budget.Scope.CLUSTER, cluster=cluster, limit_amount=Decimal("1"), thresholds=[100])
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        bill_hours(cluster, "1")
    assert BudgetAlert.objects.count() == 1
    assert callbacks == []
