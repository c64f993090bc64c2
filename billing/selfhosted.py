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

from billing.models import Unit
from billing.selectors import spend_grouped
from stack.registry.models import Deployment

TOKEN_UNITS = (
    Unit.INPUT_TOKENS_1M,
    Unit.OUTPUT_TOKENS_1M,
    Unit.CACHED_INPUT_TOKENS_1M,
    Unit.REASONING_TOKENS_1M,
)


@dataclass(frozen=True)
class SelfHostedCost:
    deployment: str
    currency: str
    accelerator_cost: Decimal
    tokens_millions: Decimal
    per_1m_tokens: Decimal | None  # None until it has served a token


def self_hosted_cost(
    *, deployment: Deployment, since_day: date, until_day: date | None = None
) -> list[SelfHostedCost]:
    """One figure per currency of the hosting spend (normally one)."""
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
    return [
        SelfHostedCost(
            deployment=deployment.slug,
            currency=currency,
            accelerator_cost=cost,
            tokens_millions=tokens,
            per_1m_tokens=(cost / tokens).quantize(Decimal("0.000001"), rounding=ROUND_HALF_EVEN)
            if tokens > 0
            else None,
        )
        for currency, cost in sorted(costs.items())
    ]
