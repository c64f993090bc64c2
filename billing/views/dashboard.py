"""The billing dashboard (/billing/) and the ledger rows behind every figure (/billing/ledger/)."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.db.models import QuerySet, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views import View

from billing import charts
from billing.budgets import budget_state
from billing.exports import ExportFilters, export_queryset
from billing.forms import LedgerFilterForm
from billing.models import Unit, UsageRecord
from billing.money import shown_text
from billing.quality import cost_per_quality_point
from billing.selectors import (
    PURPOSE_BY_UNIT,
    budgets_of_teams,
    cost_avoided_by_cache,
    price_in_force,
    spend_grouped,
    spend_per_provider_per_day,
)
from billing.selfhosted import self_hosted_cost
from registry.auth.roles import LEDGER_READERS
from registry.auth.teams import team_slugs, user_teams_with_role
from registry.models import Deployment, FailoverEvent
from registry.views import RoleRequiredMixin, team_filter_from_request

CHART_DAYS = 30
TOP = 10


def _ledger_link(**filters: Any) -> str:
    return "/billing/ledger/?" + urlencode({k: v for k, v in filters.items() if v not in (None, "")})


def _ranked(
    totals: dict[tuple[Any, ...], Decimal], link_field: str, since: date, team: str = ""
) -> list[dict[str, Any]]:
    rows = [
        {"name": name, "currency": currency, "amount": amount,
         "link": _ledger_link(since=since.isoformat(), team=team, **{link_field: name})}
        for (name, currency), amount in totals.items()
        if name
    ]  # fmt: skip
    return sorted(rows, key=lambda r: r["amount"], reverse=True)[:TOP]


class BillingDashboardView(RoleRequiredMixin, View):
    read_roles = LEDGER_READERS

    def get(self, request: HttpRequest) -> HttpResponse:
        now = timezone.now()
        month_start = now.date().replace(day=1)
        first_day = now.date() - timedelta(days=CHART_DAYS - 1)
        days = [first_day + timedelta(days=i) for i in range(CHART_DAYS)]
        # Every figure below is of the teams picked (?team=), a team-scoped user's own by default.
        pick = team_filter_from_request(request, LEDGER_READERS)
        slugs, team = pick.slugs, pick.picked
        daily = spend_per_provider_per_day(since_day=first_day, teams=slugs)

        split: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
        by_unit = spend_grouped(by=("unit", "currency"), since_day=month_start, teams=slugs)
        for (unit, currency), amount in by_unit.items():
            split[(PURPOSE_BY_UNIT.get(unit, "other"), currency)] += amount
        mtd = spend_grouped(by=("currency",), since_day=month_start, teams=slugs)
        failover: Any = []
        if slugs is None:  # a failover's extra cost belongs to no one team
            failover = (
                FailoverEvent.objects.filter(
                    detected_at__gte=datetime.combine(month_start, time.min, tzinfo=UTC), extra_cost__gt=0
                )
                # Per kind and cause: what each failover code cost this month.
                .values("kind", "code", "currency")
                .annotate(total=Sum("extra_cost"))
                .order_by("kind", "code")
            )
        budgets = [
            state
            for state in (
                budget_state(budget=b, now=now)
                for b in budgets_of_teams(teams=pick.teams).filter(active=True)
            )
            if state is not None
        ]

        def ranked(dimension: str, link_field: str) -> list[dict[str, Any]]:
            totals = spend_grouped(by=(dimension, "currency"), since_day=month_start, teams=slugs)
            return _ranked(totals, link_field, month_start, team)

        return render(
            request,
            "billing/dashboard.html",
            {
                "team_filter": pick,
                "month_start": month_start,
                "chart": charts.spend_per_provider_chart(daily, days),
                "chart_link": _ledger_link(since=first_day.isoformat(), team=team),
                "month_to_date": [
                    {
                        "currency": c,
                        "amount": a,
                        "link": _ledger_link(since=month_start.isoformat(), currency=c, team=team),
                    }
                    for (c,), a in sorted(mtd.items())
                ],
                "budgets": budgets,
                "top_workflows": ranked("workflow__slug", "workflow"),
                "top_runs": ranked("training_run_id", "training_run"),
                "top_clusters": ranked("cluster__slug", "cluster"),
                "split": [
                    {"purpose": purpose, "currency": currency, "amount": amount}
                    for (purpose, currency), amount in sorted(split.items())
                ],
                "split_links": {
                    purpose: _ledger_link(since=month_start.isoformat(), purpose=purpose, team=team)
                    for purpose in set(PURPOSE_BY_UNIT.values())
                },
                "failover_costs": list(failover),
                "token_prices": _token_prices(since_day=first_day, now=now),
                "quality_costs": cost_per_quality_point(since_day=first_day, teams=slugs),
                "saved_by_cache": sorted(cost_avoided_by_cache(since_day=month_start, teams=slugs).items()),
                "quality_days": CHART_DAYS,
            },
            status=pick.status,
        )


def _token_prices(*, since_day: date, now: datetime) -> list[dict[str, Any]]:
    """Per deployment: the cloud price per 1M output tokens, or the self-hosted effective one."""
    table = []
    for deployment in Deployment.objects.select_related("provider", "hosting_cluster").filter(enabled=True):
        if deployment.hosting_cluster_id is not None:
            for cost in self_hosted_cost(deployment=deployment, since_day=since_day):
                table.append(
                    {"deployment": deployment.slug, "kind": f"self-hosted on {deployment.hosting_cluster}",
                     "per_1m": cost.per_1m_tokens, "currency": cost.currency,
                     "note": f"{shown_text(cost.accelerator_cost)} {cost.currency} over {cost.tokens_millions}M tokens"
                     if cost.tokens_millions else "no tokens served yet"}
                )  # fmt: skip
            continue
        price = price_in_force(
            unit=Unit.OUTPUT_TOKENS_1M, at=now, deployment=deployment, provider=deployment.provider
        )
        table.append(
            {"deployment": deployment.slug, "kind": str(deployment.provider),
             "per_1m": price.unit_price if price else None, "currency": price.currency if price else "",
             "note": f"price v{price.version}" if price else "no output-token price"}
        )  # fmt: skip
    return table


PAGE_ROWS = 100


class LedgerRowsView(RoleRequiredMixin, View):
    """The ledger rows behind a figure (every partition), newest first, paged by row id."""

    read_roles = LEDGER_READERS

    def get(self, request: HttpRequest) -> HttpResponse:
        form = LedgerFilterForm(request.GET or None)
        rows: QuerySet[UsageRecord] = UsageRecord.objects.select_related(
            "provider", "cluster", "deployment", "workflow", "price_book"
        )
        status = 200
        if form.is_bound and not form.is_valid():
            rows, status = rows.none(), 400
        elif form.is_bound:
            f = form.cleaned_data
            # The same row selection as a cost-audit export with these filters.
            rows = export_queryset(
                filters=ExportFilters(
                    start=datetime.combine(f["since"], time.min, tzinfo=UTC) if f["since"] else None,
                    end=datetime.combine(f["until"], time.min, tzinfo=UTC) if f["until"] else None,
                    provider=f["provider"],
                    cluster=f["cluster"],
                    workflow=f["workflow"],
                    training_run=f["training_run"],
                    team=f["team"],
                    unit=f["unit"],
                )
            ).select_related("provider", "cluster", "deployment", "workflow", "price_book")
            if f["currency"]:
                rows = rows.filter(currency=f["currency"].upper())
            if f["purpose"]:
                rows = rows.filter(unit__in=[u for u, p in PURPOSE_BY_UNIT.items() if p == f["purpose"]])
            if f["before"]:
                rows = rows.filter(pk__lt=f["before"])
        # A team-scoped caller reads its teams' rows only, whatever the filters say.
        slugs = team_slugs(user_teams_with_role(request.user, LEDGER_READERS))
        if slugs is not None:
            rows = rows.filter(team__in=slugs)
        # Newest first by id: ids are drawn in append order across every partition, while
        # sequences repeat from one partition to the next and cannot page a merged ledger.
        page = list(rows.order_by("-pk")[: PAGE_ROWS + 1])
        more = len(page) > PAGE_ROWS
        page = page[:PAGE_ROWS]
        total = rows.aggregate(total=Sum("amount"))["total"] if status == 200 else None
        older = ""
        if more:
            params = request.GET.copy()
            params["before"] = str(page[-1].pk)
            older = "?" + params.urlencode()
        return render(
            request,
            "billing/ledger.html",
            {"form": form, "rows": page, "older": older, "total": total},
            status=status,
        )
