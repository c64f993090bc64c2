"""Writes: validating and saving budgets, acknowledging alerts."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from django.core.validators import validate_email
from django.db import transaction
from django.forms import ValidationError as FormValidationError
from django.utils import timezone

from billing.alerts.sending import email_addresses
from billing.budgets.errors import BudgetInvalid
from billing.budgets.periods import ZERO
from billing.budgets.targets import SPEND_DIMENSIONS
from billing.models import Budget, BudgetAlert, BudgetPeriod
from registry.auth.subjects import subject_exists
from registry.crypto import encrypt_secret
from registry.models import Team
from registry.outbound.guard import PUBLIC_ONLY, url_literal_refusal
from registry.validation import id_parse


def budget_errors(*, values: Mapping[str, Any], has_secret: bool) -> dict[str, list[str]]:
    """Field errors of a budget's values (those of the model's fields, plus the new secret's presence)."""
    errors: dict[str, list[str]] = defaultdict(list)
    scope = values.get("scope")
    if scope in Budget.SCOPE_FIELDS:
        needed = Budget.SCOPE_FIELDS[scope]
        if values.get(needed) in (None, ""):
            errors[needed].append(f"a {Budget.Scope(scope).label.lower()} budget needs a {needed}")
        for other in Budget.SCOPE_FIELDS.values():
            if other != needed and values.get(other) not in (None, ""):
                errors[other].append(f"leave empty: the budget's scope is {scope}")
    team = values.get("team")
    if scope == Budget.Scope.TEAM and team not in (None, "") and not Team.objects.filter(slug=team).exists():
        # The ledger names teams by slug: a misspelt one would never count anything.
        errors["team"].append(f"no team {str(team)[:64]}")
    run_id = values.get("training_run_id")
    if scope == Budget.Scope.TRAINING_RUN and run_id not in (None, ""):
        if id_parse(str(run_id)) is None:
            errors["training_run_id"].append(f"a training run's id is a whole number: {str(run_id)[:40]!r}")
        elif subject_exists("training_run", str(run_id)) is False:
            errors["training_run_id"].append(f"no training run #{run_id}")
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
    for address in email_addresses(values.get("email_to") or ""):
        try:
            validate_email(address)
        except FormValidationError:
            errors["email_to"].append(f"{address!r} is not an email address")
    webhook_url = values.get("webhook_url") or ""
    if webhook_url:
        parts = urlsplit(webhook_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            errors["webhook_url"].append("must be an http:// or https:// URL with a host")
        elif parts.username is not None or parts.password is not None:
            errors["webhook_url"].append("must not carry a user name or password")
        elif refusal := url_literal_refusal(webhook_url, policy=PUBLIC_ONLY):
            # Names are resolved and checked when the alert is sent (registry.outbound.guard).
            errors["webhook_url"].append(f"{refusal} (an admin may allow its network)")
    if webhook_url and not has_secret:
        errors["webhook_secret"].append("a webhook needs a secret to sign its requests with")
    return dict(errors)


PLATFORM_SET = "a platform admin set this budget: you may lower its limit only"
# What a platform-set budget binds: changing any of these would let spending through that the
# platform's budget stops (another target, another period, no hard stop, switched off).
_PLATFORM_FIXED = (
    "scope",
    *SPEND_DIMENSIONS,
    "period",
    "custom_start",
    "custom_end",
    "currency",
)


def budget_platform_errors(*, budget: Budget, by_platform: bool) -> dict[str, list[str]]:
    """Why a team-scoped writer may not make this change to a platform-set budget (empty: it may):
    the limit may go down, the alerts may change, nothing else that lets spending through."""
    if by_platform or budget.pk is None:
        return {}
    stored = Budget.objects.filter(pk=budget.pk, platform_set=True).first()
    if stored is None:
        return {}
    errors: dict[str, list[str]] = defaultdict(list)
    if budget.limit_amount is not None and budget.limit_amount > stored.limit_amount:
        errors["limit_amount"].append(f"{PLATFORM_SET} (now {stored.limit_amount} {stored.currency})")
    if stored.hard_limit and not budget.hard_limit:
        errors["hard_limit"].append(PLATFORM_SET)
    if stored.active and not budget.active:
        errors["active"].append(PLATFORM_SET)
    for attname in _PLATFORM_FIXED:
        if getattr(budget, attname) != getattr(stored, attname):
            errors[attname.removesuffix("_id")].append(PLATFORM_SET)
    return dict(errors)


def budget_save(*, budget: Budget, webhook_secret: str | None = None, by_platform: bool = False) -> Budget:
    """Validate and save a budget. `webhook_secret`: a new secret, "" to clear, None to keep.

    `by_platform`: the writer is platform-wide (not scoped to teams); the budget becomes
    platform-set, and later team-scoped writers may only lower it (budget_platform_errors)."""
    has_secret = bool(webhook_secret) if webhook_secret is not None else bool(budget.webhook_secret_encrypted)
    values = {f.name: getattr(budget, f.name) for f in Budget._meta.concrete_fields}
    errors = budget_errors(values=values, has_secret=has_secret)
    for field, problems in budget_platform_errors(budget=budget, by_platform=by_platform).items():
        errors.setdefault(field, []).extend(problems)
    if errors:
        raise BudgetInvalid(errors)
    if by_platform:
        budget.platform_set = True
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


def budget_delete(*, budget: Budget, by_platform: bool) -> None:
    """Delete a budget; a platform-set one only by a platform-wide writer."""
    if budget.platform_set and not by_platform:
        raise BudgetInvalid({"limit_amount": [f"{PLATFORM_SET}; a platform admin may delete it"]})
    budget.delete()
