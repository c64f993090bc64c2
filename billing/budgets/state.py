"""Reads: a budget's current period (spent, reserved, limit) with its burn-rate forecast, and open alerts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import QuerySet
from django.utils import timezone

from billing.budgets.periods import ZERO, budget_ledger_spend, budget_period_bounds
from billing.models import Budget, BudgetAlert, BudgetPeriod

HUNDRED = Decimal("100")


@dataclass(frozen=True)
class Forecast:
    text: str
    runs_out_at: datetime | None  # before the period ends; None when it lasts
    projected_spend: Decimal  # at the end of the period, at the current rate


@dataclass(frozen=True)
class BudgetState:
    budget: Budget
    start: datetime
    end: datetime
    spent: Decimal
    reserved: Decimal
    forecast: Forecast

    @property
    def limit(self) -> Decimal:
        return self.budget.limit_amount

    @property
    def percent(self) -> Decimal:
        if self.limit <= 0:
            return HUNDRED if self.spent > 0 else ZERO
        return (self.spent * HUNDRED / self.limit).quantize(Decimal("0.1"))

    @property
    def remaining(self) -> Decimal:
        return self.limit - self.spent - self.reserved

    def spend_to_come(self, *, now: datetime) -> Decimal:
        """What the rest of the period spends at the period's burn rate so far (spent over the
        time elapsed, times the time left), spent budget or not: the forecast stops at a spent
        budget, the traffic does not."""
        elapsed, left = _micros(now - self.start), _micros(self.end - now)
        if self.spent <= 0 or elapsed <= 0 or left <= 0:
            return ZERO
        return self.spent * left / elapsed


def _micros(delta: timedelta) -> Decimal:
    return Decimal(delta // timedelta(microseconds=1))


def budget_forecast(
    *, spent: Decimal, limit: Decimal, start: datetime, end: datetime, now: datetime
) -> Forecast:
    """Burn rate = spent / time elapsed in the period, projected linearly to the period's end."""
    if spent >= limit and limit >= 0 and spent > 0:
        return Forecast("the budget is spent", now, spent)
    elapsed, left = _micros(now - start), _micros(end - now)
    if spent <= 0 or elapsed <= 0:
        return Forecast("within budget at this rate (no spend yet this period)", None, max(spent, ZERO))
    rate = spent / elapsed  # per microsecond
    projected = spent + rate * max(left, ZERO)
    until_empty = (limit - spent) / rate
    if until_empty >= left:
        return Forecast(
            f"within budget at this rate (about {projected.quantize(Decimal('0.01'))} by the period's end)",
            None,
            projected,
        )
    runs_out = now + timedelta(microseconds=int(until_empty))
    return Forecast(f"at this rate the budget runs out on {runs_out:%Y-%m-%d %H:%M} UTC", runs_out, projected)


def budget_state(*, budget: Budget, now: datetime | None = None) -> BudgetState | None:
    """The budget's current period: spent, reserved, forecast. None outside a custom period.

    Read-only: a period without a row yet is summed from the ledger.
    """
    now = now or timezone.now()
    span = budget_period_bounds(budget=budget, at=now)
    if span is None:
        return None
    start, end = span
    period = BudgetPeriod.objects.filter(budget=budget, start=start).first()
    if period is not None:
        spent, reserved = period.spent, period.reserved
    else:
        spent, reserved = budget_ledger_spend(budget=budget, start=start, end=end), ZERO
    forecast = budget_forecast(spent=spent, limit=budget.limit_amount, start=start, end=end, now=now)
    return BudgetState(budget, start, end, spent, reserved, forecast)


def budget_alerts_open() -> QuerySet[BudgetAlert]:
    """Alerts nobody has acknowledged yet, newest first."""
    return BudgetAlert.objects.filter(acknowledged_at__isnull=True).select_related("budget")


@dataclass(frozen=True)
class BudgetStanding:
    """An active budget's current period as its BudgetPeriod row holds it (for /metrics)."""

    budget: Budget
    spent: Decimal
    reserved: Decimal

    @property
    def remaining(self) -> Decimal:
        return self.budget.limit_amount - self.spent - self.reserved


def budgets_standing(*, now: datetime) -> list[BudgetStanding]:
    """Every active budget in a current period, read from the period rows the ledger writers
    keep (two queries, no ledger sum). A period without a row has had no spend recorded under
    the budget yet: it reads as nothing spent until the first write opens it."""
    budgets = list(Budget.objects.filter(active=True).select_related("workflow", "provider", "cluster"))
    starts = {}
    for budget in budgets:
        span = budget_period_bounds(budget=budget, at=now)
        if span is not None:
            starts[budget.pk] = span[0]
    periods = {
        (p.budget_id, p.start): p
        for p in BudgetPeriod.objects.filter(budget_id__in=starts, start__in=set(starts.values()))
    }
    out = []
    for budget in budgets:
        if budget.pk not in starts:
            continue
        period = periods.get((budget.pk, starts[budget.pk]))
        spent, reserved = (period.spent, period.reserved) if period is not None else (ZERO, ZERO)
        out.append(BudgetStanding(budget, spent, reserved))
    return out
