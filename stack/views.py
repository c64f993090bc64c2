"""Composition pages: the overview, /healthz and the bundled plotly.js."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import plotly
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.db.models import Count
from django.http import FileResponse, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views import View
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_safe
from rest_framework.exceptions import AuthenticationFailed

from billing import charts
from billing.budgets import budget_state
from billing.selectors import DailySpend, budgets_of_teams, spend_per_provider_per_day
from registry.api.authentication import BearerTokenAuthentication
from registry.auth.access import token_workflow_scope
from registry.auth.principal import can_see_costs, principal_of_key, principal_of_user, sees_any_costs
from registry.auth.roles import ADMINS, ALL_ROLES
from registry.auth.teams import teams_visible, user_team_scope
from registry.forms import TeamMemberForm
from registry.models import ApiToken, Cluster, FailoverEvent, Team, TeamMembership
from registry.selectors import cluster_list_with_workers
from registry.services import RegistryError, team_membership_remove, team_membership_set
from registry.store.objectstore import object_store_health
from registry.views import RoleRequiredMixin, money_team_slugs, team_filter_from_request
from stack.celery import app as celery_app
from stack.error_reports import redact_credentials
from training.selectors import probe_jobs_recent

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


# --- Overview -------------------------------------------------------------------------

OVERVIEW_DAYS = 14


class OverviewView(RoleRequiredMixin, View):
    def get(self, request: HttpRequest) -> HttpResponse:
        team_filter = team_filter_from_request(request)
        context: dict[str, object] = {"team_filter": team_filter}
        if sees_any_costs(request.user):  # money per team (registry.auth.costs)
            now = timezone.now()
            first_day = (now - timedelta(days=OVERVIEW_DAYS - 1)).date()
            days = [first_day + timedelta(days=i) for i in range(OVERVIEW_DAYS)]
            slugs = money_team_slugs(request.user, team_filter.teams)
            spend = spend_per_provider_per_day(since_day=first_day, teams=slugs)
            context["spend_chart"] = charts.spend_per_provider_chart(spend, days)
            context["spend_totals"] = _totals_by_currency(spend)
        # Failover events name runs and workflows of every team: platform roles only.
        platform_wide = user_team_scope(request.user) is None
        return render(
            request,
            "stack/overview.html",
            {
                **context,
                "clusters": cluster_list_with_workers(),
                "jobs": probe_jobs_recent(limit=10),
                "show_events": platform_wide,
                "events": FailoverEvent.objects.select_related("from_cluster", "to_cluster")[:10]
                if platform_wide
                else [],
            },
            status=team_filter.status,
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
    if user.is_authenticated and (user.is_staff or principal_of_user(user).may(ADMINS, None)):
        return True
    try:
        authenticated = BearerTokenAuthentication().authenticate(request)  # type: ignore[arg-type]
    except AuthenticationFailed:
        return False  # a bad token still gets the status: load balancers must keep working
    if authenticated is None:
        return False
    key = authenticated[1]
    return principal_of_key(key, token_workflow_scope(key)).may(ADMINS, None)


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


# --- Teams ----------------------------------------------------------------------------------------

TEAM_SPEND_DAYS = 30


def _may_manage_members(request: HttpRequest, team: Team) -> bool:
    """Platform admins manage every team's members; a team's admins manage that team's."""
    return principal_of_user(request.user).manages_team(team.pk)


class TeamListView(RoleRequiredMixin, View):
    """The caller's teams (every team for a platform role)."""

    def get(self, request: HttpRequest) -> HttpResponse:
        teams = teams_visible(teams=user_team_scope(request.user)).annotate(
            members=Count("memberships", distinct=True), workflow_count=Count("workflows", distinct=True)
        )
        memberships = TeamMembership.objects.filter(user_id=request.user.pk)  # type: ignore[misc]
        mine = dict(memberships.values_list("team_id", "role"))
        rows = [{"team": team, "role": mine.get(team.pk, "")} for team in teams]
        return render(request, "stack/team_list.html", {"rows": rows})


class TeamDetailView(RoleRequiredMixin, View):
    """A team: members and roles, API keys (never their secrets), budgets with this period's
    spend, rate limits and spend by day. Its admins (and platform admins) manage members here."""

    # Every member may open it; who may change members is decided per team below.
    write_roles = ALL_ROLES

    def get(self, request: HttpRequest, slug: str) -> HttpResponse:
        team = self._team(request, slug)
        return self._render(request, team, TeamMemberForm())

    def post(self, request: HttpRequest, slug: str) -> HttpResponse:
        team = self._team(request, slug)
        if not _may_manage_members(request, team):
            raise PermissionDenied("only the team's admins manage its members")
        if "remove" in request.POST:
            member = get_object_or_404(
                team.memberships.select_related("user"), user__username=request.POST["remove"]
            )
            team_membership_remove(team=team, user=member.user)
            messages.success(request, f"{member.user.username} left {team.slug}.")
            return HttpResponseRedirect(reverse("team-page", args=[team.slug]))
        form = TeamMemberForm(request.POST)
        if form.is_valid():
            try:
                membership = team_membership_set(
                    team=team, user=form.cleaned_data["username"], role=form.cleaned_data["role"]
                )
            except RegistryError as exc:
                form.add_error(exc.field if exc.field in form.fields else None, str(exc))
            else:
                messages.success(request, f"{membership.user.username} is {membership.role} of {team.slug}.")
                return HttpResponseRedirect(reverse("team-page", args=[team.slug]))
        return self._render(request, team, form, status=400)

    @staticmethod
    def _team(request: HttpRequest, slug: str) -> Team:
        """The team if the caller sees it; 404 otherwise, as for a team that does not exist."""
        return get_object_or_404(teams_visible(teams=user_team_scope(request.user)), slug=slug)

    def _render(
        self, request: HttpRequest, team: Team, form: TeamMemberForm, status: int = 200
    ) -> HttpResponse:
        keys = ApiToken.objects.filter(team=team).select_related("user").prefetch_related("workflows")
        at = timezone.now()
        context: dict[str, object] = {
            "team": team,
            "members": team.memberships.select_related("user").order_by("user__username"),
            "keys": [(key, key.state_at(at)) for key in keys.order_by("revoked_at", "name")],
            "workflows": team.workflows.order_by("slug"),
            "form": form,
            "can_manage": _may_manage_members(request, team),
        }
        costs = can_see_costs(request.user, team.pk)  # budgets and spend are the team's money
        context["can_see_costs"] = costs
        if costs:
            now = timezone.now()
            first_day = (now - timedelta(days=TEAM_SPEND_DAYS - 1)).date()
            days = [first_day + timedelta(days=i) for i in range(TEAM_SPEND_DAYS)]
            spend = spend_per_provider_per_day(since_day=first_day, teams=frozenset({team.slug}))
            context["spend_chart"] = charts.spend_per_provider_chart(spend, days)
            context["spend_totals"] = _totals_by_currency(spend)
            context["budgets"] = [
                {"budget": budget, "state": budget_state(budget=budget, now=now)}
                for budget in budgets_of_teams(teams=frozenset({team.pk}))
            ]
        response = render(request, "stack/team_detail.html", context, status=status)
        response["Cache-Control"] = "no-store"
        return response
