"""Reads from the registry."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Prefetch, QuerySet
from django.http import Http404

from stack.registry.models import Cluster, FailoverEvent, RoutingPolicyVersion, WorkerHeartbeat, Workflow
from stack.registry.roles import ALL_ROLES, user_has_role


def workflow_current_policy(*, workflow: Workflow) -> RoutingPolicyVersion | None:
    return workflow.policy_versions.order_by("-version").first()


def workflows_visible(
    *, user: User | AnonymousUser, workflow_ids: frozenset[int] | None = None
) -> QuerySet[Workflow]:
    """The workflows a caller may see: every one for any role (none without a role), and only
    `workflow_ids` for a token limited to those (stack.registry.access.token_workflow_scope)."""
    if not user_has_role(user, ALL_ROLES):
        return Workflow.objects.none()
    rows = Workflow.objects.all()
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
