"""The registry's API serializers: providers, clusters, models, deployments, workflows and their
policy versions, failover events (objects addressed by slug)."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any, TypeVar

from drf_spectacular.utils import extend_schema_field
from rest_framework import exceptions, serializers

from registry import services
from registry.api.fields import DateTimeField, DecimalField, ModelSerializer
from registry.auth.fields import fields_refused
from registry.auth.principal import principal_of
from registry.auth.scoping import TeamSlugField
from registry.models import (
    Cluster,
    Deployment,
    FailoverEvent,
    Provider,
    RegisteredModel,
    RoutingPolicyVersion,
    Workflow,
)
from registry.selectors import workflow_current_policy
from registry.services.records import rule_validator

V = TypeVar("V")


def field_rule(check: Callable[[V], None], value: V) -> V:
    """A service's rule on one field, asked while the serializer reads its fields."""
    rule_validator(check)(value)
    return value


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
        return field_rule(services.provider_base_url_check, value)

    def validate_allowed_endpoints(self, value: list[str]) -> list[str]:
        return field_rule(services.provider_endpoints_check, value)

    def create(self, validated_data: dict[str, Any]) -> Provider:
        return services.provider_create(**validated_data)  # the service checks the rules

    def update(self, instance: Provider, validated_data: dict[str, Any]) -> Provider:
        return services.provider_update(instance, **validated_data)


class ClusterSerializer(ModelSerializer[Cluster]):
    provider = serializers.SlugRelatedField(slug_field="slug", queryset=Provider.objects.all())
    queue = serializers.CharField(read_only=True)
    object_store_credentials = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=400,
        style={"input_type": "password"},
        help_text="ACCESS_KEY_ID:SECRET_ACCESS_KEY of the cluster's store; write-only, an empty string "
        "clears them, never returned",
    )
    has_object_store_credentials = serializers.BooleanField(read_only=True)

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
            "object_store_url",
            "object_store_endpoint_url",
            "object_store_credentials",
            "has_object_store_credentials",
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

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        request = self.context.get("request")
        if request is not None:
            refused = fields_refused(Cluster, principal_of(request), attrs, self.instance)
            if refused:
                raise exceptions.PermissionDenied(f"only an admin may set {', '.join(refused)}")
        return attrs

    def validate_object_store_url(self, value: str) -> str:
        return field_rule(services.cluster_store_url_check, value)

    def validate_object_store_endpoint_url(self, value: str) -> str:
        return field_rule(services.cluster_store_endpoint_check, value)

    def validate_object_store_credentials(self, value: str) -> str:
        return field_rule(services.cluster_store_credentials_check, value)

    def create(self, validated_data: dict[str, Any]) -> Cluster:
        return services.cluster_create(**validated_data)

    def update(self, instance: Cluster, validated_data: dict[str, Any]) -> Cluster:
        return services.cluster_update(instance, **validated_data)


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
        return field_rule(services.registered_model_artifact_uri_check, value)

    def create(self, validated_data: dict[str, Any]) -> RegisteredModel:
        return services.registered_model_create(**validated_data)  # the service checks the rules

    def update(self, instance: RegisteredModel, validated_data: dict[str, Any]) -> RegisteredModel:
        return services.registered_model_update(instance, **validated_data)


class DeploymentSerializer(ModelSerializer[Deployment]):
    model = serializers.SlugRelatedField(slug_field="slug", queryset=RegisteredModel.objects.all())
    provider = serializers.SlugRelatedField(slug_field="slug", queryset=Provider.objects.all())
    hosting_cluster = serializers.SlugRelatedField(
        slug_field="slug", queryset=Cluster.objects.all(), required=False, allow_null=True
    )

    class Meta:
        model = Deployment
        fields = ["id", *services.DEPLOYMENT_FIELDS, "created_at"]
        read_only_fields = ["id", "created_at"]

    def create(self, validated_data: dict[str, Any]) -> Deployment:
        return services.deployment_create(**validated_data)  # the service checks the rules

    def update(self, instance: Deployment, validated_data: dict[str, Any]) -> Deployment:
        return services.deployment_update(instance, **validated_data)


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
    # Semantic matching (inference.cache.semantic): the embeddings deployment by slug; the rules
    # between it, the threshold, the cache and kept prompts are the service's (workflow_check).
    semantic_cache_deployment = serializers.SlugRelatedField(
        slug_field="slug", queryset=Deployment.objects.all(), required=False, allow_null=True
    )

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
            "response_cache_seconds",
            "response_cache_entries",
            "semantic_cache_threshold",
            "semantic_cache_deployment",
            "current_policy",
            "route",
            "created_at",
        ]
        read_only_fields = ["id", "created_at"]

    def create(self, validated_data: dict[str, Any]) -> Workflow:
        """A workflow and its first route (the viewset gives the owner: serializer.save(owner=...))."""
        data = dict(validated_data)
        route = data.pop("route")
        return services.workflow_create(
            deployments=route["deployments"],
            strategy=route["strategy"],
            quality_floor=route.get("quality_floor"),
            max_cost_per_request=route.get("max_cost_per_request"),
            **data,
        )

    def update(self, instance: Workflow, validated_data: dict[str, Any]) -> Workflow:
        return services.workflow_update(instance, **validated_data)  # the service checks the rules

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
