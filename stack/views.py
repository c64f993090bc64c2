"""Composition pages: the overview, /healthz and the bundled plotly.js."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import plotly
from django.db import connection
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.views import View
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_safe
from rest_framework.exceptions import AuthenticationFailed

from billing import charts
from billing.selectors import DailySpend, spend_per_provider_per_day
from stack.celery import app as celery_app
from stack.error_reports import redact_credentials
from stack.registry.authentication import BearerTokenAuthentication
from stack.registry.models import Cluster, FailoverEvent
from stack.registry.objectstore import object_store_health
from stack.registry.roles import ADMINS, can_see_costs, user_has_role
from stack.registry.selectors import cluster_list_with_workers
from stack.registry.views import RoleRequiredMixin
from training.selectors import probe_jobs_recent

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


# --- Overview -------------------------------------------------------------------------

OVERVIEW_DAYS = 14


class OverviewView(RoleRequiredMixin, View):
    def get(self, request: HttpRequest) -> HttpResponse:
        context: dict[str, object] = {}
        if can_see_costs(request.user):  # a viewer's page has no money (stack.registry.costs)
            now = timezone.now()
            first_day = (now - timedelta(days=OVERVIEW_DAYS - 1)).date()
            days = [first_day + timedelta(days=i) for i in range(OVERVIEW_DAYS)]
            spend = spend_per_provider_per_day(since_day=first_day)
            context["spend_chart"] = charts.spend_per_provider_chart(spend, days)
            context["spend_totals"] = _totals_by_currency(spend)
        return render(
            request,
            "stack/overview.html",
            {
                **context,
                "clusters": cluster_list_with_workers(),
                "jobs": probe_jobs_recent(limit=10),
                "events": FailoverEvent.objects.select_related("from_cluster", "to_cluster")[:10],
            },
        )


def _totals_by_currency(rows: list[DailySpend]) -> dict[str, Decimal]:
    totals: dict[str, Decimal] = {}
    for row in rows:
        totals[row.currency] = totals.get(row.currency, Decimal("0")) + row.amount
    return totals


def _broker_ok() -> tuple[bool, str]:
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return True, "ok"
    except Exception as exc:  # any failure means "broker unreachable" here
        return False, redact_credentials(f"{type(exc).__name__}: {exc}")


def _may_see_health_detail(request: HttpRequest) -> bool:
    """A staff or admin session, or a bearer token of an admin. Anyone else gets the status only:
    worker hostnames, PIDs, queues, the database vendor and the object store's location are a
    map for an attacker."""
    user = request.user
    if user.is_authenticated and (user.is_staff or user_has_role(user, ADMINS)):
        return True
    try:
        authenticated = BearerTokenAuthentication().authenticate(request)  # type: ignore[arg-type]
    except AuthenticationFailed:
        return False  # a bad token still gets the status: load balancers must keep working
    return authenticated is not None and user_has_role(authenticated[0], ADMINS)


@require_safe  # GET and HEAD; anything else is 405 (stack/access.py)
def healthz(request: HttpRequest) -> JsonResponse:
    """`{"status": "ok"}` (200) or `{"status": "degraded"}` (503) for anyone; with a staff or admin
    session or an admin's token, also the database, broker, object store and per-cluster workers."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        database = {"ok": True, "vendor": connection.vendor}
    except Exception as exc:
        database = {"ok": False, "error": redact_credentials(f"{type(exc).__name__}: {exc}")}
    broker_ok, broker_detail = _broker_ok()
    object_store = object_store_health()
    ok = bool(database["ok"]) and broker_ok and bool(object_store["ok"])
    code = 200 if ok else 503
    status = "ok" if ok else "degraded"
    if not _may_see_health_detail(request):
        return JsonResponse({"ok": ok, "status": status}, status=code)
    if "error" in object_store:
        object_store["error"] = redact_credentials(str(object_store["error"]))
    clusters = []
    if database["ok"]:
        now = timezone.now()
        for cluster in cluster_list_with_workers():
            last = cluster.last_heartbeat_at
            clusters.append(
                {
                    "slug": cluster.slug,
                    "status": cluster.status,
                    "queue": cluster.queue,
                    "last_heartbeat_at": last.isoformat() if last else None,
                    "seconds_since_heartbeat": round((now - last).total_seconds(), 1) if last else None,
                    "heartbeat_overdue": cluster.heartbeat_overdue,
                    "workers": [
                        {"hostname": w.hostname, "pid": w.pid, "last_seen_at": w.last_seen_at.isoformat()}
                        for w in cluster.workers.all()
                    ],
                }
            )
    body = {
        "ok": ok,
        "status": status,
        "database": database,
        "broker": {"ok": broker_ok, "detail": broker_detail},
        "object_store": object_store,
        "clusters": clusters,
        "all_clusters_healthy": all(c["status"] == Cluster.Status.HEALTHY for c in clusters),
    }
    return JsonResponse(body, status=code)


@require_safe
@cache_control(max_age=86400, public=True)
def plotly_js(request: HttpRequest) -> FileResponse:
    """plotly.js from the installed `plotly` package, so pages need no CDN."""
    return FileResponse(PLOTLY_JS.open("rb"), content_type="application/javascript")
