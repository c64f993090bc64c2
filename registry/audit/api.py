"""The audit trail's API: GET /api/audit/ (filtered, paginated) and /api/audit/export/ (CSV)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.routers import BaseRouter

from registry.api.fields import ModelSerializer
from registry.audit.export import audit_csv_rows
from registry.audit.forms import FILTER_NAMES, AuditFilterForm
from registry.audit.models import AuditEntry
from registry.audit.roles import AUDIT_READERS
from registry.audit.selectors import audit_entries_from_form, object_type_of
from registry.auth.scoping import scope_refuses


class AuditEntrySerializer(ModelSerializer[AuditEntry]):
    actor = serializers.CharField(source="actor_label", read_only=True)
    action = serializers.CharField(source="get_action_display", read_only=True)
    object_type = serializers.SerializerMethodField()
    object_id = serializers.CharField(source="object_pk", read_only=True)

    class Meta:
        model = AuditEntry
        fields = [
            "id",
            "timestamp",
            "actor",
            "surface",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "changes",
        ]
        read_only_fields = fields

    def get_object_type(self, entry: AuditEntry) -> str:
        return object_type_of(entry)


_FILTERS = [
    OpenApiParameter("object_type", str, description='the model, e.g. "stack.provider"'),
    OpenApiParameter("object_id", str, description="the object's primary key (with object_type)"),
    OpenApiParameter("actor", str, description='a user name, "command:<name>" or "task:<name>"'),
    OpenApiParameter("surface", str, description="web, api, gateway, admin, command, task, system"),
    OpenApiParameter("since", OpenApiTypes.DATETIME, description="UTC, inclusive"),
    OpenApiParameter("until", OpenApiTypes.DATETIME, description="UTC, exclusive"),
]


@extend_schema_view(list=extend_schema(parameters=_FILTERS))
class AuditEntryViewSet(viewsets.ReadOnlyModelViewSet[AuditEntry]):
    """Every recorded change, newest first (auditors and admins)."""

    serializer_class = AuditEntrySerializer
    read_roles = AUDIT_READERS
    query_params_known = FILTER_NAMES
    # Platform auditors only: an entry names its object by type and primary key, and most types
    # (users, groups, providers, prices, a deleted workflow's routes) have no team to filter by
    # reliably, so a team's members read their changes on the objects themselves.
    platform_only = True

    def get_queryset(self) -> QuerySet[AuditEntry]:
        # The trail is not workflow-shaped: a token limited to workflows may not read it.
        scope_refuses(self.request, "read the audit trail")
        if self.action != "list" and self.action != "export":
            return AuditEntry.objects.order_by("-timestamp", "-id")
        return audit_entries_from_form(_filters(self.request))

    @extend_schema(parameters=_FILTERS, responses={(200, "text/csv"): OpenApiTypes.STR})
    @action(detail=False, methods=["get"], url_path="export", url_name="export")
    def export(self, request: Request, *args: Any, **kwargs: Any) -> StreamingHttpResponse:
        """The filtered trail as CSV, streamed."""
        rows = self.filter_queryset(self.get_queryset())
        response = StreamingHttpResponse(audit_csv_rows(rows), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="audit-trail.csv"'
        return response


def _filters(request: Request) -> dict[str, Any]:
    form = AuditFilterForm(request.query_params)
    if not form.is_valid():
        raise ValidationError({name: [str(e) for e in errors] for name, errors in form.errors.items()})
    return form.cleaned_data


def register(router: BaseRouter) -> None:
    router.register("audit", AuditEntryViewSet, basename="auditentry")
