"""Budgets: spend per period, threshold alerts, hard limits and a burn-rate forecast.

How the numbers stay exact:

* `budget_record_spend` runs inside `billing.services.usage_record_batch`, in
  the same transaction and under the ledger head's row lock. Every ledger write
  is serialised there, so adding each row's amount to its budgets' period
  totals needs no further coordination: `BudgetPeriod.spent` is the ledger's
  own sum for the budget's scope, period and currency.
* A period row is created (with its opening balance summed from the ledger)
  only while holding that same head lock, so no ledger row can slip between the
  opening sum and the row becoming visible to the hook.
* Hard limits (`budget_admit`) lock the matching periods (always in primary-key
  order, so two admissions never wait on each other in a cycle), refuse when
  spent + reserved has reached the limit and otherwise reserve the estimate.
  The caller spends, writes the ledger (which raises `spent`) and then settles
  (which drops the reservation). Between the ledger write and the settle the
  cost counts twice, which errs on the side of refusing. Requests racing for
  the last cents therefore overspend by at most the cost of one request: each
  is admitted only while spent + reserved < limit, and every admitted request
  is counted in `reserved` until its real cost is in `spent`.

Lock order, to stay free of deadlocks: ledger head, then budget periods by id.
A caller must not write the ledger in the same transaction after `budget_admit`
while other writers run (admit first in its own transaction, as the helpers
below do when called outside a transaction).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from smtplib import SMTPException
from typing import Any

import requests
from django.conf import settings
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import Q, QuerySet, Sum
from django.forms import ValidationError as FormValidationError
from django.utils import timezone

from billing.models import LEDGER_PARTITION, Budget, BudgetAlert, BudgetPeriod, LedgerHead, UsageRecord
from stack.registry.crypto import decrypt_secret, encrypt_secret
from stack.registry.errors import DomainError, MultiFieldError
from stack.registry.models import Cluster, Provider, Workflow

logger = logging.getLogger(__name__)

ZERO = Decimal("0")
HUNDRED = Decimal("100")
WEBHOOK_TIMEOUT_S = (3.0, 5.0)  # connect, read: the alert row stays locked while we wait
SIGNATURE_HEADER = "X-Switchyard-Signature"


class BudgetExhausted(DomainError):
    """A hard-limit budget has no room left; nothing was spent or reserved.

    The API fails closed with 402, naming the budget: the caller may not spend until it is raised."""

    status_code = 402

    def __init__(self, message: str, *, budget_id: int) -> None:
        super().__init__(message)
        self.budget_id = budget_id

    def api_body(self) -> dict[str, object]:
        return {"detail": str(self), "code": "budget_exhausted"}


class BudgetInvalid(MultiFieldError, ValueError):
    """A budget's fields do not fit together; `errors` maps field names to messages."""


class AlertDeliveryError(Exception):
    """A transient failure sending an alert (SMTP or webhook unreachable, 5xx, 429): retry later."""


# --- Periods -----------------------------------------------------------------------------------


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


# --- Which budgets a spend falls under -------------------------------------------------------------


@dataclass(frozen=True)
class SpendTarget:
    """The dimensions of a spend that budgets are scoped by."""

    workflow_id: int | None = None
    provider_id: int | None = None
    cluster_id: int | None = None
    team: str = ""
    training_run_id: str = ""

    def keys(self) -> list[tuple[str, str]]:
        found = [
            (Budget.Scope.WORKFLOW.value, self.workflow_id),
            (Budget.Scope.PROVIDER.value, self.provider_id),
            (Budget.Scope.CLUSTER.value, self.cluster_id),
            (Budget.Scope.TEAM.value, self.team),
            (Budget.Scope.TRAINING_RUN.value, self.training_run_id),
        ]
        return [(scope, str(value)) for scope, value in found if value not in (None, "")]


def spend_target(
    *,
    workflow: Workflow | None = None,
    provider: Provider | None = None,
    cluster: Cluster | None = None,
    team: str = "",
    training_run_id: str = "",
) -> SpendTarget:
    """The target of a spend about to happen, filled in as the ledger will fill in its row."""
    provider_id = provider.pk if provider is not None else None
    if provider_id is None and cluster is not None:
        provider_id = cluster.provider_id
    if not team and workflow is not None:
        team = workflow.team
    return SpendTarget(
        workflow_id=workflow.pk if workflow is not None else None,
        provider_id=provider_id,
        cluster_id=cluster.pk if cluster is not None else None,
        team=team,
        training_run_id=training_run_id,
    )


def _row_target(row: UsageRecord) -> SpendTarget:
    return SpendTarget(
        workflow_id=row.workflow_id,
        provider_id=row.provider_id,
        cluster_id=row.cluster_id,
        team=row.team,
        training_run_id=row.subject_id if row.subject_type == "training_run" else "",
    )


def _budget_key(budget: Budget) -> tuple[str, str]:
    value: object = {
        Budget.Scope.WORKFLOW: budget.workflow_id,
        Budget.Scope.PROVIDER: budget.provider_id,
        Budget.Scope.CLUSTER: budget.cluster_id,
        Budget.Scope.TEAM: budget.team,
        Budget.Scope.TRAINING_RUN: budget.training_run_id,
    }[Budget.Scope(budget.scope)]
    return budget.scope, str(value)


def _scope_filter(budget: Budget) -> Q:
    """The ledger rows a budget counts (before period and currency)."""
    if budget.scope == Budget.Scope.WORKFLOW:
        return Q(workflow_id=budget.workflow_id)
    if budget.scope == Budget.Scope.PROVIDER:
        return Q(provider_id=budget.provider_id)
    if budget.scope == Budget.Scope.CLUSTER:
        return Q(cluster_id=budget.cluster_id)
    if budget.scope == Budget.Scope.TEAM:
        return Q(team=budget.team)
    return Q(subject_type="training_run", subject_id=budget.training_run_id)


def budgets_for_target(*, target: SpendTarget) -> list[Budget]:
    """The active budgets a spend with these dimensions counts against, by id."""
    keys = target.keys()
    if not keys:
        return []
    index: dict[tuple[str, str], list[Budget]] = defaultdict(list)
    for budget in Budget.objects.filter(active=True).order_by("pk"):
        index[_budget_key(budget)].append(budget)
    return sorted((b for key in keys for b in index.get(key, [])), key=lambda b: b.pk)


def _ledger_spend(
    *, budget: Budget, start: datetime, end: datetime, exclude_keys: Sequence[str] = ()
) -> Decimal:
    rows = UsageRecord.objects.filter(
        _scope_filter(budget), occurred_at__gte=start, occurred_at__lt=end, currency=budget.currency
    )
    if exclude_keys:
        rows = rows.exclude(idempotency_key__in=list(exclude_keys))
    total: Decimal | None = rows.aggregate(total=Sum("amount"))["total"]
    return total if total is not None else ZERO


def _period_open(
    *, budget: Budget, start: datetime, end: datetime, exclude_keys: Sequence[str] = ()
) -> BudgetPeriod:
    """The budget's period row starting at `start`, created with its ledger balance if missing.

    Created under the ledger head lock (see the module docstring): the opening
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
                "spent": _ledger_spend(budget=budget, start=start, end=end, exclude_keys=exclude_keys),
            },
        )
    return period


# --- The ledger hook ------------------------------------------------------------------------------


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
    index: dict[tuple[str, str], list[Budget]] = defaultdict(list)
    for budget in budgets:
        index[_budget_key(budget)].append(budget)
    deltas: dict[tuple[int, datetime], Decimal] = {}
    ends: dict[tuple[int, datetime], datetime] = {}
    for row in rows:
        for key in _row_target(row).keys():
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
        _period_open(
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
    from billing.tasks import budget_alert_deliver_task

    # After commit: a rolled-back ledger write must not send an alert.
    transaction.on_commit(functools.partial(budget_alert_deliver_task.delay, alert_id))


# --- Hard limits ------------------------------------------------------------------------------------


def _exhausted_message(
    *, budget: Budget, spent: Decimal, reserved: Decimal, start: datetime, end: datetime
) -> str:
    held = f" (+{_money(reserved)} reserved by requests in flight)" if reserved else ""
    return (
        f"budget {budget.name!r} is spent: {_money(spent)}{held} of its {_money(budget.limit_amount)} "
        f"{budget.currency} limit for {start:%Y-%m-%d %H:%M}–{end:%Y-%m-%d %H:%M} UTC"
    )


def _money(value: Decimal) -> str:
    """Cents when that is exact, else every digit (a budget message must not round spend away)."""
    cents = value.quantize(Decimal("0.01"))
    return str(cents) if cents == value else f"{value.normalize():f}"


@dataclass
class Admission:
    """Room reserved in hard-limit budgets for one spend; hand it to `budget_settle` afterwards."""

    estimate: Decimal
    currency: str
    # (BudgetPeriod id, amount reserved there); empty when no hard limit applies.
    reservations: tuple[tuple[int, Decimal], ...] = ()
    budget_names: tuple[str, ...] = ()
    settled: bool = field(default=False, compare=False)


def budget_admit(
    *,
    estimate: Decimal,
    workflow: Workflow | None = None,
    provider: Provider | None = None,
    cluster: Cluster | None = None,
    team: str = "",
    training_run_id: str = "",
    currency: str = "USD",
) -> Admission:
    """Ask "may I spend about `estimate`?" of every hard-limit budget the spend falls under.

    Raises BudgetExhausted (naming the budget, its limit, spent and period)
    when one has spent + reserved >= limit, and then reserves nothing.
    Otherwise reserves `estimate` in each (same-currency) budget and returns
    the Admission; after the real cost is in the ledger, call budget_settle.
    A budget in another currency still refuses once it is spent.
    """
    if not isinstance(estimate, Decimal) or estimate < 0:
        raise ValueError("estimate must be a non-negative Decimal")
    target = spend_target(
        workflow=workflow, provider=provider, cluster=cluster, team=team, training_run_id=training_run_id
    )
    now = timezone.now()
    hard: list[tuple[Budget, datetime, datetime]] = []
    for budget in budgets_for_target(target=target):
        span = budget_period_bounds(budget=budget, at=now) if budget.hard_limit else None
        if span is not None:
            hard.append((budget, *span))
    if not hard:
        return Admission(estimate=estimate, currency=currency)
    by_id = {budget.pk: budget for budget, _, _ in hard}
    with transaction.atomic():
        # Create missing periods first (that takes the ledger head lock), then
        # lock the periods in id order: the module's lock order.
        ids = [_period_open(budget=budget, start=start, end=end).pk for budget, start, end in hard]
        periods = list(BudgetPeriod.objects.select_for_update().filter(pk__in=ids).order_by("pk"))
        for period in periods:
            budget = by_id[period.budget_id]
            if period.spent + period.reserved >= budget.limit_amount:
                raise BudgetExhausted(
                    _exhausted_message(
                        budget=budget,
                        spent=period.spent,
                        reserved=period.reserved,
                        start=period.start,
                        end=period.end,
                    ),
                    budget_id=budget.pk,
                )
        reservations = []
        for period in periods:
            if by_id[period.budget_id].currency != currency or estimate == 0:
                continue
            period.reserved += estimate
            period.save(update_fields=["reserved"])
            reservations.append((period.pk, estimate))
    return Admission(
        estimate=estimate,
        currency=currency,
        reservations=tuple(reservations),
        budget_names=tuple(budget.name for budget, _, _ in hard),
    )


def budget_settle(*, admission: Admission) -> None:
    """Release an admission's reservations (its real cost reaches `spent` through the ledger).

    Settling twice is a no-op. Call it after the usage is recorded, also when
    the spend failed (then nothing was recorded and the room comes back).
    """
    if admission.settled or not admission.reservations:
        admission.settled = True
        return
    amounts = dict(admission.reservations)
    with transaction.atomic():
        for period in BudgetPeriod.objects.select_for_update().filter(pk__in=amounts).order_by("pk"):
            # Never below zero: a period reset by hand must not go negative.
            period.reserved = max(ZERO, period.reserved - amounts[period.pk])
            period.save(update_fields=["reserved"])
    admission.settled = True


@contextmanager
def budget_admission(
    *,
    estimate: Decimal,
    workflow: Workflow | None = None,
    provider: Provider | None = None,
    cluster: Cluster | None = None,
    team: str = "",
    training_run_id: str = "",
    currency: str = "USD",
) -> Iterator[Admission]:
    """`with budget_admission(estimate=..., workflow=wf): call; usage_record(...)` — admit, then settle.

    The shape the inference router wants: call it outside a transaction, so
    the period locks are held only for the admission itself.
    """
    admission = budget_admit(
        estimate=estimate,
        workflow=workflow,
        provider=provider,
        cluster=cluster,
        team=team,
        training_run_id=training_run_id,
        currency=currency,
    )
    try:
        yield admission
    finally:
        budget_settle(admission=admission)


def budget_may_spend(
    *,
    workflow: Workflow | None = None,
    provider: Provider | None = None,
    cluster: Cluster | None = None,
    team: str = "",
    training_run_id: str = "",
) -> tuple[bool, str]:
    """Read-only: (False, why) when a hard-limit budget of this spend is spent, else (True, "")."""
    target = spend_target(
        workflow=workflow, provider=provider, cluster=cluster, team=team, training_run_id=training_run_id
    )
    now = timezone.now()
    for budget in budgets_for_target(target=target):
        if not budget.hard_limit:
            continue
        state = budget_state(budget=budget, now=now)
        if state is not None and state.spent + state.reserved >= budget.limit_amount:
            return False, _exhausted_message(
                budget=budget, spent=state.spent, reserved=state.reserved, start=state.start, end=state.end
            )
    return True, ""


# --- Reads: state and forecast -----------------------------------------------------------------


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
        spent, reserved = _ledger_spend(budget=budget, start=start, end=end), ZERO
    forecast = budget_forecast(spent=spent, limit=budget.limit_amount, start=start, end=end, now=now)
    return BudgetState(budget, start, end, spent, reserved, forecast)


def budget_alerts_open() -> QuerySet[BudgetAlert]:
    return BudgetAlert.objects.filter(acknowledged_at__isnull=True).select_related("budget")


# --- Writes: budgets and alerts ------------------------------------------------------------------

SCOPE_FIELD = {
    Budget.Scope.WORKFLOW: "workflow",
    Budget.Scope.PROVIDER: "provider",
    Budget.Scope.CLUSTER: "cluster",
    Budget.Scope.TEAM: "team",
    Budget.Scope.TRAINING_RUN: "training_run_id",
}


def budget_errors(*, values: Mapping[str, Any], has_secret: bool) -> dict[str, list[str]]:
    """Field errors of a budget's values (those of the model's fields, plus the new secret's presence)."""
    errors: dict[str, list[str]] = defaultdict(list)
    scope = values.get("scope")
    if scope in SCOPE_FIELD:
        needed = SCOPE_FIELD[Budget.Scope(scope)]
        if values.get(needed) in (None, ""):
            errors[needed].append(f"a {Budget.Scope(scope).label.lower()} budget needs a {needed}")
        for other in SCOPE_FIELD.values():
            if other != needed and values.get(other) not in (None, ""):
                errors[other].append(f"leave empty: the budget's scope is {scope}")
    period = values.get("period")
    start, end = values.get("custom_start"), values.get("custom_end")
    if period == Budget.Period.CUSTOM:
        if start is None:
            errors["custom_start"].append("a custom period needs a start")
        if end is None:
            errors["custom_end"].append("a custom period needs an end")
        if start is not None and end is not None and end <= start:
            errors["custom_end"].append("the end must be after the start")
    elif start is not None or end is not None:
        errors["custom_start"].append("only a custom period has a start and end")
    thresholds = values.get("thresholds") or []
    if not isinstance(thresholds, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 1 <= t <= 1000 for t in thresholds
    ):
        errors["thresholds"].append("a list of whole percentages between 1 and 1000, e.g. [50, 80, 100]")
    limit = values.get("limit_amount")
    if limit is not None and limit < 0:
        errors["limit_amount"].append("the limit cannot be negative")
    for address in _addresses(values.get("email_to") or ""):
        try:
            validate_email(address)
        except FormValidationError:
            errors["email_to"].append(f"{address!r} is not an email address")
    if values.get("webhook_url") and not has_secret:
        errors["webhook_secret"].append("a webhook needs a secret to sign its requests with")
    return dict(errors)


def _addresses(email_to: str) -> list[str]:
    return [a.strip() for a in email_to.split(",") if a.strip()]


def budget_save(*, budget: Budget, webhook_secret: str | None = None) -> Budget:
    """Validate and save a budget. `webhook_secret`: a new secret, "" to clear, None to keep."""
    has_secret = bool(webhook_secret) if webhook_secret is not None else bool(budget.webhook_secret_encrypted)
    values = {f.name: getattr(budget, f.name) for f in Budget._meta.concrete_fields}
    errors = budget_errors(values=values, has_secret=has_secret)
    if errors:
        raise BudgetInvalid(errors)
    budget.thresholds = sorted(set(budget.thresholds))
    if webhook_secret is not None:
        budget.webhook_secret_encrypted = encrypt_secret(webhook_secret) if webhook_secret else ""
    with transaction.atomic():
        budget.save()
        # A changed scope, currency or period kind makes the stored running
        # totals of this budget wrong: drop those of the current and later
        # periods, and they are re-summed from the ledger when next needed.
        BudgetPeriod.objects.filter(budget=budget, end__gt=timezone.now(), reserved=ZERO).delete()
    return budget


def budget_alert_acknowledge(*, alert: BudgetAlert) -> BudgetAlert:
    """Mark an alert seen (it leaves the open list); acknowledging twice keeps the first time."""
    BudgetAlert.objects.filter(pk=alert.pk, acknowledged_at__isnull=True).update(
        acknowledged_at=timezone.now()
    )
    alert.refresh_from_db()
    return alert


# --- Alert delivery ---------------------------------------------------------------------------------


def budget_alert_payload(*, alert: BudgetAlert) -> dict[str, Any]:
    budget = alert.budget
    return {
        "alert_id": alert.pk,
        "budget_id": budget.pk,
        "budget": budget.name,
        "scope": budget.scope,
        "threshold_percent": alert.threshold_percent,
        "spent": str(alert.spent),
        "limit": str(alert.limit_amount),
        "currency": budget.currency,
        "hard_limit": budget.hard_limit,
        "period_start": alert.period_start.isoformat(),
        "triggered_at": alert.triggered_at.isoformat(),
    }


def budget_webhook_signature(*, secret: str, body: bytes) -> str:
    """The X-Switchyard-Signature value: sha256=<hex HMAC-SHA256 of the body>."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def budget_alert_deliver(*, alert_id: int) -> None:
    """Send an alert by email and webhook, each at most once; raise AlertDeliveryError to retry.

    Each channel claims the alert row with SELECT ... FOR UPDATE and records
    its sent time in the same transaction, so a re-run (or a second worker)
    finds it sent and does nothing. A failure of one channel does not stop
    the other; a transient failure is raised after both were tried.
    """
    failures = [f for f in (_deliver_email(alert_id), _deliver_webhook(alert_id)) if f]
    if failures:
        raise AlertDeliveryError(f"alert {alert_id}: " + "; ".join(failures))


def _claim(alert_id: int) -> BudgetAlert | None:
    return (
        BudgetAlert.objects.select_for_update(of=("self",))
        .select_related("budget")
        .filter(pk=alert_id)
        .first()
    )


def _deliver_email(alert_id: int) -> str:
    with transaction.atomic():
        alert = _claim(alert_id)
        if alert is None or alert.email_sent_at is not None or not _addresses(alert.budget.email_to):
            return ""
        budget = alert.budget
        subject = f"[Switchyard] budget {budget.name} reached {alert.threshold_percent}%"
        body = (
            f"Budget {budget.name!r} ({budget.get_scope_display()}) has spent {alert.spent} of its "
            f"{alert.limit_amount} {budget.currency} limit for the period starting "
            f"{alert.period_start:%Y-%m-%d %H:%M} UTC ({alert.threshold_percent}% threshold).\n"
        )
        if budget.hard_limit and alert.threshold_percent >= 100:
            body += "It is a hard limit: new spending under it is refused until the next period.\n"
        try:
            send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, _addresses(budget.email_to))
        except (SMTPException, OSError) as exc:
            logger.warning("budget alert %s: email failed: %s", alert_id, exc)
            return f"email: {type(exc).__name__}: {exc}"
        alert.email_sent_at = timezone.now()
        alert.save(update_fields=["email_sent_at"])
    return ""


def _deliver_webhook(alert_id: int) -> str:
    failure = ""
    with transaction.atomic():
        alert = _claim(alert_id)
        if alert is None or alert.webhook_sent_at is not None or not alert.budget.webhook_url:
            return ""
        budget = alert.budget
        if not budget.webhook_secret_encrypted:
            alert.webhook_status = "not sent: the budget has no webhook secret"
            alert.save(update_fields=["webhook_status"])
            return ""
        body = json.dumps(budget_alert_payload(alert=alert), sort_keys=True, separators=(",", ":")).encode()
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: budget_webhook_signature(
                secret=decrypt_secret(budget.webhook_secret_encrypted), body=body
            ),
        }
        try:
            response = requests.post(
                budget.webhook_url,
                data=body,
                headers=headers,
                timeout=WEBHOOK_TIMEOUT_S,
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            failure = f"webhook: {type(exc).__name__}"
            alert.webhook_status = failure[:200]
        else:
            code = response.status_code
            if 200 <= code < 300:
                alert.webhook_sent_at = timezone.now()
                alert.webhook_status = f"HTTP {code}"
            elif code >= 500 or code == 429:
                failure = f"webhook: HTTP {code}"
                alert.webhook_status = failure
            else:
                # The receiver refused this request; sending it again will not help.
                alert.webhook_status = f"HTTP {code} (refused; not retried)"
        alert.save(update_fields=["webhook_sent_at", "webhook_status"])
    if failure:
        logger.warning("budget alert %s: %s", alert_id, failure)
    return failure
