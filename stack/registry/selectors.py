"""Reads from the registry."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Prefetch, QuerySet
from django.http import Http404

from stack.registry.models import Cluster, RoutingPolicyVersion, WorkerHeartbeat, Workflow
from stack.registry.roles import ALL_ROLES, user_has_role


def workflow_current_policy(*, workflow: Workflow) -> RoutingPolicyVersion | None:
    return workflow.policy_versions.order_by("-version").first()


def get_workflow_for_user(*, slug: str, user: User | AnonymousUser) -> Workflow:
    """The workflow if the user may see it (every role may read the registry)."""
    if not user_has_role(user, ALL_ROLES):
        raise Http404("no such workflow")
    try:
        return Workflow.objects.select_related("owner").get(slug=slug)
    except Workflow.DoesNotExist:
        raise Http404("no such workflow") from None


def cluster_list_with_workers() -> QuerySet[Cluster]:
    return Cluster.objects.select_related("provider").prefetch_related(
        Prefetch("workers", queryset=WorkerHeartbeat.objects.order_by("hostname"))
    )
