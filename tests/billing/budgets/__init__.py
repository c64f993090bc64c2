"""Budgets: periods, exact spend through the ledger, thresholds, hard limits, forecast, API and
pages. The tests are in this package's modules; the helpers they share are here."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone

from billing.budgets import budget_period_bounds, budget_save
from billing.models import Budget, BudgetPeriod, Unit, UsageRecord
from billing.services import usage_record
from registry.models import Cluster

__all__ = ["PRICE", "bill_hours", "make_budget", "open_period"]

PRICE = Decimal("1.10")  # per accelerator-hour


def bill_hours(cluster: Cluster, hours: str, *, at: datetime | None = None, **extra: Any) -> UsageRecord:
    at = at or timezone.now()
    return usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal(hours),
        occurred_at=at,
        idempotency_key=f"test:{cluster.slug}:{at.isoformat()}:{hours}:{extra}",
        subject_type=extra.pop("subject_type", "test"),
        subject_id=extra.pop("subject_id", "1"),
        cluster=cluster,
        **extra,
    )


def make_budget(**fields: Any) -> Budget:
    values: dict[str, Any] = {"name": f"budget-{Budget.objects.count() + 1}", "limit_amount": Decimal("10")}
    values.update(fields)
    secret = values.pop("webhook_secret", None)
    return budget_save(budget=Budget(**values), webhook_secret=secret)


def open_period(budget: Budget) -> BudgetPeriod:
    start, _ = budget_period_bounds(budget=budget, at=timezone.now()) or (None, None)
    return BudgetPeriod.objects.get(budget=budget, start=start)
