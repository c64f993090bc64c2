"""Cost per quality point: what a deployment's answers cost per 1M output tokens, from the
ledger, divided by its mean quality score in points (0-100).

The scores are the inference app's (eval sets and feedback), and inference sits above billing:
it registers where its scores come from when it loads (`quality_source_register`, in its
AppConfig.ready), so billing reads them without importing inference, as the store's key owners
do (registry.store.keys).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal

from billing.models import Unit
from billing.selectors import spend_grouped
from billing.selfhosted import self_hosted_cost
from registry.models import Deployment

HUNDRED = Decimal(100)

# since -> {deployment id: (mean score in [0, 1], number of scores)}
QualitySource = Callable[[datetime], dict[int, tuple[float, int]]]
_SOURCE: list[QualitySource] = []


def quality_source_register(source: QualitySource) -> None:
    """Register where quality scores come from (idempotent: the last wins)."""
    _SOURCE[:] = [source]


@dataclass(frozen=True)
class QualityCost:
    deployment: str
    score_points: Decimal  # mean score x 100
    scores: int
    per_1m_output: Decimal | None  # what 1M output tokens cost, every unit of the deployment included
    currency: str
    per_point: Decimal | None  # per_1m_output / score_points
    basis: str  # where per_1m_output comes from, or why it is missing


def cost_per_quality_point(*, since_day: date, teams: frozenset[str] | None) -> list[QualityCost]:
    """Per deployment with quality scores since `since_day`: its cost per 1M output tokens over
    the same days (cloud: the ledger's spend on the deployment over the output tokens it billed;
    self-hosted: its cluster's accelerator-hours over the tokens it served) and that cost per
    quality point. Cheapest per point first; a deployment without a cost figure comes last."""
    if not _SOURCE:
        return []
    means = _SOURCE[0](datetime.combine(since_day, time.min, tzinfo=UTC))
    if not means:
        return []
    spend = spend_grouped(by=("deployment_id", "currency"), since_day=since_day, teams=teams)
    tokens = spend_grouped(
        by=("deployment_id",),
        since_day=since_day,
        teams=teams,
        measure="quantity",
        unit=Unit.OUTPUT_TOKENS_1M,
    )
    rows = []
    for deployment in (
        Deployment.objects.filter(pk__in=means).select_related("hosting_cluster").order_by("slug")
    ):
        mean, count = means[deployment.pk]
        points = (Decimal(str(mean)) * HUNDRED).quantize(Decimal("0.1"))
        per_1m, currency, basis = _per_1m_output(deployment, since_day, spend, tokens)
        per_point = per_1m / points if per_1m is not None and points > 0 else None
        rows.append(QualityCost(deployment.slug, points, count, per_1m, currency, per_point, basis))
    return sorted(rows, key=lambda r: (r.per_point is None, r.per_point or 0, r.deployment))


def _per_1m_output(
    deployment: Deployment,
    since_day: date,
    spend: dict[tuple[object, ...], Decimal],
    tokens: dict[tuple[object, ...], Decimal],
) -> tuple[Decimal | None, str, str]:
    if deployment.hosting_cluster_id is not None:
        for cost in self_hosted_cost(deployment=deployment, since_day=since_day):
            if cost.per_1m_tokens is not None:
                return cost.per_1m_tokens, cost.currency, f"self-hosted on {deployment.hosting_cluster}"
        return None, "", "no tokens served yet"
    billed = [(str(currency), amount) for (pk, currency), amount in spend.items() if pk == deployment.pk]
    output = tokens.get((deployment.pk,), Decimal(0))
    if len(billed) != 1:
        return None, "", "no spend yet" if not billed else "spend in several currencies"
    if output <= 0:
        return None, "", "no output tokens billed yet"
    currency, amount = billed[0]
    return amount / output, currency, "ledger"
