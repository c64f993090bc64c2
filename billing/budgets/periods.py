"""Budget periods: their bounds in time, and the running-total rows opened from the ledger under its head lock."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Sum

from billing.budgets.targets import budget_scope_filter
from billing.models import LEDGER_PARTITION, Budget, BudgetPeriod, LedgerHead, UsageRecord

ZERO = Decimal("0")


def budget_period_bounds(*, budget: Budget, at: datetime) -> tuple[datetime, datetime] | None:
    """The [start, end) of the budget's period that contains `at`, in UTC; None outside a custom period.

    Monthly: the calendar month. Weekly: the ISO week, from Monday 00:00 UTC.
    Custom: custom_start..custom_end.
    """
    if at.tzinfo is None:
        raise ValueError("at must be timezone-aware")
    at = at.astimezone(UTC)
    if budget.period == Budget.Period.MONTHLY:
        start = datetime(at.year, at.month, 1, tzinfo=UTC)
        end = datetime(at.year + at.month // 12, at.month % 12 + 1, 1, tzinfo=UTC)
        return start, end
    if budget.period == Budget.Period.WEEKLY:
        monday = at.date() - timedelta(days=at.weekday())
        start = datetime.combine(monday, time.min, tzinfo=UTC)
        return start, start + timedelta(days=7)
    if budget.custom_start is None or budget.custom_end is None:
        return None
    start, end = budget.custom_start.astimezone(UTC), budget.custom_end.astimezone(UTC)
    return (start, end) if start <= at < end else None


def budget_ledger_spend(
    *, budget: Budget, start: datetime, end: datetime, exclude_keys: Sequence[str] = ()
) -> Decimal:
    """The budget's spend from [start, end) summed from the ledger, less the rows with `exclude_keys`."""
    rows = UsageRecord.objects.filter(
        budget_scope_filter(budget), occurred_at__gte=start, occurred_at__lt=end, currency=budget.currency
    )
    if exclude_keys:
        rows = rows.exclude(idempotency_key__in=list(exclude_keys))
    total: Decimal | None = rows.aggregate(total=Sum("amount"))["total"]
    return total if total is not None else ZERO


def budget_period_open(
    *, budget: Budget, start: datetime, end: datetime, exclude_keys: Sequence[str] = ()
) -> BudgetPeriod:
    """The budget's period row starting at `start`, created with its ledger balance if missing.

    Created under the ledger head lock (see billing.budgets): the opening
    balance then holds every committed row, and every later row finds this
    period. `exclude_keys`: rows of the batch being written right now, which
    the caller adds itself.
    """
    period = BudgetPeriod.objects.filter(budget=budget, start=start).first()
    if period is not None:
        return period
    with transaction.atomic():
        LedgerHead.objects.select_for_update().get_or_create(partition=LEDGER_PARTITION)
        period, _ = BudgetPeriod.objects.get_or_create(
            budget=budget,
            start=start,
            defaults={
                "end": end,
                "spent": budget_ledger_spend(budget=budget, start=start, end=end, exclude_keys=exclude_keys),
            },
        )
    return period
