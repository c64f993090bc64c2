"""Read-only ledger API and price books."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db.models import QuerySet
from rest_framework import mixins, serializers, viewsets
from rest_framework.routers import BaseRouter

from billing.budget_views import BudgetAlertViewSet, BudgetViewSet
from billing.export_views import ExportJobViewSet
from billing.models import PriceBook, UsageRecord
from billing.price_views import PriceImportActionMixin
from billing.reconciliation_views import InvoiceImportViewSet
from billing.services import price_book_publish
from stack.registry.models import Cluster, Deployment, Provider
from stack.registry.roles import ADMINS, LEDGER_READERS


class UsageRecordSerializer(serializers.ModelSerializer[UsageRecord]):
    provider: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    cluster: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    deployment: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    model: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    workflow: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    price_book_version = serializers.IntegerField(source="price_book.version", read_only=True)

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


class UsageRecordViewSet(viewsets.ReadOnlyModelViewSet[UsageRecord]):
    """The append-only usage ledger (auditors, operators, admins)."""

    serializer_class = UsageRecordSerializer
    read_roles = LEDGER_READERS

    def get_queryset(self) -> QuerySet[UsageRecord]:
        rows = UsageRecord.objects.select_related(
            "provider", "cluster", "deployment", "model", "workflow", "price_book"
        )
        params = self.request.query_params
        for field in ("subject_type", "subject_id", "unit"):
            if params.get(field):
                rows = rows.filter(**{field: params[field]})
        for field in ("provider", "cluster", "workflow"):
            if params.get(field):
                rows = rows.filter(**{f"{field}__slug": params[field]})
        return rows


class PriceBookSerializer(serializers.ModelSerializer[PriceBook]):
    provider = serializers.SlugRelatedField(
        slug_field="slug", queryset=Provider.objects.all(), required=False, allow_null=True
    )
    cluster = serializers.SlugRelatedField(
        slug_field="slug", queryset=Cluster.objects.all(), required=False, allow_null=True
    )
    deployment = serializers.SlugRelatedField(
        slug_field="slug", queryset=Deployment.objects.all(), required=False, allow_null=True
    )
    unit_price = serializers.DecimalField(max_digits=24, decimal_places=9, min_value=Decimal("0"))

    class Meta:
        model = PriceBook
        fields = [
            "id",
            "provider",
            "cluster",
            "deployment",
            "unit",
            "unit_price",
            "currency",
            "effective_from",
            "effective_to",
            "source",
            "version",
            "note",
            "created_at",
        ]
        read_only_fields = ["id", "source", "version", "created_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        targets = [k for k in ("cluster", "deployment") if attrs.get(k) is not None]
        if len(targets) > 1:
            raise serializers.ValidationError({"cluster": ["price one cluster or one deployment, not both"]})
        if not targets and attrs.get("provider") is None:
            raise serializers.ValidationError({"cluster": ["name a cluster, a deployment or a provider"]})
        return attrs

    def create(self, validated_data: dict[str, Any]) -> PriceBook:
        return price_book_publish(**validated_data)


class PriceBookViewSet(
    PriceImportActionMixin, mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet[PriceBook]
):
    """Price versions. A new price supersedes the old one; nothing is edited in place.

    POST import/ (billing.price_views) adds many versions from a CSV or catalog file.
    """

    serializer_class = PriceBookSerializer
    read_roles = LEDGER_READERS
    write_roles = ADMINS
    queryset = PriceBook.objects.select_related("provider", "cluster", "deployment")


def register(router: BaseRouter) -> None:
    """Mount billing's viewsets on the project's /api/ router."""
    router.register("usage-records", UsageRecordViewSet, basename="usagerecord")
    router.register("price-books", PriceBookViewSet)
    router.register("budgets", BudgetViewSet)
    router.register("budget-alerts", BudgetAlertViewSet, basename="budgetalert")
    router.register("export-jobs", ExportJobViewSet, basename="exportjob")
    router.register("invoice-imports", InvoiceImportViewSet, basename="invoiceimport")
