"""The ledger hook: new ledger rows added to their budgets' period totals, threshold alerts raised."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from billing.budgets.delivery import budget_alert_deliver_task
from billing.budgets.periods import ZERO, budget_period_bounds, budget_period_open
from billing.budgets.state import HUNDRED
from billing.budgets.targets import budgets_by_key, spend_target_of_row
from billing.models import Budget, BudgetAlert, BudgetPeriod, UsageRecord


def budget_record_spend(*, rows: Sequence[UsageRecord]) -> list[BudgetAlert]:
    """Add newly written ledger rows to their budgets' periods; raise threshold alerts.

    Called by usage_record_batch inside its transaction, under the ledger head
    lock, right after the rows are inserted. Returns the alerts it created;
    their delivery is enqueued once the transaction commits.
    """
    if not rows:
        return []
    budgets = list(Budget.objects.filter(active=True).order_by("pk"))
    if not budgets:
        return []
    index = budgets_by_key(budgets)
    deltas: dict[tuple[int, datetime], Decimal] = {}
    ends: dict[tuple[int, datetime], datetime] = {}
    for row in rows:
        for key in spend_target_of_row(row).keys():
            for budget in index.get(key, []):
                if budget.currency != row.currency:
                    continue  # no exchange rates: a budget counts its own currency only
                span = budget_period_bounds(budget=budget, at=row.occurred_at)
                if span is None:
                    continue
                slot = (budget.pk, span[0])
                deltas[slot] = deltas.get(slot, ZERO) + row.amount
                ends[slot] = span[1]
    if not deltas:
        return []
    by_id = {b.pk: b for b in budgets}
    batch_keys = [row.idempotency_key for row in rows]
    period_ids = {
        budget_period_open(
            budget=by_id[budget_id], start=start, end=ends[(budget_id, start)], exclude_keys=batch_keys
        ).pk: (budget_id, start)
        for budget_id, start in sorted(deltas)
    }
    now = timezone.now()
    alerts: list[BudgetAlert] = []
    for period in BudgetPeriod.objects.select_for_update().filter(pk__in=period_ids).order_by("pk"):
        period.spent += deltas[period_ids[period.pk]]
        period.save(update_fields=["spent"])
        alerts += _raise_alerts(budget=by_id[period.budget_id], period=period, now=now)
    return alerts


def _threshold_reached(*, spent: Decimal, limit: Decimal, percent: int) -> bool:
    if limit <= 0:
        return spent > 0
    return spent * HUNDRED >= limit * percent


def _raise_alerts(*, budget: Budget, period: BudgetPeriod, now: datetime) -> list[BudgetAlert]:
    created: list[BudgetAlert] = []
    for percent in sorted({int(p) for p in budget.thresholds}):
        if not _threshold_reached(spent=period.spent, limit=budget.limit_amount, percent=percent):
            continue
        # Unique per (budget, period, threshold): reached twice (after a reversal) alerts once.
        alert, was_created = BudgetAlert.objects.get_or_create(
            budget=budget,
            period_start=period.start,
            threshold_percent=percent,
            defaults={"spent": period.spent, "limit_amount": budget.limit_amount, "triggered_at": now},
        )
        if was_created:
            created.append(alert)
            if budget.email_to or budget.webhook_url:
                _enqueue_delivery(alert.pk)
    return created


def _enqueue_delivery(alert_id: int) -> None:
    # After commit: a rolled-back ledger write must not send an alert.
    transaction.on_commit(functools.partial(budget_alert_deliver_task.delay, alert_id))
