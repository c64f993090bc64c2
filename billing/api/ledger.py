"""The usage ledger's API: /api/usage-records/, read-only, for ledger readers."""

from __future__ import annotations

import re
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import serializers, viewsets

from billing.models import UsageRecord
from registry.api.fields import ModelSerializer
from registry.auth.roles import LEDGER_READERS
from registry.auth.teams import team_slugs

API_KEY_PREFIX = re.compile(r"[0-9A-Za-z]{1,16}")  # registry.models.ApiToken.prefix


class UsageRecordSerializer(ModelSerializer[UsageRecord]):
    # What the usage was for: any of these may be absent (null), as the subject has them.
    provider: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    cluster: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    deployment: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    model: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    workflow: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    price_book_version = serializers.IntegerField(source="price_book.version", read_only=True)
    # The key whose request caused the row, by its public prefix (sy_<prefix>_…); null for none.
    api_key: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="prefix", read_only=True, allow_null=True
    )

    class Meta:
        model = UsageRecord
        fields = [
            "id",
            "occurred_at",
            "recorded_at",
            "subject_type",
            "subject_id",
            "description",
            "provider",
            "cluster",
            "deployment",
            "model",
            "workflow",
            "team",
            "api_key",
            "quantity",
            "unit",
            "unit_price",
            "amount",
            "currency",
            "price_book",
            "price_book_version",
            "reverses",
        ]
        read_only_fields = fields


@extend_schema_view(
    list=extend_schema(
        parameters=[
            OpenApiParameter("subject_type", str, description="only rows of this subject type"),
            OpenApiParameter("subject_id", str, description="only rows of this subject id"),
            OpenApiParameter("unit", str, description="only rows in this unit"),
            OpenApiParameter("provider", str, description="only rows of the provider with this slug"),
            OpenApiParameter("cluster", str, description="only rows of the cluster with this slug"),
            OpenApiParameter("workflow", str, description="only rows of the workflow with this slug"),
            OpenApiParameter("api_key", str, description="only rows caused by the API key with this prefix"),
        ]
    )
)
class UsageRecordViewSet(viewsets.ReadOnlyModelViewSet[UsageRecord]):
    """The append-only usage ledger (auditors, operators, admins)."""

    serializer_class = UsageRecordSerializer
    read_roles = LEDGER_READERS
    workflow_field = "workflow"  # a token limited to workflows reads their rows only
    query_params_known = ("subject_type", "subject_id", "unit", "provider", "cluster", "workflow", "api_key")

    def team_scope_queryset(
        self, queryset: QuerySet[UsageRecord], teams: frozenset[int]
    ) -> QuerySet[UsageRecord]:
        """A row belongs to the team it names (its slug, as billed: a workflow's, or a training
        run's for its chunks); a row that names none (a probe job, a platform workflow) is the
        platform's."""
        return queryset.filter(team__in=sorted(team_slugs(teams) or ()))

    def get_queryset(self) -> QuerySet[UsageRecord]:
        rows = UsageRecord.objects.select_related(
            "provider", "cluster", "deployment", "model", "workflow", "price_book", "api_key"
        )
        params = self.request.query_params
        for field in ("subject_type", "subject_id", "unit"):
            if params.get(field):
                rows = rows.filter(**{field: params[field]})
        for field in ("provider", "cluster", "workflow"):
            if params.get(field):
                rows = rows.filter(**{f"{field}__slug": params[field]})
        if "api_key" in params:
            prefix = params["api_key"]
            if not API_KEY_PREFIX.fullmatch(prefix):
                raise serializers.ValidationError(
                    {"api_key": ["an API key's prefix: 1 to 16 letters or digits (sy_<prefix>_…)"]}
                )
            rows = rows.filter(api_key__prefix=prefix)
        return rows
