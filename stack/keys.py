"""Issuing an API key with its own money budget: a registry token and a billing budget, made in
one transaction (the composition layer: the registry knows no budgets, billing makes no keys).

The key's limits (rpm/tpm, expiry, team, workflows) are the registry's (api_token_create); its
budget is a Budget of scope "api_key", counted from the ledger rows that name the key and, when
hard, refused on /v1, batch jobs and eval runs (billing.budgets.budget_admit via the router).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.contrib.auth.models import User
from django.db import transaction

from billing.budgets import BudgetInvalid, budget_save
from billing.models import Budget
from registry.errors import MultiFieldError
from registry.models import ApiToken, Team, Workflow
from registry.services import api_token_create


@dataclass(frozen=True)
class KeyBudget:
    """A key's own budget: `limit_amount` per `period`; `hard` refuses spending past it (402)."""

    limit_amount: Decimal
    period: str = Budget.Period.MONTHLY
    hard: bool = True
    currency: str = "USD"
    thresholds: tuple[int, ...] = (80, 100)


@dataclass(frozen=True)
class IssuedKey:
    token: ApiToken
    secret: str  # shown once, never stored
    budget: Budget | None


def api_key_issue(
    *,
    user: User,
    name: str,
    team: Team | None = None,
    workflows: Sequence[Workflow] = (),
    rpm_limit: int | None = None,
    tpm_limit: int | None = None,
    rate_limit_fail_closed: bool = False,
    expires_at: datetime | None = None,
    budget: KeyBudget | None = None,
) -> IssuedKey:
    """Create a key (registry.services.api_token_create checks who may) and, with
    `budget`, its budget; nothing is made when either is refused (MultiFieldError / RegistryError
    naming the field: budget fields as `budget_<name>`)."""
    with transaction.atomic():
        token, secret = api_token_create(
            user=user,
            name=name,
            team=team,
            workflows=workflows,
            rpm_limit=rpm_limit,
            tpm_limit=tpm_limit,
            rate_limit_fail_closed=rate_limit_fail_closed,
            expires_at=expires_at,
        )
        saved = None
        if budget is not None:
            if budget.limit_amount is None or budget.limit_amount < 0:
                raise MultiFieldError({"budget_limit_amount": ["a budget is a non-negative amount"]})
            row = Budget(
                # Unique names: the prefix is unique, the key's name need not be.
                name=f"key {token.prefix} ({token.name})"[:100],
                scope=Budget.Scope.API_KEY,
                api_key=token,
                period=budget.period,
                limit_amount=budget.limit_amount,
                currency=budget.currency,
                hard_limit=budget.hard,
                thresholds=list(budget.thresholds),
            )
            try:
                saved = budget_save(budget=row)
            except BudgetInvalid as exc:
                raise MultiFieldError({f"budget_{k}": v for k, v in exc.errors.items()}) from exc
    return IssuedKey(token=token, secret=secret, budget=saved)
