"""The ledger hook: new ledger rows added to their budgets' period totals, threshold alerts raised."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

from django.db import connection, transaction
from django.db.models import F
from django.urls import reverse
from django.utils import timezone

from billing.alerts import BUDGET_ALERT_DELIVER, AlertMessage, alert_raise
from billing.budgets.periods import ZERO, budget_period_bounds, budget_period_open
from billing.budgets.state import HUNDRED
from billing.budgets.targets import budgets_by_key, spend_target_of_row
from billing.models import AlertKind, Budget, BudgetAlert, BudgetPeriod, UsageRecord
from registry.queues import CONTROL_QUEUE, task_send


def budget_record_spend(*, rows: Sequence[UsageRecord]) -> list[BudgetAlert]:
    """Add newly written ledger rows to their budgets' periods; raise threshold alerts.

    Called by usage_record_batch inside its transaction, under its partition's head
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
    # One query finds the periods that exist; a missing one is opened (with its ledger balance).
    existing = {
        (p.budget_id, p.start): p
        for p in BudgetPeriod.objects.filter(
            budget_id__in={b for b, _ in deltas}, start__in={s for _, s in deltas}
        ).only("pk", "budget_id", "start")
    }
    opened: set[int] = set()
    period_ids: dict[int, tuple[int, datetime]] = {}
    for budget_id, start in sorted(deltas):
        period = existing.get((budget_id, start))
        if period is None:
            period = budget_period_open(
                budget=by_id[budget_id], start=start, end=ends[(budget_id, start)], exclude_keys=batch_keys
            )
            opened.add(period.pk)
        period_ids[period.pk] = (budget_id, start)
    now = timezone.now()
    alerts: list[BudgetAlert] = []
    # One UPDATE per period, in id order (writers on other ledger partitions take the same row
    # locks in the same order: no deadlock); RETURNING gives the new total for the alerts.
    for period_id in sorted(period_ids):
        budget_id, start = period_ids[period_id]
        delta = deltas[(budget_id, start)]
        spent = _add_spend(period_id, delta)
        before = None if period_id in opened else spent - delta
        alerts += _raise_alerts(budget=by_id[budget_id], start=start, spent=spent, before=before, now=now)
    return alerts


def _add_spend(period_id: int, delta: Decimal) -> Decimal:
    """Add to a period's total and return the new total, in one statement on PostgreSQL."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {BudgetPeriod._meta.db_table} SET spent = spent + %s WHERE id = %s RETURNING spent",  # noqa: S608
                [delta, period_id],
            )
            (spent,) = cursor.fetchone()
        return Decimal(spent)
    BudgetPeriod.objects.filter(pk=period_id).update(spent=F("spent") + delta)
    return BudgetPeriod.objects.values_list("spent", flat=True).get(pk=period_id)


def _threshold_reached(*, spent: Decimal, limit: Decimal, percent: int) -> bool:
    if limit <= 0:
        return spent > 0
    return spent * HUNDRED >= limit * percent


def _raise_alerts(
    *, budget: Budget, start: datetime, spent: Decimal, before: Decimal | None, now: datetime
) -> list[BudgetAlert]:
    """Alerts for the thresholds this spend crossed (`before`: the total before it; None for a
    period opened by this write, whose opening balance may already be past some thresholds)."""
    created: list[BudgetAlert] = []
    for percent in sorted({int(p) for p in budget.thresholds}):
        if not _threshold_reached(spent=spent, limit=budget.limit_amount, percent=percent):
            continue
        if before is not None and _threshold_reached(
            spent=before, limit=budget.limit_amount, percent=percent
        ):
            continue  # reached before this write: its alert exists (or was raised then)
        # Unique per (budget, period, threshold): reached twice (after a reversal) alerts once.
        alert, was_created = BudgetAlert.objects.get_or_create(
            budget=budget,
            period_start=start,
            threshold_percent=percent,
            defaults={"spent": spent, "limit_amount": budget.limit_amount, "triggered_at": now},
        )
        if was_created:
            created.append(alert)
            if budget.email_to or budget.webhook_url:
                _enqueue_delivery(alert.pk)
            _raise_on_channels(alert=alert, now=now)
    return created


def _raise_on_channels(*, alert: BudgetAlert, now: datetime) -> None:
    """The alert channels' copy (Slack, Teams, signed webhooks). The key is the budget, its period
    and the threshold: every threshold crossed alerts at once (a jump past 50, 80 and 100% sends
    all three, the 100% one never waiting out the 50% one's quiet period); the quiet period only
    folds repeats of the same threshold."""
    budget = alert.budget
    hard = (
        " It is a hard limit: new spending under it is refused."
        if budget.hard_limit and alert.threshold_percent >= 100
        else ""
    )
    alert_raise(
        kind=AlertKind.BUDGET,
        dedup_key=f"budget:{budget.pk}:{alert.period_start.isoformat()}:{alert.threshold_percent}",
        message=AlertMessage(
            title=f"Budget {budget.name} reached {alert.threshold_percent}%",
            text=f"{budget.target_label()} has spent {alert.spent} of its {alert.limit_amount} {budget.currency} limit.{hard}",
            facts=[
                ("Spent", f"{alert.spent} {budget.currency}"),
                ("Limit", f"{alert.limit_amount} {budget.currency}"),
                ("Threshold", f"{alert.threshold_percent}%"),
                ("Period start", f"{alert.period_start:%Y-%m-%d %H:%M} UTC"),
            ],
            path=reverse("billing-budgets"),
        ),
        now=now,
    )


def _enqueue_delivery(alert_id: int) -> None:
    # After commit: a rolled-back ledger write must not send an alert.
    transaction.on_commit(functools.partial(task_send, BUDGET_ALERT_DELIVER, alert_id, queue=CONTROL_QUEUE))
