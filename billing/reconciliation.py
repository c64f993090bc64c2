"""Reconciliation: compare a provider's invoice or cost report with the ledger.

Supported columns (a header row names them; other columns are ignored; names
match without regard to case). Each field accepts the AWS Cost and Usage Report
(CUR) name, its CUR 2.0 snake-case name, or the FinOps FOCUS name:

| field          | AWS CUR                   | CUR 2.0                      | FOCUS             | required |
| -------------- | ------------------------- | ---------------------------- | ----------------- | -------- |
| usage start    | lineItem/UsageStartDate   | line_item_usage_start_date   | ChargePeriodStart | yes      |
| service        | lineItem/ProductCode      | line_item_product_code       | ServiceName       | yes      |
| resource id    | lineItem/ResourceId       | line_item_resource_id        | ResourceId        | no       |
| usage quantity | lineItem/UsageAmount      | line_item_usage_amount       | ConsumedQuantity  | no       |
| cost           | lineItem/UnblendedCost    | line_item_unblended_cost     | BilledCost        | yes      |
| currency       | lineItem/CurrencyCode     | line_item_currency_code      | BillingCurrency   | yes      |

- The usage start is ISO 8601 (2026-05-04T13:00:00Z); a time without an offset
  is read as UTC, as CUR writes them. A line counts on the UTC day it starts.
- Costs are decimals (negative for credits and refunds), rounded half-even to
  9 decimal places, the ledger's precision; NaN and Infinity are refused.
- One file has one currency; the ledger side is compared in that currency
  (ledger spend in other currencies is reported beside, never converted).
- The resource id must be what Switchyard calls the resource (the cluster slug
  for compute, the deployment slug for inference: billing.focus.focus_resource),
  e.g. through a cost-allocation tag copied into the column.

Validation is complete before anything is written: every error names its line
and column, and a file with any error imports nothing.

The comparison (computed on demand, so late-billed usage shows up) is per UTC
day and ResourceId, and per UTC day and service. The ledger side is the
invoice's provider over the invoice's days, read from the daily rollups plus
the ledger rows not folded into them yet (an indexed range), and mapped to
FOCUS terms by billing.focus (the one mapping). The invoice's service column
holds the provider's product code (AmazonEC2, ...): INVOICE_SERVICES names the
FOCUS service each known code is compared with; FOCUS service names pass
through, and an unknown code stays as it is (an invoice-only row).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import TruncDate

from billing.focus import SERVICE_BY_UNIT, focus_resource
from billing.models import DailyRollup, InvoiceImport, InvoiceLine, UsageRecord
from billing.money import LEDGER_QUANTUM
from billing.price_import import FileImportError, RowError, csv_records
from billing.rollups import unfolded_rows
from registry.models import Provider
from registry.validation import (
    InputError,
    currency_parse,
    date_parse,
    datetime_parse,
    decimal_check,
    decimal_parse,
)

FIELDS: dict[str, tuple[str, ...]] = {
    "usage_start": ("lineItem/UsageStartDate", "line_item_usage_start_date", "ChargePeriodStart"),
    "service": ("lineItem/ProductCode", "line_item_product_code", "ServiceName"),
    "resource_id": ("lineItem/ResourceId", "line_item_resource_id", "ResourceId"),
    "usage_quantity": ("lineItem/UsageAmount", "line_item_usage_amount", "ConsumedQuantity"),
    "amount": ("lineItem/UnblendedCost", "line_item_unblended_cost", "BilledCost"),
    "currency": ("lineItem/CurrencyCode", "line_item_currency_code", "BillingCurrency"),
}
REQUIRED_FIELDS = ("usage_start", "service", "amount", "currency")
FOCUS_SERVICES = frozenset(SERVICE_BY_UNIT.values())
# Provider product codes -> the FOCUS service (billing.focus) their cost is compared with.
INVOICE_SERVICES = {
    "AmazonEC2": "Accelerator compute",
    "AmazonSageMaker": "Accelerator compute",
    "AmazonEKS": "Accelerator compute",
    "AmazonBedrock": "Model inference",
    "AmazonS3": "Storage",
    "AWSDataTransfer": "Data transfer",
}
DEFAULT_TOLERANCE = Decimal("0.01")
TOLERANCE_DIGITS, TOLERANCE_PLACES = 12, 6  # InvoiceImport.tolerance
MAX_ERRORS = 1000
BATCH_SIZE = 5000


def tolerance_check(tolerance: Decimal) -> Decimal:
    """The tolerance if it fits InvoiceImport.tolerance (≥ 0, 6 places); InputError otherwise."""
    try:
        return decimal_check(
            tolerance, max_digits=TOLERANCE_DIGITS, decimal_places=TOLERANCE_PLACES, minimum=Decimal(0)
        )
    except InputError as exc:
        raise InputError(str(exc), field="tolerance") from None


def tolerance_parse(text: str) -> Decimal:
    """A tolerance written in ASCII digits (the command's --tolerance), checked by tolerance_check."""
    try:
        return decimal_parse(
            text, max_digits=TOLERANCE_DIGITS, decimal_places=TOLERANCE_PLACES, minimum=Decimal(0)
        )
    except InputError as exc:
        raise InputError(str(exc), field="tolerance") from None


def invoice_service_name(service: str) -> str:
    """The FOCUS service an invoice line's service (product code) is compared under."""
    return service if service in FOCUS_SERVICES else INVOICE_SERVICES.get(service, service)


# --- Import -------------------------------------------------------------------------------------


def _column_map(columns: list[str]) -> tuple[dict[str, str], list[RowError]]:
    """field -> the header's column name for it; errors for missing or doubled fields."""
    by_lower = {name.lower(): name for name in columns}
    found: dict[str, str] = {}
    errors: list[RowError] = []
    for name, aliases in FIELDS.items():
        present = [by_lower[a.lower()] for a in aliases if a.lower() in by_lower]
        if len(present) > 1:
            errors.append(RowError(1, present[1], f"same field as column {present[0]}; keep one"))
        if present:
            found[name] = present[0]
        elif name in REQUIRED_FIELDS:
            errors.append(RowError(1, aliases[0], f"missing column (or {' or '.join(aliases[1:])})"))
    return found, errors


def _usage_day(text: str) -> date:
    return datetime_parse(text, naive_is_utc=True).date()  # CUR times are UTC, without an offset


def _parse_line(
    line: int, raw: dict[str, str], columns: dict[str, str]
) -> tuple[dict[str, Any] | None, list[RowError]]:
    errors: list[RowError] = []
    values: dict[str, Any] = {}

    def cell(name: str) -> str:
        return raw.get(columns[name], "").strip() if name in columns else ""

    for name in REQUIRED_FIELDS:
        if not cell(name):
            errors.append(RowError(line, columns[name], "required"))
    if cell("usage_start"):
        try:
            values["day"] = _usage_day(cell("usage_start"))
        except InputError as exc:
            errors.append(RowError(line, columns["usage_start"], str(exc)))
    if len(cell("service")) > 128:
        errors.append(RowError(line, columns["service"], "longer than 128 characters"))
    values["service"] = cell("service")
    if len(cell("resource_id")) > 255:
        errors.append(RowError(line, columns["resource_id"], "longer than 255 characters"))
    values["resource_id"] = cell("resource_id")
    for name, default in (("amount", None), ("usage_quantity", Decimal("0"))):
        if not cell(name):
            values[name] = default
            continue
        try:
            values[name] = decimal_parse(cell(name), max_digits=28, decimal_places=9, round_excess=True)
        except InputError as exc:
            errors.append(RowError(line, columns[name], str(exc)))
    currency = cell("currency")
    if currency:
        try:
            currency = currency_parse(currency)
        except InputError as exc:
            errors.append(RowError(line, columns["currency"], str(exc)))
    values["currency"] = currency
    values["raw"] = {columns[name]: cell(name) for name in columns}
    return (None if errors else values), errors


def reconciliation_import(
    *,
    provider: Provider,
    filename: str,
    text: str,
    tolerance: Decimal = DEFAULT_TOLERANCE,
    uploaded_by: User | None = None,
) -> InvoiceImport:
    """Validate and store an invoice CSV for `provider`; FileImportError (nothing stored) if any line is bad."""
    tolerance_check(tolerance)
    read_errors: list[RowError] = []
    header, records = csv_records(text, read_errors)
    columns, errors = _column_map(header)
    if not header:
        errors = read_errors or [RowError(1, "", "the file is empty; expected a header row")]
    if errors:
        raise FileImportError(errors)
    # Cells that cannot be read are appended to read_errors while the records are read.
    errors = read_errors
    with transaction.atomic():
        invoice = InvoiceImport.objects.create(
            provider=provider,
            filename=filename[:255],
            uploaded_by=uploaded_by,
            period_start=date.min,  # set below, from the lines
            period_end=date.min,
            tolerance=tolerance,
        )
        batch: list[InvoiceLine] = []
        days: set[date] = set()
        currency, currency_line, count = "", 0, 0
        for line, raw in records:
            values, line_errors = _parse_line(line, raw, columns)
            errors += line_errors
            if values is not None:
                if not currency:
                    currency, currency_line = values["currency"], line
                elif values["currency"] != currency:
                    errors.append(
                        RowError(
                            line,
                            columns["currency"],
                            f"{values['currency']} differs from {currency} (line {currency_line}); "
                            "import one currency per file",
                        )
                    )
            if len(errors) >= MAX_ERRORS:
                errors.append(RowError(line, "", f"stopped after {MAX_ERRORS} errors"))
                break
            if errors or values is None:
                continue  # nothing will be stored: only keep checking
            count += 1
            days.add(values["day"])
            batch.append(InvoiceLine(invoice=invoice, line_number=line, **values))
            if len(batch) >= BATCH_SIZE:
                InvoiceLine.objects.bulk_create(batch)
                batch = []
        if not errors and count == 0:
            errors.append(RowError(1, "", "no invoice lines after the header"))
        if errors:
            raise FileImportError(errors)  # rolls back the import and its lines
        InvoiceLine.objects.bulk_create(batch)
        invoice.period_start, invoice.period_end, invoice.row_count = min(days), max(days), count
        invoice.save(update_fields=["period_start", "period_end", "row_count"])
    return invoice


# --- Comparison ---------------------------------------------------------------------------------


@dataclass
class ReconciliationCell:
    """One (UTC day, resource or service) of the comparison."""

    day: date
    key: str
    tolerance: Decimal
    invoice_amount: Decimal = Decimal("0")
    ledger_amount: Decimal = Decimal("0")
    invoice_lines: int = 0
    ledger_rows: int = 0
    services: set[str] = field(default_factory=set)

    @property
    def difference(self) -> Decimal:
        """Invoice minus ledger: positive when the provider charged more than Switchyard recorded."""
        return self.invoice_amount - self.ledger_amount

    @property
    def mismatch(self) -> bool:
        return abs(self.difference) > self.tolerance


@dataclass(frozen=True)
class Reconciliation:
    invoice: InvoiceImport
    currency: str
    by_resource: list[ReconciliationCell]
    by_service: list[ReconciliationCell]
    # Ledger spend of this provider and period in other currencies: shown, not compared.
    other_currencies: dict[str, Decimal]

    @property
    def invoice_total(self) -> Decimal:
        return sum((c.invoice_amount for c in self.by_resource), Decimal("0"))

    @property
    def ledger_total(self) -> Decimal:
        return sum((c.ledger_amount for c in self.by_resource), Decimal("0"))

    @property
    def mismatches(self) -> list[ReconciliationCell]:
        return [c for c in self.by_resource if c.mismatch]

    @property
    def service_mismatches(self) -> list[ReconciliationCell]:
        return [c for c in self.by_service if c.mismatch]


def invoice_currency(invoice: InvoiceImport) -> str:
    return invoice.lines.values_list("currency", flat=True).first() or ""


def _day_bounds(first: date, last: date) -> tuple[datetime, datetime]:
    return (
        datetime.combine(first, time.min, tzinfo=UTC),
        datetime.combine(last + timedelta(days=1), time.min, tzinfo=UTC),
    )


def _ledger_groups(invoice: InvoiceImport) -> Iterator[dict[str, Any]]:
    """Ledger totals per (day, cluster, deployment, unit, currency) for the invoice's provider and days."""
    dims = ("day", "cluster__slug", "deployment__slug", "unit", "currency")
    yield from (
        DailyRollup.objects.filter(
            provider_id=invoice.provider_id, day__gte=invoice.period_start, day__lte=invoice.period_end
        )
        .values(*dims)
        .annotate(total=Sum("amount"), rows=Sum("row_count"))
        .order_by()
    )
    start, end = _day_bounds(invoice.period_start, invoice.period_end)
    yield from (
        UsageRecord.objects.filter(unfolded_rows())
        .filter(provider_id=invoice.provider_id, occurred_at__gte=start, occurred_at__lt=end)
        .annotate(day=TruncDate("occurred_at", tzinfo=UTC))
        .values(*dims)
        .annotate(total=Sum("amount"), rows=Count("id"))
        .order_by()
    )


def reconciliation_result(*, invoice: InvoiceImport, tolerance: Decimal | None = None) -> Reconciliation:
    """The invoice against the ledger, per (day, resource) and per (day, service)."""
    tolerance = invoice.tolerance if tolerance is None else tolerance
    currency = invoice_currency(invoice)
    by_resource: dict[tuple[date, str], ReconciliationCell] = {}
    by_service: dict[tuple[date, str], ReconciliationCell] = {}

    def cells(day: date, resource: str, service: str) -> tuple[ReconciliationCell, ReconciliationCell]:
        r = by_resource.setdefault((day, resource), ReconciliationCell(day, resource, tolerance))
        s = by_service.setdefault((day, service), ReconciliationCell(day, service, tolerance))
        r.services.add(service)
        return r, s

    invoice_groups = (
        invoice.lines.values("day", "resource_id", "service")
        .annotate(total=Sum("amount"), lines=Count("id"))
        .order_by()
    )
    for group in invoice_groups:
        for cell in cells(group["day"], group["resource_id"], invoice_service_name(group["service"])):
            cell.invoice_amount += group["total"]
            cell.invoice_lines += group["lines"]
    other: dict[str, Decimal] = {}
    for group in _ledger_groups(invoice):
        if group["currency"] != currency:
            other[group["currency"]] = other.get(group["currency"], Decimal("0")) + group["total"]
            continue
        resource = focus_resource(
            unit=group["unit"], cluster_slug=group["cluster__slug"], deployment_slug=group["deployment__slug"]
        )
        for cell in cells(group["day"], resource.resource_id, resource.service_name):
            cell.ledger_amount += group["total"]
            cell.ledger_rows += group["rows"]

    def ordered(found: dict[tuple[date, str], ReconciliationCell]) -> list[ReconciliationCell]:
        for cell in found.values():
            # Sums come back with backend-dependent exponents; show the ledger's 9 places everywhere.
            cell.invoice_amount = cell.invoice_amount.quantize(LEDGER_QUANTUM)
            cell.ledger_amount = cell.ledger_amount.quantize(LEDGER_QUANTUM)
        return [found[key] for key in sorted(found)]

    return Reconciliation(invoice, currency, ordered(by_resource), ordered(by_service), other)


@dataclass(frozen=True)
class CellRows:
    """What lies behind one cell: the invoice lines and (the first `limit` of) the ledger rows."""

    invoice_lines: list[InvoiceLine]
    ledger_rows: list[UsageRecord]
    ledger_row_count: int


def _ledger_rows_for_resource(resource_id: str) -> Q:
    # The inverse of billing.focus.focus_resource: the cluster slug wins, else the deployment slug.
    if not resource_id:
        return Q(cluster__isnull=True, deployment__isnull=True)
    return Q(cluster__slug=resource_id) | Q(cluster__isnull=True, deployment__slug=resource_id)


def reconciliation_cell_rows(
    *,
    invoice: InvoiceImport,
    day: date,
    resource_id: str | None = None,
    service: str | None = None,
    limit: int = 500,
) -> CellRows:
    """The invoice lines and ledger rows behind the (day, resource) or (day, service) cell."""
    if (resource_id is None) == (service is None):
        raise ValueError("name a resource or a service")
    lines: QuerySet[InvoiceLine] = invoice.lines.filter(day=day)
    start, end = _day_bounds(day, day)
    # Served by the (occurred_at, provider) index: one provider's rows of one day.
    ledger = UsageRecord.objects.filter(
        provider_id=invoice.provider_id,
        occurred_at__gte=start,
        occurred_at__lt=end,
        currency=invoice_currency(invoice),
    )
    if resource_id is not None:
        lines = lines.filter(resource_id=resource_id)
        ledger = ledger.filter(_ledger_rows_for_resource(resource_id))
    else:
        codes = [
            s
            for s in lines.values_list("service", flat=True).distinct()
            if invoice_service_name(s) == service
        ]
        lines = lines.filter(service__in=codes)
        ledger = ledger.filter(unit__in=[unit for unit, name in SERVICE_BY_UNIT.items() if name == service])
    ledger = ledger.select_related("cluster", "deployment", "price_book").order_by("occurred_at", "id")
    return CellRows(list(lines.order_by("line_number")), list(ledger[:limit]), ledger.count())


def invoice_imports() -> QuerySet[InvoiceImport]:
    """Every invoice import, newest first, with its provider and uploader."""
    return InvoiceImport.objects.select_related("provider", "uploaded_by")


def reconciliation_cell_params(params: Mapping[str, Any]) -> tuple[date, str | None, str | None] | None:
    """(day, resource, service) from ?day=...&resource=... or ?day=...&service=...; None if absent/bad."""
    try:
        day = date_parse(str(params.get("day", "")))
    except InputError:
        return None
    resource, service = params.get("resource"), params.get("service")
    if (resource is None) == (service is None):
        return None
    return day, resource, service
