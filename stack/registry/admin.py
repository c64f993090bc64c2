from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import models
from django.http import HttpRequest

from stack.registry import services
from stack.registry.forms import ProviderForm
from stack.registry.models import (
    ApiToken,
    Cluster,
    Deployment,
    FailoverEvent,
    Provider,
    RegisteredModel,
    RoutingPolicyEntry,
    RoutingPolicyVersion,
    WorkerHeartbeat,
    Workflow,
)


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin[Provider]):
    form = ProviderForm
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    list_display = ["slug", "display_name", "kind", "region", "has_credentials", "enabled"]
    list_filter = ["kind", "enabled"]
    search_fields = ["slug", "display_name"]

    def save_model(self, request: HttpRequest, obj: Provider, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        services.provider_set_credentials(provider=obj, credentials=form.credentials_change())


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin[Cluster]):
    list_display = [
        "slug",
        "provider",
        "region",
        "accelerator_type",
        "accelerator_count",
        "status",
        "last_heartbeat_at",
    ]
    list_filter = ["status", "capacity_type", "provider"]
    readonly_fields = ["last_heartbeat_at", "status_changed_at"]


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(admin.ModelAdmin[WorkerHeartbeat]):
    list_display = ["hostname", "cluster", "pid", "started_at", "last_seen_at"]


@admin.register(RegisteredModel)
class RegisteredModelAdmin(admin.ModelAdmin[RegisteredModel]):
    list_display = ["slug", "family", "parameter_count", "artifact_uri"]


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin[Deployment]):
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    list_display = ["slug", "model", "provider", "enabled"]


class RoutingPolicyEntryInline(admin.TabularInline[RoutingPolicyEntry, RoutingPolicyVersion]):
    model = RoutingPolicyEntry
    extra = 0
    can_delete = False
    readonly_fields = ["deployment", "position", "weight"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(RoutingPolicyVersion)
class RoutingPolicyVersionAdmin(admin.ModelAdmin[RoutingPolicyVersion]):
    """Read-only: new versions are made on the workflow page or through the API."""

    list_display = ["workflow", "version", "strategy", "author", "created_at", "reason"]
    inlines = [RoutingPolicyEntryInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Workflow)
class WorkflowAdmin(admin.ModelAdmin[Workflow]):
    list_display = ["slug", "owner", "team"]


@admin.register(FailoverEvent)
class FailoverEventAdmin(admin.ModelAdmin[FailoverEvent]):
    list_display = ["kind", "subject", "from_cluster", "to_cluster", "reason", "detected_at", "recovered_at"]
    list_filter = ["kind"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    list_display = ["name", "user", "prefix", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "key_hash", "created_at", "last_used_at"]
    exclude = ["key_hash"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tokens are created on the tokens page or by `manage.py apitoken`
