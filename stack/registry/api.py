"""The registry's REST API: serializers and viewsets (objects addressed by slug), and
`register(router)`, which the project's urls call."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db.models import Q, QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, extend_schema_view
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import BaseRouter

from stack.registry import services
from stack.registry.api_fields import DateTimeField, DecimalField, ModelSerializer
from stack.registry.endpoints import deployment_endpoint_problem, endpoint_list_problems, endpoint_url_problem
from stack.registry.failover_codes import FailoverCode
from stack.registry.models import (
    Cluster,
    Deployment,
    FailoverEvent,
    Provider,
    RegisteredModel,
    RoutingPolicyVersion,
    Workflow,
)
from stack.registry.objectstore import store_uri_problem
from stack.registry.query_params import query_choice
from stack.registry.roles import ADMINS
from stack.registry.scoping import TeamSlugField, scope_refuses, scope_requires_team
from stack.registry.selectors import workflow_current_policy
from stack.registry.subjects import subject_rows_in_teams
from stack.registry.team_api import TeamViewSet

# --- Serializers ---------------------------------------------------------------------------


class ProviderSerializer(ModelSerializer[Provider]):
    credentials = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        style={"input_type": "password"},
        help_text="write-only; an empty string clears them; never returned",
    )
    has_credentials = serializers.BooleanField(read_only=True)
    allowed_endpoints = serializers.ListField(
        child=serializers.CharField(max_length=500),
        required=False,
        max_length=50,
        help_text="URL prefixes (scheme, host, port, path) besides base_url that deployments may use; "
        "they receive the credentials",
    )

    class Meta:
        model = Provider
        fields = [
            "id",
            "slug",
            "display_name",
            "kind",
            "region",
            "base_url",
            "allowed_endpoints",
            "allow_private_network",
            "credentials",
            "has_credentials",
            "enabled",
            "created_at",
        ]
        read_only_fields = ["id", "created_at"]

    def validate_base_url(self, value: str) -> str:
        if value and (problem := endpoint_url_problem(value)):
            raise serializers.ValidationError(problem)
        return value

    def validate_allowed_endpoints(self, value: list[str]) -> list[str]:
        problems = endpoint_list_problems(value)
        if problems:
            raise serializers.ValidationError(problems)
        return [url.rstrip("/") for url in value]

    def create(self, validated_data: dict[str, Any]) -> Provider:
        credentials = validated_data.pop("credentials", None)
        provider = super().create(validated_data)
        return services.provider_set_credentials(provider=provider, credentials=credentials)

    def update(self, instance: Provider, validated_data: dict[str, Any]) -> Provider:
        credentials = validated_data.pop("credentials", None)
        provider = super().update(instance, validated_data)
        return services.provider_set_credentials(provider=provider, credentials=credentials)


class ClusterSerializer(ModelSerializer[Cluster]):
    provider = serializers.SlugRelatedField(slug_field="slug", queryset=Provider.objects.all())
    queue = serializers.CharField(read_only=True)

    class Meta:
        model = Cluster
        fields = [
            "id",
            "slug",
            "provider",
            "region",
            "accelerator_type",
            "accelerator_count",
            "memory_per_node_gb",
            "capacity_type",
            "capacity",
            "queue",
            "status",
            "status_changed_at",
            "last_heartbeat_at",
            "interruption_noticed_at",
            "interruption_deadline",
            "created_at",
        ]
        read_only_fields = [
            "id",
            "status",
            "status_changed_at",
            "last_heartbeat_at",
            "interruption_noticed_at",
            "interruption_deadline",
            "created_at",
        ]


class InterruptionNoticeSerializer(serializers.Serializer[Any]):
    """A spot interruption notice: when the provider reclaims the cluster (default: in 2 minutes)."""

    deadline = DateTimeField(required=False, allow_null=True)


class RegisteredModelSerializer(ModelSerializer[RegisteredModel]):
    class Meta:
        model = RegisteredModel
        fields = [
            "id",
            "slug",
            "family",
            "parameter_count",
            "artifact_uri",
            "produced_by_run_id",
            "tokenizer",
            "context_length",
            "created_at",
        ]
        read_only_fields = ["id", "created_at"]

    def validate_artifact_uri(self, value: str) -> str:
        if value and (problem := store_uri_problem(value)):
            raise serializers.ValidationError(problem)
        return value


class DeploymentSerializer(ModelSerializer[Deployment]):
    model = serializers.SlugRelatedField(slug_field="slug", queryset=RegisteredModel.objects.all())
    provider = serializers.SlugRelatedField(slug_field="slug", queryset=Provider.objects.all())
    hosting_cluster = serializers.SlugRelatedField(
        slug_field="slug", queryset=Cluster.objects.all(), required=False, allow_null=True
    )

    class Meta:
        model = Deployment
        fields = [
            "id",
            "slug",
            "model",
            "provider",
            "provider_model_id",
            "base_url",
            "hosting_cluster",
            "enabled",
            "supports_tools",
            "supports_json_schema",
            "supports_vision",
            "supports_embeddings",
            "max_context_tokens",
            "created_at",
        ]
        read_only_fields = ["id", "created_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        model_id = attrs.get("provider_model_id", getattr(self.instance, "provider_model_id", ""))
        base_url = attrs.get("base_url", getattr(self.instance, "base_url", ""))
        if not model_id and not base_url:
            raise serializers.ValidationError(
                {"provider_model_id": ["give the provider's model id or a local endpoint base_url"]}
            )
        provider = attrs.get("provider", getattr(self.instance, "provider", None))
        if provider is not None:
            # The same check as Deployment.clean (the page form, the Django admin).
            problem = deployment_endpoint_problem(provider=provider, base_url=base_url)
            if problem is not None:
                raise serializers.ValidationError({"base_url": [problem]})
        return attrs


class PolicyVersionSerializer(ModelSerializer[RoutingPolicyVersion]):
    deployments = serializers.SerializerMethodField()
    author = serializers.CharField(source="author.get_username", read_only=True)

    class Meta:
        model = RoutingPolicyVersion
        fields = [
            "version",
            "strategy",
            "quality_floor",
            "max_cost_per_request",
            "deployments",
            "author",
            "reason",
            "created_at",
        ]

    def get_deployments(self, obj: RoutingPolicyVersion) -> list[str]:
        return [d.slug for d in obj.ordered_deployments()]


class RouteInputSerializer(serializers.Serializer[Any]):
    """A route as given by a user: ordered deployment slugs plus policy knobs."""

    deployments = serializers.ListField(
        child=serializers.SlugRelatedField(slug_field="slug", queryset=Deployment.objects.all()),
        allow_empty=False,
    )
    strategy = serializers.ChoiceField(
        choices=RoutingPolicyVersion.Strategy.choices, default=RoutingPolicyVersion.Strategy.PRIORITY
    )
    quality_floor = DecimalField(
        max_digits=6,
        decimal_places=4,
        required=False,
        allow_null=True,
        min_value=Decimal("0"),
        max_value=Decimal("1"),
    )
    max_cost_per_request = DecimalField(
        max_digits=20, decimal_places=9, required=False, allow_null=True, min_value=Decimal("0")
    )

    def validate_deployments(self, value: list[Deployment]) -> list[Deployment]:
        if len({d.pk for d in value}) != len(value):
            raise serializers.ValidationError("a deployment appears twice")
        return value


class PolicyChangeSerializer(RouteInputSerializer):
    reason = serializers.CharField(max_length=500)


class WorkflowSerializer(ModelSerializer[Workflow]):
    owner = serializers.CharField(source="owner.get_username", read_only=True)
    # The owning team, by slug: one the caller may write in (a team-scoped caller must name one).
    team = TeamSlugField(required=False, allow_null=True)
    current_policy = serializers.SerializerMethodField()
    route = RouteInputSerializer(write_only=True, required=True)

    class Meta:
        model = Workflow
        fields = [
            "id",
            "slug",
            "owner",
            "team",
            "description",
            "rpm_limit",
            "tpm_limit",
            "retain_prompts",
            "prompt_retention_days",
            "current_policy",
            "route",
            "created_at",
        ]
        read_only_fields = ["id", "created_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Keeping prompts (opt-in, for replays) needs a retention period of 1..365 days; a
        PATCH is checked against the workflow's current values."""
        attrs = super().validate(attrs)
        current = self.instance
        retain = attrs.get("retain_prompts", current.retain_prompts if current is not None else False)
        days = attrs.get(
            "prompt_retention_days", current.prompt_retention_days if current is not None else None
        )
        try:
            services.workflow_retention_check(retain_prompts=retain, prompt_retention_days=days)
        except services.RegistryError as exc:
            raise serializers.ValidationError({exc.field or "prompt_retention_days": [str(exc)]}) from None
        return attrs

    @extend_schema_field(PolicyVersionSerializer(allow_null=True))
    def get_current_policy(self, obj: Workflow) -> dict[str, Any] | None:
        policy = workflow_current_policy(workflow=obj)
        return PolicyVersionSerializer(policy).data if policy is not None else None

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        if self.instance is not None:
            # Routes change through /switch/ or /policy/, which record a reason.
            fields.pop("route", None)
        return fields


# The schema of PUT and PATCH (documentation only): WorkflowSerializer.get_fields drops the
# route when it updates a workflow.
class WorkflowChangeSerializer(WorkflowSerializer):
    """A workflow as PUT and PATCH take it: its route changes through /switch/ and /policy/."""

    route = None  # type: ignore[assignment]

    class Meta(WorkflowSerializer.Meta):
        fields = [f for f in WorkflowSerializer.Meta.fields if f != "route"]


class SwitchPrimarySerializer(serializers.Serializer[Any]):
    deployment = serializers.SlugRelatedField(slug_field="slug", queryset=Deployment.objects.all())
    reason = serializers.CharField(max_length=500)


class FailoverEventSerializer(ModelSerializer[FailoverEvent]):
    # Each side names a provider, a cluster or a deployment, as the kind of failover has it.
    from_provider: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    to_provider: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    from_cluster: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    to_cluster: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    from_deployment: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    to_deployment: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )

    class Meta:
        model = FailoverEvent
        fields = [
            "id",
            "kind",
            "code",
            "subject",
            "from_provider",
            "to_provider",
            "from_cluster",
            "to_cluster",
            "from_deployment",
            "to_deployment",
            "reason",
            "detected_at",
            "recovered_at",
            "time_lost",
            "extra_cost",
            "currency",
            "details",
        ]
        read_only_fields = fields


# --- Viewsets -----------------------------------------------------------------------------


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
        data = dict(serializer.validated_data)
        route = data.pop("route")
        scope_requires_team(self.request, data.get("team"))
        serializer.instance = services.workflow_create(
            slug=data["slug"],
            owner=self.request.user,  # type: ignore[arg-type]
            description=data.get("description", ""),
            team=data.get("team"),
            deployments=route["deployments"],
            strategy=route["strategy"],
            quality_floor=route.get("quality_floor"),
            max_cost_per_request=route.get("max_cost_per_request"),
            rpm_limit=data.get("rpm_limit"),
            tpm_limit=data.get("tpm_limit"),
            retain_prompts=data.get("retain_prompts", False),
            prompt_retention_days=data.get("prompt_retention_days"),
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
