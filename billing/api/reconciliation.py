"""Reconciliation's API: /api/invoice-imports/, provider invoices compared with the ledger.

Auditors, operators and admins (the ledger readers) read and upload: an invoice
import is evidence to compare with the ledger, it changes neither the ledger nor
the prices, and checking invoices is an auditor's job. Viewers see neither.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from billing.models import InvoiceImport, InvoiceLine
from billing.price_import import FileImportError, read_upload
from billing.reconciliation import (
    DEFAULT_TOLERANCE,
    TOLERANCE_DIGITS,
    TOLERANCE_PLACES,
    CellRows,
    Reconciliation,
    ReconciliationCell,
    invoice_imports,
    reconciliation_cell_params,
    reconciliation_cell_rows,
    reconciliation_import,
    reconciliation_result,
)
from registry.api.fields import DecimalField, ModelSerializer, ResponseSerializer
from registry.auth.roles import LEDGER_READERS
from registry.models import Provider


class InvoiceImportSerializer(ModelSerializer[InvoiceImport]):
    provider: serializers.SlugRelatedField[Provider] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    uploaded_by = serializers.CharField(
        source="uploaded_by.username", read_only=True, default=None, allow_null=True
    )

    class Meta:
        model = InvoiceImport
        fields = [
            "id",
            "provider",
            "filename",
            "uploaded_by",
            "uploaded_at",
            "period_start",
            "period_end",
            "tolerance",
            "row_count",
        ]
        read_only_fields = fields


class InvoiceUploadSerializer(serializers.Serializer[Any]):
    provider: serializers.SlugRelatedField[Provider] = serializers.SlugRelatedField(
        slug_field="slug", queryset=Provider.objects.all()
    )
    tolerance = DecimalField(
        max_digits=TOLERANCE_DIGITS,
        decimal_places=TOLERANCE_PLACES,
        min_value=Decimal("0"),
        default=DEFAULT_TOLERANCE,
    )
    file = serializers.FileField()


# The schemas of _cell_json, _result_json, _line_json and _rows_json (documentation only).
class ReconciliationCellSerializer(ResponseSerializer):
    """One cell of the comparison: a UTC day and a resource (with its services) or a service."""

    day = serializers.DateField()
    resource_id = serializers.CharField(required=False, help_text="cells by resource")
    services = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="cells by resource"
    )
    service = serializers.CharField(required=False, help_text="cells by service")
    invoice_amount = serializers.CharField()
    ledger_amount = serializers.CharField()
    difference = serializers.CharField()
    mismatch = serializers.BooleanField()
    invoice_lines = serializers.IntegerField()
    ledger_rows = serializers.IntegerField()


class InvoiceReconciliationSerializer(InvoiceImportSerializer):
    """An imported invoice and its comparison with the ledger, per resource and per service."""

    # What the comparison found: output only.
    currency = serializers.CharField(read_only=True)
    invoice_total = serializers.CharField(read_only=True)
    ledger_total = serializers.CharField(read_only=True)
    mismatch_count = serializers.IntegerField(read_only=True)
    by_resource = ReconciliationCellSerializer(many=True, read_only=True)
    by_service = ReconciliationCellSerializer(many=True, read_only=True)
    other_currencies = serializers.DictField(child=serializers.CharField(), read_only=True)

    class Meta(InvoiceImportSerializer.Meta):
        fields = [
            *InvoiceImportSerializer.Meta.fields,
            "currency",
            "invoice_total",
            "ledger_total",
            "mismatch_count",
            "by_resource",
            "by_service",
            "other_currencies",
        ]
        read_only_fields = fields


class InvoiceLineSerializer(ResponseSerializer):
    """One line of the invoice."""

    line_number = serializers.IntegerField()
    day = serializers.DateField()
    service = serializers.CharField()
    resource_id = serializers.CharField()
    usage_quantity = serializers.CharField()
    amount = serializers.CharField()
    currency = serializers.CharField()


class CellLedgerRowSerializer(ResponseSerializer):
    """One ledger row of the cell."""

    id = serializers.IntegerField()
    url = serializers.URLField()
    occurred_at = serializers.DateTimeField()
    unit = serializers.CharField()
    quantity = serializers.CharField()
    amount = serializers.CharField()
    currency = serializers.CharField()
    price_book_version = serializers.IntegerField()


class CellRowsSerializer(ResponseSerializer):
    """What lies behind one cell: its invoice lines and (the first 500 of) its ledger rows."""

    invoice_lines = InvoiceLineSerializer(many=True)
    ledger_row_count = serializers.IntegerField()
    ledger_rows = CellLedgerRowSerializer(many=True)


def _cell_json(cell: ReconciliationCell, kind: str) -> dict[str, Any]:
    return {
        "day": cell.day.isoformat(),
        kind: cell.key,
        **({"services": sorted(cell.services)} if kind == "resource_id" else {}),
        "invoice_amount": f"{cell.invoice_amount:f}",
        "ledger_amount": f"{cell.ledger_amount:f}",
        "difference": f"{cell.difference:f}",
        "mismatch": cell.mismatch,
        "invoice_lines": cell.invoice_lines,
        "ledger_rows": cell.ledger_rows,
    }


def _result_json(result: Reconciliation) -> dict[str, Any]:
    return {
        "currency": result.currency,
        "invoice_total": f"{result.invoice_total:f}",
        "ledger_total": f"{result.ledger_total:f}",
        "mismatch_count": len(result.mismatches),
        "by_resource": [_cell_json(c, "resource_id") for c in result.by_resource],
        "by_service": [_cell_json(c, "service") for c in result.by_service],
        "other_currencies": {k: f"{v:f}" for k, v in sorted(result.other_currencies.items())},
    }


def _line_json(line: InvoiceLine) -> dict[str, Any]:
    return {
        "line_number": line.line_number,
        "day": line.day.isoformat(),
        "service": line.service,
        "resource_id": line.resource_id,
        "usage_quantity": str(line.usage_quantity),
        "amount": str(line.amount),
        "currency": line.currency,
    }


def _rows_json(rows: CellRows, request: Request) -> dict[str, Any]:
    return {
        "invoice_lines": [_line_json(line) for line in rows.invoice_lines],
        "ledger_row_count": rows.ledger_row_count,
        "ledger_rows": [
            {
                "id": row.pk,
                "url": request.build_absolute_uri(reverse("usagerecord-detail", args=[row.pk])),
                "occurred_at": row.occurred_at.isoformat(),
                "unit": row.unit,
                "quantity": str(row.quantity),
                "amount": str(row.amount),
                "currency": row.currency,
                "price_book_version": row.price_book.version,
            }
            for row in rows.ledger_rows
        ],
    }


class InvoiceImportViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet[InvoiceImport]):
    """Provider invoices compared with the ledger. Create: multipart provider, tolerance, file."""

    serializer_class = InvoiceImportSerializer
    read_roles = LEDGER_READERS
    write_roles = LEDGER_READERS
    # A provider's invoice covers every team's usage: platform-wide roles only.
    platform_only = True
    queryset = invoice_imports()
    query_params_known = ("day", "resource", "service")  # the rows action's cell

    @extend_schema(
        request={"multipart/form-data": InvoiceUploadSerializer},
        responses={201: InvoiceReconciliationSerializer},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = InvoiceUploadSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        upload = payload.validated_data["file"]
        try:
            invoice = reconciliation_import(
                provider=payload.validated_data["provider"],
                filename=upload.name or "invoice.csv",
                text=read_upload(upload),
                tolerance=payload.validated_data["tolerance"],
                uploaded_by=request.user,  # type: ignore[arg-type]
            )
        except FileImportError as exc:
            return Response({"errors": [e.as_dict() for e in exc.errors]}, status=status.HTTP_400_BAD_REQUEST)
        body = {**self.get_serializer(invoice).data, **_result_json(reconciliation_result(invoice=invoice))}
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(responses=InvoiceReconciliationSerializer)
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        invoice = self.get_object()
        return Response(
            {**self.get_serializer(invoice).data, **_result_json(reconciliation_result(invoice=invoice))}
        )

    @extend_schema(
        parameters=[
            OpenApiParameter("day", OpenApiTypes.DATE, required=True),
            OpenApiParameter("resource", str, description="the cell's resource id (or give service)"),
            OpenApiParameter("service", str, description="the cell's service (or give resource)"),
        ],
        responses=CellRowsSerializer,
    )
    @action(detail=True, methods=["get"])
    def rows(self, request: Request, pk: str | None = None) -> Response:
        """?day=YYYY-MM-DD and resource=ID or service=NAME: the invoice lines and ledger rows of that cell."""
        cell = reconciliation_cell_params(request.query_params)
        if cell is None:
            raise serializers.ValidationError(
                {"day": ["give day=YYYY-MM-DD and either resource= or service="]}
            )
        day, resource, service = cell
        rows = reconciliation_cell_rows(
            invoice=self.get_object(), day=day, resource_id=resource, service=service
        )
        return Response(_rows_json(rows, request))
