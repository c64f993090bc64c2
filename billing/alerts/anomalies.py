"""Spend anomalies per provider, workflow and cluster: today's spend rate against a robust
baseline of the trailing weeks, read from the daily rollups (never the raw ledger).

The method. The baseline is the daily totals of the trailing BASELINE_DAYS (28) days, days
without spend counted as 0. Its centre is the median and its spread the median absolute
deviation (MAD): both ignore a few extreme days, where a mean and standard deviation would be
dragged along by the very spikes we look for. Today's value is the spend so far projected to a
whole day (the elapsed fraction of the UTC day, at least MIN_ELAPSED_HOURS so that the first
minutes do not extrapolate wildly). It fires when that rate exceeds

    median + K * max(1.4826 * MAD, MIN_RELATIVE_SPREAD * median)

with K = 3.5: the modified z-score test of Iglewicz and Hoaglin ("How to Detect and Handle
Outliers", ASQC 1993), z = 0.6745 (x - median) / MAD > 3.5, where 1.4826 = 1 / 0.6745 makes the
MAD estimate the standard deviation of normally distributed data. The spread floor keeps a
perfectly flat history (MAD = 0) from calling every cent above it an anomaly, and the rate must
also exceed the median by ANOMALY_MIN_AMOUNT. A target needs MIN_HISTORY_DAYS days with spend
in the window before it is judged at all.

One anomaly per target, day and currency (a unique constraint), so the detector may run every
few minutes and a spike raises one alert.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.urls import reverse

from billing.alerts.raising import AlertMessage, alert_raise
from billing.models import AlertKind, DailyRollup, SpendAnomaly
from registry.models import Cluster, Provider, Workflow

BASELINE_DAYS = 28
MIN_HISTORY_DAYS = 7
MIN_ELAPSED_HOURS = 3
K = Decimal("3.5")
MAD_TO_SIGMA = Decimal("1.4826")
MIN_RELATIVE_SPREAD = Decimal("0.1")
ZERO = Decimal(0)

DIMENSION_FIELD: dict[str, str] = {
    SpendAnomaly.Dimension.PROVIDER: "provider_id",
    SpendAnomaly.Dimension.WORKFLOW: "workflow_id",
    SpendAnomaly.Dimension.CLUSTER: "cluster_id",
}
DIMENSION_MODEL: dict[str, type[Provider] | type[Workflow] | type[Cluster]] = {
    SpendAnomaly.Dimension.PROVIDER: Provider,
    SpendAnomaly.Dimension.WORKFLOW: Workflow,
    SpendAnomaly.Dimension.CLUSTER: Cluster,
}


def median(values: list[Decimal]) -> Decimal:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return ZERO
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@dataclass(frozen=True)
class Verdict:
    rate: Decimal
    median: Decimal
    mad: Decimal
    threshold: Decimal

    @property
    def fires(self) -> bool:
        return self.rate > self.threshold and self.rate - self.median >= settings.ANOMALY_MIN_AMOUNT


def anomaly_verdict(*, spent_so_far: Decimal, elapsed_fraction: Decimal, baseline: list[Decimal]) -> Verdict:
    """Today's projected rate and the baseline's median, MAD and threshold (see the module doc)."""
    floor = Decimal(MIN_ELAPSED_HOURS) / 24
    rate = spent_so_far / max(elapsed_fraction, floor)
    centre = median(baseline)
    mad = median([abs(v - centre) for v in baseline])
    spread = max(MAD_TO_SIGMA * mad, MIN_RELATIVE_SPREAD * centre)
    return Verdict(rate=rate, median=centre, mad=mad, threshold=centre + K * spread)


def _elapsed_fraction(now: datetime) -> Decimal:
    midnight = datetime.combine(now.date(), datetime.min.time(), tzinfo=UTC)
    return Decimal((now - midnight).total_seconds()) / Decimal(86400)


def _daily_totals(dimension: str, first: date, today: date) -> dict[tuple[int, str], dict[date, Decimal]]:
    """{(target id, currency): {day: total}} from the rollups, summed over their other dimensions."""
    field = DIMENSION_FIELD[dimension]
    rows = (
        DailyRollup.objects.filter(day__gte=first, day__lte=today, **{f"{field}__isnull": False})
        .values(field, "day", "currency")
        .annotate(total=Sum("amount"))
        .order_by()
    )
    out: dict[tuple[int, str], dict[date, Decimal]] = defaultdict(dict)
    for row in rows:
        out[(row[field], row["currency"])][row["day"]] = row["total"]
    return out


def spend_anomalies_detect(*, now: datetime) -> list[SpendAnomaly]:
    """Judge today's spend of every provider, workflow and cluster; returns the new anomalies
    (each raised as an alert once)."""
    now = now.astimezone(UTC)
    today = now.date()
    first = today - timedelta(days=BASELINE_DAYS)
    elapsed = _elapsed_fraction(now)
    found: list[SpendAnomaly] = []
    for dimension in DIMENSION_FIELD:
        for (target_id, currency), days in _daily_totals(dimension, first, today).items():
            spent = days.get(today, ZERO)
            if spent <= 0:
                continue
            baseline_days = [first + timedelta(days=i) for i in range(BASELINE_DAYS)]
            baseline = [days.get(d, ZERO) for d in baseline_days]
            if sum(1 for v in baseline if v > 0) < MIN_HISTORY_DAYS:
                continue  # too little history to call anything unusual
            verdict = anomaly_verdict(spent_so_far=spent, elapsed_fraction=elapsed, baseline=baseline)
            if not verdict.fires:
                continue
            anomaly = _record(
                dimension, target_id, currency, today, spent, verdict, baseline_days, baseline, now
            )
            if anomaly is not None:
                found.append(anomaly)
    return found


def _record(
    dimension: str,
    target_id: int,
    currency: str,
    today: date,
    spent: Decimal,
    verdict: Verdict,
    baseline_days: list[date],
    baseline: list[Decimal],
    now: datetime,
) -> SpendAnomaly | None:
    target = DIMENSION_MODEL[dimension].objects.filter(pk=target_id).first()
    label = getattr(target, "slug", str(target_id))
    try:
        with transaction.atomic():
            anomaly = SpendAnomaly.objects.create(
                dimension=dimension,
                target_id=target_id,
                target_label=label,
                day=today,
                currency=currency,
                spent_so_far=spent,
                rate=verdict.rate.quantize(Decimal("0.000000001")),
                median=verdict.median.quantize(Decimal("0.000000001")),
                mad=verdict.mad.quantize(Decimal("0.000000001")),
                threshold=verdict.threshold.quantize(Decimal("0.000000001")),
                baseline=[[d.isoformat(), str(v)] for d, v in zip(baseline_days, baseline, strict=True)],
                detected_at=now,
            )
            alert_raise(
                kind=AlertKind.ANOMALY,
                dedup_key=f"anomaly:{dimension}:{target_id}:{currency}",
                message=anomaly_message(anomaly),
                now=now,
            )
    except IntegrityError:
        return None  # already found today (another run of the detector got there first)
    return anomaly


def _money(value: Decimal, currency: str) -> str:
    return f"{value.quantize(Decimal('0.01'))} {currency}"


def anomaly_message(anomaly: SpendAnomaly) -> AlertMessage:
    dim = anomaly.get_dimension_display().lower()
    return AlertMessage(
        title=f"Spend anomaly: {dim} {anomaly.target_label}",
        text=(
            f"Today's spend rate on {dim} {anomaly.target_label} is "
            f"{_money(anomaly.rate, anomaly.currency)}/day, above its threshold of "
            f"{_money(anomaly.threshold, anomaly.currency)}/day (median of the last {BASELINE_DAYS} days "
            f"+ {K} robust deviations)."
        ),
        facts=[
            ("Today so far", _money(anomaly.spent_so_far, anomaly.currency)),
            ("Projected rate", f"{_money(anomaly.rate, anomaly.currency)}/day"),
            ("Baseline median", f"{_money(anomaly.median, anomaly.currency)}/day"),
            ("MAD", _money(anomaly.mad, anomaly.currency)),
            ("Threshold", f"{_money(anomaly.threshold, anomaly.currency)}/day"),
        ],
        path=reverse("billing-anomaly", args=[anomaly.pk]),
    )
