"""The registry's REST API: viewsets (objects addressed by slug, serializers in
registry.api.serializers), and `register(router)`, which the project's urls call."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import BaseRouter

from registry import services
from registry.api.query_params import query_choice
from registry.api.serializers import (
    ClusterSerializer,
    DeploymentSerializer,
    FailoverEventSerializer,
    InterruptionNoticeSerializer,
    PolicyChangeSerializer,
    PolicyVersionSerializer,
    ProviderSerializer,
    RegisteredModelSerializer,
    SwitchPrimarySerializer,
    WorkflowChangeSerializer,
    WorkflowSerializer,
)
from registry.api.teams import TeamViewSet
from registry.auth.roles import ADMINS
from registry.auth.scoping import scope_refuses, scope_requires_team
from registry.auth.subjects import subject_rows_in_teams
from registry.failover_codes import FailoverCode
from registry.models import (
    Cluster,
    Deployment,
    FailoverEvent,
    Provider,
    RegisteredModel,
    Workflow,
)


class ProviderViewSet(viewsets.ModelViewSet[Provider]):
    """Model providers and cloud accounts. Credentials are write-only."""

    queryset = Provider.objects.all()
    serializer_class = ProviderSerializer
    lookup_field = "slug"
    write_roles = ADMINS  # credentials live here
    shared_with_teams = True  # every team routes through them; platform admins change them


class ClusterViewSet(viewsets.ModelViewSet[Cluster]):
    queryset = Cluster.objects.select_related("provider")
    serializer_class = ClusterSerializer
    lookup_field = "slug"
    shared_with_teams = True  # every team's runs are placed on them; platform admins drain them

    @extend_schema(request=None, responses=ClusterSerializer)
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, slug: str | None = None) -> Response:
        """Stop placing new work on the cluster (heartbeats no longer change its status)."""
        cluster = services.cluster_set_draining(cluster=self.get_object(), draining=True)
        return Response(ClusterSerializer(cluster).data)

    @extend_schema(request=None, responses=ClusterSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, slug: str | None = None) -> Response:
        """End draining; the status follows heartbeats again."""
        cluster = services.cluster_set_draining(cluster=self.get_object(), draining=False)
        return Response(ClusterSerializer(cluster).data)

    @extend_schema(request=InterruptionNoticeSerializer, responses=ClusterSerializer)
    @action(detail=True, methods=["post"])
    def interruption(self, request: Request, slug: str | None = None) -> Response:
        """A spot interruption notice: the cluster drains now, its learners push their deltas and
        stop, and the training supervisor re-places them before the deadline."""
        cluster = self.get_object()
        body = InterruptionNoticeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        cluster = services.cluster_interruption_notice(
            cluster=cluster, deadline=body.validated_data.get("deadline")
        )
        return Response(ClusterSerializer(cluster).data)


class RegisteredModelViewSet(viewsets.ModelViewSet[RegisteredModel]):
    queryset = RegisteredModel.objects.all()
    serializer_class = RegisteredModelSerializer
    lookup_field = "slug"
    shared_with_teams = True


class DeploymentViewSet(viewsets.ModelViewSet[Deployment]):
    queryset = Deployment.objects.select_related("model", "provider")
    serializer_class = DeploymentSerializer
    lookup_field = "slug"
    shared_with_teams = True  # any team's workflow may route to any deployment


@extend_schema_view(
    update=extend_schema(request=WorkflowChangeSerializer),
    partial_update=extend_schema(request=WorkflowChangeSerializer),
)
class WorkflowViewSet(viewsets.ModelViewSet[Workflow]):
    """Workflows; their routes are immutable versions changed via /switch/ and /policy/."""

    queryset = Workflow.objects.select_related("owner")
    serializer_class = WorkflowSerializer
    lookup_field = "slug"
    workflow_field = "pk"  # a token limited to workflows sees its own; the others answer 404

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        scope_refuses(request, "create workflows")  # a new workflow would be outside its reach
        return super().create(request, *args, **kwargs)

    def perform_update(self, serializer: WorkflowSerializer) -> None:  # type: ignore[override]
        if "team" in serializer.validated_data:  # a team member may not hand it to no team
            scope_requires_team(self.request, serializer.validated_data["team"])
        super().perform_update(serializer)

    def perform_create(self, serializer: WorkflowSerializer) -> None:  # type: ignore[override]
        scope_requires_team(self.request, serializer.validated_data.get("team"))
        serializer.save(owner=self.request.user)  # WorkflowSerializer.create: services.workflow_create

    @extend_schema(request=SwitchPrimarySerializer, responses={201: PolicyVersionSerializer})
    @action(detail=True, methods=["post"])
    def switch(self, request: Request, slug: str | None = None) -> Response:
        """Make a deployment the primary one (a new policy version, with a reason)."""
        workflow = self.get_object()
        body = SwitchPrimarySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        policy = services.workflow_switch_primary(
            workflow=workflow,
            deployment=body.validated_data["deployment"],
            author=request.user,  # type: ignore[arg-type]
            reason=body.validated_data["reason"],
        )
        return Response(PolicyVersionSerializer(policy).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=PolicyChangeSerializer, responses={201: PolicyVersionSerializer})
    @action(detail=True, methods=["post"])
    def policy(self, request: Request, slug: str | None = None) -> Response:
        """Replace the whole route with a new policy version."""
        workflow = self.get_object()
        body = PolicyChangeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        policy = services.workflow_policy_change(
            workflow=workflow,
            deployments=data["deployments"],
            author=request.user,  # type: ignore[arg-type]
            reason=data["reason"],
            strategy=data["strategy"],
            quality_floor=data.get("quality_floor"),
            max_cost_per_request=data.get("max_cost_per_request"),
        )
        return Response(PolicyVersionSerializer(policy).data, status=status.HTTP_201_CREATED)

    # One unpaginated list (a workflow has few versions): pagination_class=None tells the schema so.
    @extend_schema(responses=PolicyVersionSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)
    def versions(self, request: Request, slug: str | None = None) -> Response:
        """Every policy version, newest first."""
        workflow = self.get_object()
        versions = workflow.policy_versions.select_related("author").order_by("-version")
        return Response(PolicyVersionSerializer(versions, many=True).data)


@extend_schema_view(
    list=extend_schema(
        parameters=[
            OpenApiParameter("kind", str, enum=FailoverEvent.Kind.values, description="only this kind"),
            OpenApiParameter("code", str, enum=FailoverCode.values, description="only this failover code"),
        ]
    )
)
class FailoverEventViewSet(viewsets.ReadOnlyModelViewSet[FailoverEvent]):
    serializer_class = FailoverEventSerializer
    query_params_known = ("kind", "code")

    def team_scope_queryset(
        self, queryset: QuerySet[FailoverEvent], teams: frozenset[int]
    ) -> QuerySet[FailoverEvent]:
        """An inference failover belongs to its workflow's team (the fold names the workflow by
        slug in its details), a training failover to its run's team. A cluster's health events
        name neither: they are the platform's, as the cluster's heartbeats are."""
        slugs = list(Workflow.objects.filter(team__in=teams).values_list("slug", flat=True))
        owned = Q(kind=FailoverEvent.Kind.INFERENCE, details__workflow__in=slugs)
        runs = subject_rows_in_teams("training_run", teams)
        if runs is not None:
            owned |= Q(training_run_id__in=runs.values("pk"))
        return queryset.filter(owned)

    def get_queryset(self) -> QuerySet[FailoverEvent]:
        events = FailoverEvent.objects.select_related(
            "from_provider",
            "to_provider",
            "from_cluster",
            "to_cluster",
            "from_deployment",
            "to_deployment",
        )
        kind = query_choice(self.request, "kind", FailoverEvent.Kind.values)
        if kind is not None:
            events = events.filter(kind=kind)
        code = query_choice(self.request, "code", FailoverCode.values)
        if code is not None:
            events = events.filter(code=code)
        return events


def register(router: BaseRouter) -> None:
    """Mount the registry's viewsets on the project's /api/ router."""
    router.register("providers", ProviderViewSet)
    router.register("clusters", ClusterViewSet)
    router.register("models", RegisteredModelViewSet)
    router.register("deployments", DeploymentViewSet)
    router.register("workflows", WorkflowViewSet)
    router.register("failover-events", FailoverEventViewSet, basename="failoverevent")
    router.register("teams", TeamViewSet)
