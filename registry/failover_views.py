"""The failover events page: every failover in the stack, filtered, and its CSV download."""

from __future__ import annotations

import csv
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views import View

from registry.auth.principal import principal_of_user
from registry.forms import FailoverFilterForm
from registry.selectors import failover_events
from registry.views import RoleRequiredMixin

FAILOVER_PAGE_ROWS = 200
FAILOVER_CSV_ROWS = 100_000


class FailoverEventListView(RoleRequiredMixin, View):
    """Every failover in the stack, filtered by kind and code (?kind=, ?code=); `?format=csv`
    downloads the filtered list. An unknown kind or code is a form error (400), not an empty list."""

    platform_only = True  # a failover can name any team's run or workflow (as on the overview)

    def get(self, request: HttpRequest) -> HttpResponse:
        form = FailoverFilterForm(request.GET or None)
        # Every team's failovers: their money only to whom sees every team's money.
        costs = principal_of_user(request.user).cost_teams is None
        if form.is_bound and not form.is_valid():
            return render(
                request,
                "stack/failovers.html",
                {"form": form, "events": [], "can_see_costs": costs},
                status=400,
            )
        values = form.cleaned_data if form.is_bound else {}
        events = failover_events(kind=values.get("kind") or None, code=values.get("code") or None)
        if request.GET.get("format") == "csv":
            return _failovers_csv(events[:FAILOVER_CSV_ROWS], costs=costs)
        return render(
            request,
            "stack/failovers.html",
            {"form": form, "events": events[:FAILOVER_PAGE_ROWS], "can_see_costs": costs},
        )


def _csv_cell(value: str) -> str:
    # A reason quotes upstream error text: a cell starting with = + - @ would be a formula to a
    # spreadsheet (CSV injection), so it is kept as text.
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def _failovers_csv(events: Any, *, costs: bool) -> HttpResponse:
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="failover-events.csv"'
    writer = csv.writer(response)
    header = [
        "id",
        "kind",
        "code",
        "subject",
        "from",
        "to",
        "status_code",
        "reason",
        "detected_at",
        "recovered_at",
    ]
    writer.writerow([*header, "extra_cost", "currency"] if costs else header)
    for e in events:
        source = e.from_deployment or e.from_cluster or e.from_provider
        target = e.to_deployment or e.to_cluster or e.to_provider
        row = [
            e.pk,
            e.kind,
            e.code,
            _csv_cell(e.subject),
            getattr(source, "slug", ""),
            getattr(target, "slug", ""),
            e.status_code or "",
            _csv_cell(e.reason),
            e.detected_at.isoformat(),
            e.recovered_at.isoformat() if e.recovered_at else "",
        ]
        writer.writerow([*row, e.extra_cost, e.currency] if costs else row)
    return response
