"""Budgets under concurrency: real threads, real connections, committed transactions (PostgreSQL or SQLite)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from decimal import Decimal

import pytest
from django.db import connections
from django.db.models import Sum
from django.utils import timezone

from billing.budgets import (
    BudgetExhausted,
    budget_admit,
    budget_period_bounds,
    budget_save,
    budget_settle,
    spend_target,
)
from billing.models import Budget, BudgetPeriod, Unit, UsageRecord
from billing.services import usage_record
from registry.models import Cluster
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 8
PRICE = Decimal("1.10")  # per accelerator-hour
HOURS = Decimal("0.1")
COST = PRICE * HOURS  # 0.11 per request


def _run_threads(work: Callable[[int], None]) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def run(n: int) -> None:
        try:
            start.wait()
            work(n)
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)
        finally:
            connections.close_all()  # this thread's own connection

    threads = [threading.Thread(target=run, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return errors


def _period(budget: Budget) -> BudgetPeriod:
    start, _ = budget_period_bounds(budget=budget, at=timezone.now()) or (None, None)
    return BudgetPeriod.objects.get(budget=budget, start=start)


def _ledger_total(cluster: Cluster) -> Decimal:
    return UsageRecord.objects.filter(cluster=cluster).aggregate(t=Sum("amount"))["t"] or Decimal("0")


def test_requests_racing_the_last_cents_of_a_hard_limit_overspend_by_at_most_one_request() -> None:
    cluster = make_cluster(price=PRICE)
    limit = Decimal("1.05")  # room for nine and a half requests
    budget = budget_save(
        budget=Budget(
            name="race", scope=Budget.Scope.CLUSTER, cluster=cluster, limit_amount=limit, hard_limit=True
        )
    )
    refused: list[int] = []

    def spend_until_refused(n: int) -> None:
        for i in range(100):
            try:
                admission = budget_admit(estimate=COST, target=spend_target(cluster=cluster))
            except BudgetExhausted:
                refused.append(n)
                return
            try:
                usage_record(
                    unit=Unit.ACCELERATOR_HOUR,
                    quantity=HOURS,
                    occurred_at=timezone.now(),
                    idempotency_key=f"race:{n}:{i}",
                    subject_type="test",
                    subject_id=str(n),
                    cluster=cluster,
                )
            finally:
                budget_settle(admission=admission)

    assert _run_threads(spend_until_refused) == []
    period = _period(budget)
    spent = _ledger_total(cluster)
    print(f"\n{UsageRecord.objects.count()} requests admitted, spent {spent} of {limit}")
    assert sorted(refused) == list(range(THREADS))  # every thread was stopped by the budget
    assert period.spent == spent  # the running total is the ledger's, exactly
    assert period.reserved == 0  # every admission was settled
    assert limit - COST < spent <= limit + COST


def test_concurrent_ledger_writers_keep_a_budget_total_exact_and_alert_once_per_threshold() -> None:
    cluster = make_cluster(price=PRICE)
    # No period row yet: the writers race to open it too.
    budget = budget_save(
        budget=Budget(
            name="exact",
            scope=Budget.Scope.PROVIDER,
            provider=cluster.provider,
            limit_amount=Decimal("10"),  # 40 rows of 0.135802468: 54 %
            thresholds=[25, 50, 100],
        )
    )

    def bill(n: int) -> None:
        for i in range(5):
            usage_record(
                unit=Unit.ACCELERATOR_HOUR,
                quantity=Decimal("0.123456789"),
                occurred_at=timezone.now(),
                idempotency_key=f"exact:{n}:{i}",
                subject_type="test",
                subject_id=str(n),
                cluster=cluster,
            )

    assert _run_threads(bill) == []
    assert UsageRecord.objects.count() == THREADS * 5
    assert _period(budget).spent == _ledger_total(cluster)
    assert BudgetPeriod.objects.filter(budget=budget).count() == 1
    assert sorted(budget.alerts.values_list("threshold_percent", flat=True)) == [25, 50]
