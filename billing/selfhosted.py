"""What a self-hosted deployment costs per token: the one place that computes it.

A deployment served from one of our clusters (Deployment.hosting_cluster) is
billed for the accelerator-hours its server holds, as ledger rows of unit
accelerator_hour carrying the deployment; the tokens it serves are ledger rows
of the token units on the same deployment (priced at zero when there is no
per-token price). Its effective price is

    cost per 1M tokens = accelerator-hour spend / tokens served (in millions)

over the same period, so ops teams can set it beside cloud providers' token
prices. The inference gateway shows this figure; it must not compute its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import ROUND_HALF_EVEN, Decimal

from django.utils import timezone

from billing.amortisation import MILLION, PER_1M, amortised_per_1m
from billing.models import Unit
from billing.selectors import spend_grouped
from registry.models import Deployment

DAYS_PER_MONTH = 30
TOKEN_UNITS = (
    Unit.INPUT_TOKENS_1M,
    Unit.OUTPUT_TOKENS_1M,
    Unit.CACHED_INPUT_TOKENS_1M,
    Unit.CACHE_WRITE_TOKENS_1M,
    Unit.REASONING_TOKENS_1M,
    Unit.BATCH_INPUT_TOKENS_1M,
    Unit.BATCH_OUTPUT_TOKENS_1M,
)


@dataclass(frozen=True)
class SelfHostedCost:
    deployment: str
    currency: str
    accelerator_cost: Decimal
    tokens_millions: Decimal
    per_1m_tokens: Decimal | None  # None until it has served a token
    # With the model's training cost spread over `horizon_months` at the volume this window
    # served (billing.amortisation); None for a model with no training cost (not trained here)
    # or no tokens, or when no horizon was asked for.
    per_1m_amortised: Decimal | None = None
    horizon_months: int | None = None


def self_hosted_cost(
    *,
    deployment: Deployment,
    since_day: date,
    until_day: date | None = None,
    horizon_months: int | None = None,
    today: date | None = None,
) -> list[SelfHostedCost]:
    """One figure per currency of the hosting spend (normally one).

    With `horizon_months`, a deployment of a model trained here (RegisteredModel.training_cost,
    in the hosting currency) also gets the amortised figure: the window's tokens scaled to a
    month (30 days) are the volume the training cost is spread over."""
    hosting = spend_grouped(
        by=("unit", "currency"), since_day=since_day, until_day=until_day, deployment_id=deployment.pk
    )
    served = spend_grouped(
        by=("unit",),
        measure="quantity",
        since_day=since_day,
        until_day=until_day,
        deployment_id=deployment.pk,
    )
    tokens = sum((served.get((unit.value,), Decimal("0")) for unit in TOKEN_UNITS), start=Decimal("0"))
    costs = {
        currency: amount for (unit, currency), amount in hosting.items() if unit == Unit.ACCELERATOR_HOUR
    } or {"USD": Decimal("0")}
    days = ((until_day or today or timezone.now().date()) - since_day).days + 1
    monthly_tokens = tokens * MILLION * Decimal(DAYS_PER_MONTH) / Decimal(max(days, 1))
    model = deployment.model
    figures = []
    for currency, cost in sorted(costs.items()):
        per_1m = (cost / tokens).quantize(PER_1M, rounding=ROUND_HALF_EVEN) if tokens > 0 else None
        amortised = None
        if (
            horizon_months
            and per_1m is not None
            and model.training_cost
            and model.produced_by_run_id is not None
            and currency == "USD"  # training runs bill in their config's currency, USD by default
        ):
            amortised = amortised_per_1m(
                hosting_per_1m=per_1m,
                training_cost=model.training_cost,
                horizon_months=horizon_months,
                volume_tokens_per_month=monthly_tokens,
            )
        figures.append(
            SelfHostedCost(
                deployment=deployment.slug,
                currency=currency,
                accelerator_cost=cost,
                tokens_millions=tokens,
                per_1m_tokens=per_1m,
                per_1m_amortised=amortised,
                horizon_months=horizon_months if amortised is not None else None,
            )
        )
    return figures
