"""Reconciliation: a provider's invoice and its lines, matched against the ledger."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import models
from django.utils import timezone

from registry.models import (
    Provider,
)


class InvoiceImport(models.Model):
    """A provider invoice or cost report, imported to compare with the ledger."""

    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="invoice_imports")
    filename = models.CharField(max_length=255)
    uploaded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    uploaded_at = models.DateTimeField(default=timezone.now, editable=False)
    period_start = models.DateField()
    period_end = models.DateField()
    tolerance = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0.01"))
    row_count = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-uploaded_at"]

    def __str__(self) -> str:
        return f"{self.provider} {self.filename}"


class InvoiceLine(models.Model):
    invoice = models.ForeignKey(InvoiceImport, on_delete=models.CASCADE, related_name="lines")
    line_number = models.PositiveIntegerField()
    day = models.DateField()
    service = models.CharField(max_length=128)
    resource_id = models.CharField(max_length=255, blank=True)
    usage_quantity = models.DecimalField(max_digits=28, decimal_places=9, default=Decimal("0"))
    amount = models.DecimalField(max_digits=28, decimal_places=9)
    currency = models.CharField(max_length=3)
    raw = models.JSONField(default=dict)

    class Meta:
        ordering = ["invoice", "line_number"]
        indexes = [models.Index(fields=["invoice", "day", "service"], name="invoice_day_service_idx")]

    def __str__(self) -> str:
        return f"{self.invoice} line {self.line_number}"
