from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import models
from django.http import HttpRequest

from registry.forms import (
    ClusterForm,
    DeploymentForm,
    ProviderForm,
    RegisteredModelForm,
    ServiceModelForm,
    WorkflowChangeForm,
)
from registry.models import (
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


class ServiceAdmin(admin.ModelAdmin[Any]):
    """Creates and changes objects through their form's service, as the pages and the API do.
    The admin saves after its form is valid and cannot show an error raised then, so its forms
    ask the service's check in clean (ServiceModelForm.check_on_clean)."""

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        return type(form.__name__, (form,), {"check_on_clean": True})

    def save_form(self, request: HttpRequest, form: Any, change: bool) -> Any:
        saved = form.save()  # through the service; the admin logs and redirects with this object
        form.save_m2m = lambda: None  # the service wrote everything the form holds
        return saved

    def save_model(self, request: HttpRequest, obj: Any, form: ServiceModelForm[Any], change: bool) -> None:
        """Written by save_form, through the service."""


@admin.register(Provider)
class ProviderAdmin(ServiceAdmin):
    form = ProviderForm
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    list_display = ["slug", "display_name", "kind", "region", "has_credentials", "enabled"]
    list_filter = ["kind", "enabled"]
    search_fields = ["slug", "display_name"]


@admin.register(Cluster)
class ClusterAdmin(ServiceAdmin):
    form = ClusterForm
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
    # The status follows heartbeats, draining and interruption notices (registry.services).
    readonly_fields = [
        "status",
        "status_changed_at",
        "last_heartbeat_at",
        "interruption_noticed_at",
        "interruption_deadline",
    ]


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(admin.ModelAdmin[WorkerHeartbeat]):
    list_display = ["hostname", "cluster", "pid", "started_at", "last_seen_at"]


@admin.register(RegisteredModel)
class RegisteredModelAdmin(ServiceAdmin):
    form = RegisteredModelForm
    list_display = ["slug", "family", "parameter_count", "artifact_uri"]
    # Set by the training run that registers the model (training.services).
    readonly_fields = ["produced_by_run_id", "final_eval_loss", "training_cost"]


@admin.register(Deployment)
class DeploymentAdmin(ServiceAdmin):
    form = DeploymentForm
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
class WorkflowAdmin(ServiceAdmin):
    """Settings only: a workflow is created with its route (workflow page or API), its owner is
    who created it, and its route changes through a new policy version."""

    form = WorkflowChangeForm
    list_display = ["slug", "owner", "team"]
    readonly_fields = ["owner"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


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
