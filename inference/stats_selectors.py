"""Reads for the inference pages: per-deployment latency, error rate, spend, quality and price.

Figures come from the recorded attempts (inference.InferenceAttempt), so they describe what was
called, including failed calls that the request recovered from by failing over. Percentiles are
computed in Python over a bounded number of recent rows so that the same code runs on PostgreSQL
and SQLite (the demo).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import Avg, Count, Q, QuerySet, Sum
from django.utils import timezone

from billing.selectors import PriceResolver
from billing.selfhosted import self_hosted_cost
from inference.breaker.breakers import breaker_state
from inference.models import InferenceAttempt, InferenceRequest, QualityRecord
from inference.router.policy import blended_price
from inference.selectors import deployment_quality_mean, deployment_token_prices
from registry.models import Deployment, FailoverEvent, Provider, Workflow

STATS_DAYS = 7
LATENCY_SAMPLE = 2000  # most recent successful calls per deployment used for p50/p95
Outcome = InferenceAttempt.Outcome
# Outcomes that mean the deployment was actually called (skips never reached it).
CALLED = (Outcome.OK, Outcome.RETRYABLE, Outcome.NON_RETRYABLE)
FAILED = (Outcome.RETRYABLE, Outcome.NON_RETRYABLE)


@dataclass(frozen=True)
class DeploymentPrice:
    """What a deployment costs per 1M tokens, to set cloud and self-hosted side by side."""

    per_1m_input: Decimal | None
    per_1m_output: Decimal | None
    currency: str
    self_hosted: bool  # per_1m_* are then the amortised hosting cost (billing.selfhosted)
    # Self-hosted deployments of a model trained here: the same with its training cost spread
    # over SELF_HOSTED_AMORTISE_MONTHS at the volume served (None otherwise).
    per_1m_amortised: Decimal | None = None
    amortise_months: int | None = None


def deployment_price_per_1m(*, deployment: Deployment, since_day: date | None = None) -> DeploymentPrice:
    """Cloud deployments: the token prices in force. Self-hosted ones (hosting_cluster set): the
    hosting cluster's accelerator-hours over the tokens served, from billing.selfhosted (never
    computed here); None until it has served a token."""
    if deployment.hosting_cluster_id is not None:
        since = since_day or (timezone.now() - timedelta(days=30)).date()
        figure = self_hosted_cost(
            deployment=deployment, since_day=since, horizon_months=settings.SELF_HOSTED_AMORTISE_MONTHS
        )[0]
        return DeploymentPrice(
            figure.per_1m_tokens,
            figure.per_1m_tokens,
            figure.currency,
            True,
            per_1m_amortised=figure.per_1m_amortised,
            amortise_months=figure.horizon_months,
        )
    found = deployment_token_prices(deployment=deployment, at=timezone.now(), prices=PriceResolver())
    return DeploymentPrice(found.input, found.output, found.currency, False)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (the 'linear' method of Hyndman & Fan 1996, type 7)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass
class DeploymentStats:
    deployment: Deployment
    price: DeploymentPrice
    quality: float | None
    p50_ms: float | None
    p95_ms: float | None
    calls: int
    failures: int
    circuit: str
    spend: dict[str, Decimal] = field(default_factory=dict)
    on_frontier: bool = False

    @property
    def error_rate(self) -> float | None:
        return self.failures / self.calls if self.calls else None

    @property
    def blended_per_1m(self) -> Decimal | None:
        """$/1M tokens with output weighted 3:1, as the cheapest strategy ranks them."""
        return blended_price(self.price.per_1m_input, self.price.per_1m_output)


def _attempts(teams: frozenset[int] | None) -> QuerySet[InferenceAttempt]:
    """Attempts of requests to `teams`' workflows (team ids; None: every request)."""
    rows = InferenceAttempt.objects.all()
    return rows if teams is None else rows.filter(request__workflow__team__in=teams)


def _latencies(
    deployment_ids: Iterable[int], since: datetime, teams: frozenset[int] | None = None
) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for pk in deployment_ids:
        out[pk] = list(
            _attempts(teams)
            .filter(deployment_id=pk, outcome=Outcome.OK, request__created_at__gte=since)
            .order_by("-id")
            .values_list("latency_ms", flat=True)[:LATENCY_SAMPLE]
        )
    return out


def _calls(
    deployments: Sequence[Deployment], since: datetime, teams: frozenset[int] | None = None
) -> dict[int, tuple[int, int]]:
    rows = (
        _attempts(teams)
        .filter(deployment__in=deployments, outcome__in=CALLED, request__created_at__gte=since)
        .values("deployment_id")
        .annotate(calls=Count("id"), failures=Count("id", filter=Q(outcome__in=FAILED)))
    )
    return {r["deployment_id"]: (r["calls"], r["failures"]) for r in rows}


def _spend(
    deployments: Sequence[Deployment], since: datetime, teams: frozenset[int] | None = None
) -> dict[int, dict[str, Decimal]]:
    rows = (
        _attempts(teams)
        .filter(deployment__in=deployments, request__created_at__gte=since)
        .values("deployment_id", "request__currency")
        .annotate(total=Sum("cost"))
    )
    out: dict[int, dict[str, Decimal]] = defaultdict(dict)
    for r in rows:
        if r["total"]:
            out[r["deployment_id"]][r["request__currency"]] = r["total"]
    return out


def pareto_frontier(points: Sequence[tuple[Decimal, float]]) -> list[bool]:
    """Which (cost, quality) points no other point dominates (no dearer and no worse, one of
    them strictly): the cost-versus-quality trade-offs worth choosing."""
    flags = []
    for i, (cost, quality) in enumerate(points):
        dominated = any(
            j != i and c <= cost and q >= quality and (c < cost or q > quality)
            for j, (c, q) in enumerate(points)
        )
        flags.append(not dominated)
    return flags


def deployment_stats(
    *,
    deployments: Sequence[Deployment] | None = None,
    days: int = STATS_DAYS,
    teams: frozenset[int] | None = None,
) -> list[DeploymentStats]:
    """One row per deployment over the last `days`, with the Pareto flag set among those that
    have both a price and a quality. Calls, latencies and spend count `teams`' requests only
    (team ids; None: every request); price and quality are the shared deployment's own."""
    since = timezone.now() - timedelta(days=days)
    if deployments is None:
        deployments = list(
            Deployment.objects.select_related("provider", "model", "hosting_cluster").order_by("slug")
        )
    ids = [d.pk for d in deployments]
    latencies = _latencies(ids, since, teams)
    calls = _calls(deployments, since, teams)
    spend = _spend(deployments, since, teams)
    stats = []
    for d in deployments:
        lat = latencies.get(d.pk, [])
        n, failed = calls.get(d.pk, (0, 0))
        stats.append(
            DeploymentStats(
                deployment=d,
                price=deployment_price_per_1m(deployment=d, since_day=since.date()),
                quality=deployment_quality_mean(deployment=d, since=since),
                p50_ms=percentile(lat, 0.5),
                p95_ms=percentile(lat, 0.95),
                calls=n,
                failures=failed,
                circuit=breaker_state(d.pk),
                spend=spend.get(d.pk, {}),
            )
        )
    plotted = [s for s in stats if s.blended_per_1m is not None and s.quality is not None]
    flags = pareto_frontier([(s.blended_per_1m, s.quality) for s in plotted])  # type: ignore[misc]
    for s, flag in zip(plotted, flags, strict=True):
        s.on_frontier = flag
    return stats


@dataclass
class LatencySummary:
    p50_ms: float | None
    p95_ms: float | None
    requests: int
    failed: int


def workflow_latency(*, workflow: Workflow, days: int = STATS_DAYS) -> LatencySummary:
    since = timezone.now() - timedelta(days=days)
    rows = InferenceRequest.objects.filter(workflow=workflow, created_at__gte=since)
    lat = list(
        rows.filter(status=InferenceRequest.Status.SUCCEEDED)
        .order_by("-id")
        .values_list("latency_ms", flat=True)[:LATENCY_SAMPLE]
    )
    counts = rows.aggregate(
        n=Count("id"), failed=Count("id", filter=Q(status=InferenceRequest.Status.FAILED))
    )
    return LatencySummary(percentile(lat, 0.5), percentile(lat, 0.95), counts["n"], counts["failed"])


def workflow_failovers(*, workflow: Workflow, limit: int = 50) -> list[FailoverEvent]:
    """Inference failover events of this workflow (the recorder keeps its slug in details)."""
    return list(
        FailoverEvent.objects.filter(kind=FailoverEvent.Kind.INFERENCE, details__workflow=workflow.slug)
        .select_related("from_deployment", "to_deployment")
        .order_by("-detected_at")[:limit]
    )


def provider_deployment_stats(
    *, provider: Provider, days: int = STATS_DAYS, teams: frozenset[int] | None = None
) -> list[DeploymentStats]:
    deployments = list(
        Deployment.objects.filter(provider=provider)
        .select_related("provider", "model", "hosting_cluster")
        .order_by("slug")
    )
    return deployment_stats(deployments=deployments, days=days, teams=teams)


@dataclass
class ProviderTotals:
    calls: int
    failures: int
    spend: dict[str, Decimal]

    @property
    def error_rate(self) -> float | None:
        return self.failures / self.calls if self.calls else None


def provider_totals(stats: Sequence[DeploymentStats]) -> ProviderTotals:
    spend: dict[str, Decimal] = defaultdict(Decimal)
    for s in stats:
        for currency, amount in s.spend.items():
            spend[currency] += amount
    return ProviderTotals(
        calls=sum(s.calls for s in stats), failures=sum(s.failures for s in stats), spend=dict(spend)
    )


def deployment_quality_means(since: datetime) -> dict[int, tuple[float, int]]:
    """Every deployment's mean quality score since `since` and how many scores it rests on (the
    billing dashboard's cost per quality point reads this through billing.quality)."""
    rows = (
        QualityRecord.objects.filter(created_at__gte=since)
        .values("deployment_id")
        .annotate(mean=Avg("score"), count=Count("pk"))
        .order_by()
    )
    return {row["deployment_id"]: (float(row["mean"]), row["count"]) for row in rows}
