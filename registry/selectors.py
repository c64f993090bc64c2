"""Reads from the registry."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Count, Prefetch, Q, QuerySet
from django.http import Http404

from registry.auth.principal import user_has_role
from registry.auth.roles import ALL_ROLES
from registry.auth.teams import user_team_scope
from registry.models import (
    Cluster,
    Deployment,
    FailoverEvent,
    RoutingPolicyVersion,
    WorkerHeartbeat,
    Workflow,
)


def workflow_current_policy(*, workflow: Workflow) -> RoutingPolicyVersion | None:
    return workflow.policy_versions.order_by("-version").first()


_USER_SCOPE: Any = object()  # "the user's own team scope", told apart from None (every team)


def workflows_visible(
    *, user: User | AnonymousUser, workflow_ids: frozenset[int] | None = None, teams: Any = _USER_SCOPE
) -> QuerySet[Workflow]:
    """The workflows a caller may see: every one for a platform-wide role, its teams' for a
    team-scoped user (`teams`, by default the user's: registry.auth.teams), none without a
    role, and only `workflow_ids` for a token limited to those
    (registry.auth.access.token_workflow_scope)."""
    if not user_has_role(user, ALL_ROLES):
        return Workflow.objects.none()
    if teams is _USER_SCOPE:
        teams = user_team_scope(user)
    rows = Workflow.objects.all()
    if teams is not None:
        rows = rows.filter(team__in=teams)
    return rows if workflow_ids is None else rows.filter(pk__in=workflow_ids)


def get_workflow_for_user(
    *, slug: str, user: User | AnonymousUser, workflow_ids: frozenset[int] | None = None
) -> Workflow:
    """The workflow if the caller may see it; 404 otherwise, as for a workflow that does not exist."""
    try:
        return workflows_visible(user=user, workflow_ids=workflow_ids).select_related("owner").get(slug=slug)
    except Workflow.DoesNotExist:
        raise Http404("no such workflow") from None


def cluster_list_with_workers() -> QuerySet[Cluster]:
    return Cluster.objects.select_related("provider").prefetch_related(
        Prefetch("workers", queryset=WorkerHeartbeat.objects.order_by("hostname"))
    )


def failover_event_counts() -> dict[tuple[str, str], tuple[int, int]]:
    """(events, still open) per failover kind and code, for /metrics."""
    rows = (
        FailoverEvent.objects.values("kind", "code")
        .annotate(total=Count("id"), open=Count("id", filter=Q(recovered_at__isnull=True)))
        .order_by()
    )
    return {(row["kind"], row["code"]): (row["total"], row["open"]) for row in rows}


def deployments_enabled() -> QuerySet[Deployment]:
    return Deployment.objects.filter(enabled=True).order_by("slug")


def failover_events(*, kind: str | None = None, code: str | None = None) -> QuerySet[FailoverEvent]:
    """Failover events, newest first, optionally of one kind and one code (failover_code_idx)."""
    events = FailoverEvent.objects.select_related(
        "from_provider", "to_provider", "from_cluster", "to_cluster", "from_deployment", "to_deployment"
    )
    if kind:
        events = events.filter(kind=kind)
    if code:
        events = events.filter(code=code)
    return events.order_by("-detected_at", "-id")
