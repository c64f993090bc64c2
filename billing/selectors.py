"""Reads from price books and the ledger."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

from django.db.models import Max, QuerySet, Sum
from django.db.models.functions import TruncDate

from billing.models import PriceBook, Unit, UsageRecord
from stack.models import Cluster, Deployment, Provider


def price_in_force(
    *,
    unit: Unit | str,
    at: datetime,
    cluster: Cluster | None = None,
    deployment: Deployment | None = None,
    provider: Provider | None = None,
) -> PriceBook | None:
    """The newest price version effective at `at`: target-specific first, then provider-wide."""
    base = PriceBook.objects.filter(unit=unit, effective_from__lte=at).order_by("-effective_from", "-version")
    if cluster is not None:
        found = base.filter(cluster=cluster).first()
        if found is not None:
            return found
    if deployment is not None:
        found = base.filter(deployment=deployment).first()
        if found is not None:
            return found
    if provider is not None:
        return base.filter(provider=provider, cluster__isnull=True, deployment__isnull=True).first()
    return None


def price_book_next_version(
    *,
    unit: Unit | str,
    cluster: Cluster | None = None,
    deployment: Deployment | None = None,
    provider: Provider | None = None,
) -> int:
    """The version number the next price for this (target, unit) gets."""
    if cluster is not None or deployment is not None:
        provider = None  # provider-wide prices are those with no narrower target
    latest = PriceBook.objects.filter(
        cluster=cluster, deployment=deployment, provider=provider, unit=unit
    ).aggregate(m=Max("version"))["m"]
    return (latest or 0) + 1


@dataclass(frozen=True)
class DailySpend:
    day: date
    provider: str
    currency: str
    amount: Decimal


def spend_per_provider_per_day(*, since: datetime, until: datetime | None = None) -> list[DailySpend]:
    rows = UsageRecord.objects.filter(occurred_at__gte=since)
    if until is not None:
        rows = rows.filter(occurred_at__lt=until)
    grouped = (
        rows.annotate(day=TruncDate("occurred_at", tzinfo=UTC))
        .values("day", "provider__slug", "currency")
        .annotate(total=Sum("amount"))
        .order_by("day", "provider__slug")
    )
    return [
        DailySpend(
            day=row["day"],
            provider=row["provider__slug"] or "(none)",
            currency=row["currency"],
            amount=row["total"] or Decimal("0"),
        )
        for row in grouped
    ]


def spend_total(*, subject_type: str | None = None, subject_id: str | None = None) -> Decimal:
    rows = UsageRecord.objects.all()
    if subject_type is not None:
        rows = rows.filter(subject_type=subject_type)
    if subject_id is not None:
        rows = rows.filter(subject_id=subject_id)
    return rows.aggregate(total=Sum("amount"))["total"] or Decimal("0")


def usage_for_subject(*, subject_type: str, subject_id: str) -> QuerySet[UsageRecord]:
    return UsageRecord.objects.filter(subject_type=subject_type, subject_id=subject_id).select_related(
        "price_book", "cluster"
    )


__all__ = ["price_in_force", "spend_per_provider_per_day", "spend_total", "usage_for_subject"]
