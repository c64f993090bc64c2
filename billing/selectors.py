"""Reads from price books and the ledger."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

from django.db.models import Max, QuerySet, Sum
from django.db.models.functions import TruncDate

from billing.chain import CHAINED_FIELDS, GENESIS_HASH, chain_hash
from billing.models import DailyRollup, LedgerHead, PriceBook, RollupWatermark, Unit, UsageRecord
from stack.models import Cluster, Deployment, Provider


class PriceResolver:
    """Finds the price version in force for usage; caches each target's versions.

    One lookup (`price_in_force`) or a whole batch of ledger writes share this
    logic: the target-specific price (cluster, else deployment) wins over a
    provider-wide one; among a target's versions, the newest effective_from at
    or before the usage time wins, unless it has ended (effective_to).
    """

    def __init__(self) -> None:
        self._versions: dict[tuple[str, str, int | None], list[PriceBook]] = {}

    def _for(self, unit: str, field: str, target_id: int | None) -> list[PriceBook]:
        key = (unit, field, target_id)
        if key not in self._versions:
            rows = PriceBook.objects.filter(unit=unit, **{field: target_id})
            if field == "provider_id":
                rows = rows.filter(cluster__isnull=True, deployment__isnull=True)
            self._versions[key] = list(rows.order_by("-effective_from", "-version"))
        return self._versions[key]

    @staticmethod
    def _pick(versions: list[PriceBook], at: datetime) -> PriceBook | None:
        for version in versions:
            if version.effective_from <= at:
                if version.effective_to is not None and at >= version.effective_to:
                    return None
                return version
        return None

    def resolve(
        self,
        *,
        unit: Unit | str,
        at: datetime,
        cluster_id: int | None = None,
        deployment_id: int | None = None,
        provider_id: int | None = None,
    ) -> PriceBook | None:
        for field, target_id in (
            ("cluster_id", cluster_id),
            ("deployment_id", deployment_id),
            ("provider_id", provider_id),
        ):
            if target_id is not None:
                found = self._pick(self._for(str(unit), field, target_id), at)
                if found is not None:
                    return found
        return None


def price_in_force(
    *,
    unit: Unit | str,
    at: datetime,
    cluster: Cluster | None = None,
    deployment: Deployment | None = None,
    provider: Provider | None = None,
) -> PriceBook | None:
    """The price version in force at `at` (see PriceResolver for the rules)."""
    return PriceResolver().resolve(
        unit=unit,
        at=at,
        cluster_id=cluster.pk if cluster is not None else None,
        deployment_id=deployment.pk if deployment is not None else None,
        provider_id=provider.pk if provider is not None else None,
    )


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


def spend_per_provider_per_day(*, since_day: date, until_day: date | None = None) -> list[DailySpend]:
    """Exact spend per (UTC day, provider, currency) from since_day up to until_day (exclusive).

    Reads the daily rollups plus the ledger rows not folded into them yet (the
    tail after the rollup watermark, small), so it stays fast on a large ledger
    and still shows a job billed a second ago.
    """
    totals: dict[tuple[date, str, str], Decimal] = {}

    def add(rows: Any) -> None:
        for row in rows:
            key = (row["day"], row["provider__slug"] or "(none)", row["currency"])
            totals[key] = totals.get(key, Decimal("0")) + row["total"]

    rollups = DailyRollup.objects.filter(day__gte=since_day)
    tail = UsageRecord.objects.filter(
        partition="main",
        sequence__gt=rollup_watermark(partition="main"),
        occurred_at__gte=datetime.combine(since_day, time.min, tzinfo=UTC),
    )
    if until_day is not None:
        rollups = rollups.filter(day__lt=until_day)
        tail = tail.filter(occurred_at__lt=datetime.combine(until_day, time.min, tzinfo=UTC))
    add(rollups.values("day", "provider__slug", "currency").annotate(total=Sum("amount")).order_by())
    add(
        tail.annotate(day=TruncDate("occurred_at", tzinfo=UTC))
        .values("day", "provider__slug", "currency")
        .annotate(total=Sum("amount"))
        .order_by()
    )
    return [
        DailySpend(day=day, provider=provider, currency=currency, amount=amount)
        for (day, provider, currency), amount in sorted(totals.items())
    ]


def rollup_watermark(*, partition: str) -> int:
    """The last ledger sequence already counted in DailyRollup."""
    mark = RollupWatermark.objects.filter(partition=partition).first()
    return mark.last_sequence if mark is not None else 0


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


@dataclass(frozen=True)
class LedgerVerification:
    partition: str
    rows_checked: int
    ok: bool
    first_bad_id: int | None = None
    first_bad_sequence: int | None = None
    problem: str = ""


def ledger_verify(*, partition: str = "main", chunk_size: int = 5000) -> LedgerVerification:
    """Walk a partition's hash chain; report the first row that does not match.

    Catches a row changed behind the ORM's back (its hash no longer matches its
    fields), a deleted row (a gap in the sequence) and an inserted or reordered
    row (prev_hash does not match the row before), and a chain cut short (the
    head says more rows were written than exist).
    """
    columns = ("id", "sequence", "prev_hash", "row_hash", *CHAINED_FIELDS)
    rows = (
        UsageRecord.objects.filter(partition=partition)
        .order_by("sequence")
        .values_list(*columns)
        .iterator(chunk_size=chunk_size)
    )
    expected_sequence, prev = 1, GENESIS_HASH
    checked = 0

    def bad(row_id: int, sequence: int, problem: str) -> LedgerVerification:
        return LedgerVerification(partition, checked, False, row_id, sequence, problem)

    for values in rows:
        row = dict(zip(columns, values, strict=True))
        if row["sequence"] != expected_sequence:
            return bad(
                row["id"],
                row["sequence"],
                f"sequence {expected_sequence} is missing (found {row['sequence']}): a row was removed",
            )
        if row["prev_hash"] != prev:
            return bad(row["id"], row["sequence"], "prev_hash does not match the previous row's hash")
        if chain_hash(row, prev) != row["row_hash"]:
            return bad(
                row["id"], row["sequence"], "the row's fields no longer match its hash: it was changed"
            )
        prev = row["row_hash"]
        expected_sequence += 1
        checked += 1
    head = LedgerHead.objects.filter(partition=partition).first()
    if head is not None and (head.last_sequence, head.last_hash) != (checked, prev):
        return LedgerVerification(
            partition,
            checked,
            False,
            None,
            head.last_sequence,
            f"the chain ends at sequence {checked} but its head records {head.last_sequence}: rows are missing",
        )
    return LedgerVerification(partition, checked, True)
