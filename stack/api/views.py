"""REST API viewsets for the registry."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from stack import services
from stack.api.serializers import (
    ClusterSerializer,
    DeploymentSerializer,
    FailoverEventSerializer,
    PolicyChangeSerializer,
    PolicyVersionSerializer,
    ProviderSerializer,
    RegisteredModelSerializer,
    SwitchPrimarySerializer,
    WorkflowSerializer,
)
from stack.models import Cluster, Deployment, FailoverEvent, Provider, RegisteredModel, Workflow
from stack.roles import ADMINS


class ProviderViewSet(viewsets.ModelViewSet[Provider]):
    """Model providers and cloud accounts. Credentials are write-only."""

    queryset = Provider.objects.all()
    serializer_class = ProviderSerializer
    lookup_field = "slug"
    write_roles = ADMINS  # credentials live here


class ClusterViewSet(viewsets.ModelViewSet[Cluster]):
    queryset = Cluster.objects.select_related("provider")
    serializer_class = ClusterSerializer
    lookup_field = "slug"

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


class RegisteredModelViewSet(viewsets.ModelViewSet[RegisteredModel]):
    queryset = RegisteredModel.objects.all()
    serializer_class = RegisteredModelSerializer
    lookup_field = "slug"


class DeploymentViewSet(viewsets.ModelViewSet[Deployment]):
    queryset = Deployment.objects.select_related("model", "provider")
    serializer_class = DeploymentSerializer
    lookup_field = "slug"


class WorkflowViewSet(viewsets.ModelViewSet[Workflow]):
    """Workflows; their routes are immutable versions changed via /switch/ and /policy/."""

    queryset = Workflow.objects.select_related("owner")
    serializer_class = WorkflowSerializer
    lookup_field = "slug"

    def perform_create(self, serializer: WorkflowSerializer) -> None:  # type: ignore[override]
        data = dict(serializer.validated_data)
        route = data.pop("route")
        serializer.instance = services.workflow_create(
            slug=data["slug"],
            owner=self.request.user,  # type: ignore[arg-type]
            description=data.get("description", ""),
            team=data.get("team", ""),
            deployments=route["deployments"],
            strategy=route["strategy"],
            quality_floor=route.get("quality_floor"),
            max_cost_per_request=route.get("max_cost_per_request"),
        )

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

    @extend_schema(responses=PolicyVersionSerializer(many=True))
    @action(detail=True, methods=["get"])
    def versions(self, request: Request, slug: str | None = None) -> Response:
        """Every policy version, newest first."""
        workflow = self.get_object()
        versions = workflow.policy_versions.select_related("author").order_by("-version")
        return Response(PolicyVersionSerializer(versions, many=True).data)


class FailoverEventViewSet(viewsets.ReadOnlyModelViewSet[FailoverEvent]):
    serializer_class = FailoverEventSerializer

    def get_queryset(self) -> QuerySet[FailoverEvent]:
        events = FailoverEvent.objects.select_related(
            "from_provider",
            "to_provider",
            "from_cluster",
            "to_cluster",
            "from_deployment",
            "to_deployment",
        )
        kind = self.request.query_params.get("kind")
        if kind:
            events = events.filter(kind=kind)
        return events
