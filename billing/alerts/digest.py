"""The daily spend digest: per team (the ledger's `team` value), yesterday's spend from the
rollups, per currency, with its largest workflows and providers and the change from the day
before. Raised once per team and day, whenever beat runs it again."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.db.models import Sum
from django.urls import reverse

from billing.alerts.raising import AlertMessage, alert_raise
from billing.models import AlertDelivery, AlertKind, DailyRollup
from registry.models import Provider, Workflow

TOP = 3
NO_TEAM = "(no team)"


def _money(value: Decimal, currency: str) -> str:
    return f"{value.quantize(Decimal('0.01'))} {currency}"


def _totals(day: date) -> dict[tuple[str, str], Decimal]:
    rows = (
        DailyRollup.objects.filter(day=day)
        .values("team", "currency")
        .annotate(total=Sum("amount"))
        .order_by()
    )
    return {(r["team"], r["currency"]): r["total"] for r in rows}


def _top(day: date, team: str, currency: str, field: str) -> list[tuple[int, Decimal]]:
    rows = (
        DailyRollup.objects.filter(day=day, team=team, currency=currency, **{f"{field}__isnull": False})
        .values(field)
        .annotate(total=Sum("amount"))
        .order_by("-total")[:TOP]
    )
    return [(r[field], r["total"]) for r in rows]


def spend_digest_message(*, team: str, day: date) -> AlertMessage | None:
    """The digest of one team's spend on `day`; None when it spent nothing."""
    today, before = _totals(day), _totals(day - timedelta(days=1))
    currencies = sorted(c for t, c in today if t == team)
    if not currencies:
        return None
    facts: list[tuple[str, str]] = []
    workflows = dict(Workflow.objects.values_list("pk", "slug"))
    providers = dict(Provider.objects.values_list("pk", "slug"))
    for currency in currencies:
        total = today[(team, currency)]
        previous = before.get((team, currency), Decimal(0))
        change = (
            f" ({'+' if total >= previous else ''}{_money(total - previous, currency)} on the day before)"
        )
        facts.append((f"Total {currency}", _money(total, currency) + change))
        for label, field, names in (
            ("workflows", "workflow_id", workflows),
            ("providers", "provider_id", providers),
        ):
            top = _top(day, team, currency, field)
            if top:
                facts.append(
                    (f"Top {label}", ", ".join(f"{names.get(i, i)} {_money(v, currency)}" for i, v in top))
                )
    name = team or NO_TEAM
    return AlertMessage(
        title=f"Spend digest {day.isoformat()}: {name}",
        text=f"What team {name} spent on {day.isoformat()} (UTC), from the ledger's daily rollups.",
        facts=facts,
        path=reverse("billing-dashboard"),
    )


def spend_digest_send(*, now: datetime) -> list[AlertDelivery]:
    """Raise yesterday's digest for every team that spent; each team and day is raised once."""
    day = now.astimezone(UTC).date() - timedelta(days=1)
    teams = sorted({t for t, _ in _totals(day)})
    created: list[AlertDelivery] = []
    for team in teams:
        message = spend_digest_message(team=team, day=day)
        if message is None:
            continue
        created += alert_raise(
            kind=AlertKind.DIGEST,
            dedup_key=f"digest:{team}:{day.isoformat()}",
            message=message,
            now=now,
            team=team,
            once=True,
        )
    return created
