"""Budget periods: their bounds in time, and the running-total rows opened from the ledger under its head lock."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Sum

from billing.budgets.targets import budget_scope_filter
from billing.models import Budget, BudgetPeriod, UsageRecord

ZERO = Decimal("0")


def budget_period_bounds(*, budget: Budget, at: datetime) -> tuple[datetime, datetime] | None:
    """The [start, end) of the budget's period that contains `at`, in UTC; None outside a custom period.

    Daily: the UTC day. Monthly: the calendar month. Weekly: the ISO week, from Monday 00:00 UTC.
    Custom: custom_start..custom_end.
    """
    if at.tzinfo is None:
        raise ValueError("at must be timezone-aware")
    at = at.astimezone(UTC)
    if budget.period == Budget.Period.DAILY:
        start = datetime.combine(at.date(), time.min, tzinfo=UTC)
        return start, start + timedelta(days=1)
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

    Called by ledger writers (billing.budgets.ledger_hook) after they insert their rows, before
    they commit. The opening balance is every committed row of the period; each writer adds its
    own batch (`exclude_keys`) itself. No row is counted twice or missed, with writers on several
    ledger partitions at once: a writer that finds no period tries to create it, so while one
    writer's new period is uncommitted every other writer waits on the unique (budget, start)
    index and then adds its rows to that period; a writer cannot commit rows for the period
    without passing here, so any row committed before the opening balance was read is in it.
    """
    period = BudgetPeriod.objects.filter(budget=budget, start=start).first()
    if period is not None:
        return period
    with transaction.atomic():
        period, _ = BudgetPeriod.objects.get_or_create(
            budget=budget,
            start=start,
            defaults={
                "end": end,
                "spent": budget_ledger_spend(budget=budget, start=start, end=end, exclude_keys=exclude_keys),
            },
        )
    return period
