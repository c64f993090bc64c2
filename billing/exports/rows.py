"""Ledger rows as export rows (FOCUS values, streamed) and the summary a manifest states about them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

from billing.exports.columns import CHUNK_ROWS, COST, CURRENCY, PARTITION, PREV_HASH, ROW_HASH, SEQUENCE, Row
from billing.exports.filters import ExportFilters, export_queryset
from billing.focus import (
    CHARGE_CATEGORY,
    CHARGE_CLASS_CORRECTION,
    CHARGE_FREQUENCY,
    TAG_FIELDS,
    focus_billing_account,
    focus_billing_period,
    focus_charge_description,
    focus_charge_period,
    focus_resource,
    focus_tags,
    unit_terms,
)
from billing.models import Unit
from billing.money import ledger_text

_MICROS_PER_HOUR = Decimal(3_600_000_000)
_TAG_CACHE_SIZE = 10_000

# The ledger columns read per row, related names included (one query, no N+1).
_BASE_FIELDS = (
    "id",
    "partition",
    "sequence",
    "occurred_at",
    "subject_type",
    "subject_id",
    "description",
    "quantity",
    "unit",
    "unit_price",
    "amount",
    "currency",
    "price_book_id",
    "price_book__version",
    "row_hash",
    "prev_hash",
    "idempotency_key",
    "reverses_id",
    "provider__slug",
    "provider__display_name",
    "provider__region",
    "cluster__slug",
    "cluster__region",
    "deployment__slug",
    "cost_avoided",
)
# Tags read the fields TAG_FIELDS names ("subject" and "training_run" are made here, below).
_TAG_SOURCE_FIELDS = tuple(
    f for _, f in TAG_FIELDS if f not in _BASE_FIELDS and f not in ("subject", "training_run")
)
_SOURCE_FIELDS = _BASE_FIELDS + _TAG_SOURCE_FIELDS
# The x_ApiKey column reads the key's prefix, which Tags read too (TAG_FIELDS).
_API_KEY_AT = _SOURCE_FIELDS.index("api_key__prefix")


@dataclass(frozen=True)
class _Dimensions:
    """The values of a row that depend only on its unit, resource and provider (cached per export)."""

    pricing_unit: str
    consumed_unit: str
    consumed_per_priced: Decimal
    description: str
    provider_name: str
    service_category: str
    service_subcategory: str
    service_name: str
    resource_id: str | None
    resource_name: str | None
    resource_type: str | None
    region: str | None
    sku_id: str
    sku_meter: str


def _dimensions(
    *,
    unit: str,
    cluster_slug: str | None,
    deployment_slug: str | None,
    provider_slug: str | None,
    provider_name: str | None,
    region: str | None,
    account_name: str,
) -> _Dimensions:
    terms = unit_terms(unit)
    resource = focus_resource(unit=unit, cluster_slug=cluster_slug, deployment_slug=deployment_slug)
    if resource.resource_id:
        sku_id = f"{resource.resource_type}/{resource.resource_id}/{unit}"
    else:
        sku_id = f"provider/{provider_slug or ''}/{unit}"
    return _Dimensions(
        pricing_unit=terms.pricing_unit,
        consumed_unit=terms.consumed_unit,
        consumed_per_priced=terms.consumed_per_priced,
        description=focus_charge_description(unit),
        provider_name=provider_name or provider_slug or account_name,
        service_category=terms.service_category,
        service_subcategory=terms.service_subcategory,
        service_name=resource.service_name,
        resource_id=resource.resource_id or None,
        resource_name=resource.resource_id or None,
        resource_type=resource.resource_type or None,
        region=region or None,
        sku_id=sku_id,
        sku_meter=terms.sku_meter,
    )


def export_rows(*, filters: ExportFilters, chunk_size: int = CHUNK_ROWS) -> Iterator[Row]:
    """Export rows (tuples in COLUMNS order), streamed from a server-side cursor."""
    source = export_queryset(filters=filters).values_list(*_SOURCE_FIELDS).iterator(chunk_size=chunk_size)
    account_id, account_name = focus_billing_account()
    dimensions: dict[tuple[Any, ...], _Dimensions] = {}
    # Many rows share a subject (a training run bills every chunk): encode its Tags once.
    tag_texts: dict[tuple[Any, ...], str] = {}
    for values in source:
        (
            record_id,
            partition,
            sequence,
            occurred_at,
            subject_type,
            subject_id,
            description,
            quantity,
            unit,
            unit_price,
            amount,
            currency,
            price_book_id,
            price_book_version,
            row_hash,
            prev_hash,
            idempotency_key,
            reverses_id,
            provider_slug,
            provider_name,
            provider_region,
            cluster_slug,
            cluster_region,
            deployment_slug,
            cost_avoided,
        ) = values[: len(_BASE_FIELDS)]
        region = cluster_region or provider_region
        key = (unit, cluster_slug, deployment_slug, provider_slug, provider_name, region)
        dims = dimensions.get(key)
        if dims is None:
            dims = dimensions[key] = _dimensions(
                unit=unit,
                cluster_slug=cluster_slug,
                deployment_slug=deployment_slug,
                provider_slug=provider_slug,
                provider_name=provider_name,
                region=region,
                account_name=account_name,
            )
        period_start = occurred_at
        if unit == Unit.ACCELERATOR_HOUR:
            micros = (abs(quantity) * _MICROS_PER_HOUR).to_integral_value()
            period_start = occurred_at - timedelta(microseconds=int(micros))
        charge_start, charge_end = focus_charge_period(start=period_start, end=occurred_at)
        billing_start, billing_end = focus_billing_period(charge_start)
        tag_key = (subject_type, subject_id, *values[len(_BASE_FIELDS) :])
        tags = tag_texts.get(tag_key)
        if tags is None:
            if len(tag_texts) >= _TAG_CACHE_SIZE:
                tag_texts.clear()  # bounded: memory stays constant however many subjects
            source_values = dict(zip(_SOURCE_FIELDS, values, strict=True))
            source_values["subject"] = f"{subject_type}:{subject_id}"
            source_values["training_run"] = subject_id if subject_type == "training_run" else None
            tags = tag_texts[tag_key] = focus_tags(source_values)
        yield (
            amount,  # BilledCost
            amount,  # EffectiveCost: no discounts or credits are applied after the fact
            amount,  # ListCost: the price book is the published list price
            amount,  # ContractedCost: no negotiated rates beside the price book
            unit_price,
            quantity,
            dims.pricing_unit,
            quantity * dims.consumed_per_priced,
            dims.consumed_unit,
            charge_start,
            charge_end,
            billing_start,
            billing_end,
            CHARGE_CATEGORY,
            CHARGE_CLASS_CORRECTION if reverses_id is not None else None,
            description or dims.description,
            CHARGE_FREQUENCY,
            account_id,
            account_name,
            currency,
            None,  # InvoiceId: the ledger is not an invoice; reconciliation matches invoices later
            dims.provider_name,
            dims.provider_name,  # PublisherName
            dims.provider_name,  # InvoiceIssuerName
            dims.service_category,
            dims.service_subcategory,
            dims.service_name,
            dims.resource_id,
            dims.resource_name,
            dims.resource_type,
            dims.region,  # RegionId
            dims.region,  # RegionName: regions have no display name apart from their id
            dims.sku_id,
            f"price-book/{price_book_id}",  # SkuPriceId: one per price-book version
            dims.sku_meter,
            None,  # SkuPriceDetails: the price book holds no per-price properties beyond the columns
            tags,  # JSON text
            record_id,
            partition,
            sequence,
            price_book_id,
            price_book_version,
            row_hash,
            prev_hash,
            unit,
            idempotency_key,
            occurred_at,
            reverses_id,
            values[_API_KEY_AT] or "",  # x_ApiKey
            cost_avoided,  # x_CostAvoided
        )


@dataclass
class ChainSpan:
    """The rows of one partition's chain in an export: how many, and the lowest and highest.

    Rows come in time order, not chain order; `broken_links` counts rows next to each
    other in the file that are neighbours in the chain (sequence n and n + 1) whose
    x_PrevHash does not name the other's x_RowHash. Constant memory: only the
    previous row of the partition is kept.
    """

    row_count: int = 0
    first_sequence: int = 0
    first_row_hash: str = ""
    last_sequence: int = 0
    last_row_hash: str = ""
    broken_links: int = 0
    _previous: tuple[int, str, str] = (0, "", "")

    def add(self, *, sequence: int, row_hash: str, prev_hash: str) -> None:
        if self.row_count == 0 or sequence < self.first_sequence:
            self.first_sequence, self.first_row_hash = sequence, row_hash
        if self.row_count == 0 or sequence > self.last_sequence:
            self.last_sequence, self.last_row_hash = sequence, row_hash
        if self.row_count:
            before, before_hash, before_prev = self._previous
            if (sequence == before + 1 and prev_hash != before_hash) or (
                sequence == before - 1 and before_prev != row_hash
            ):
                self.broken_links += 1
        self._previous = (sequence, row_hash, prev_hash)
        self.row_count += 1

    def as_json(self) -> dict[str, Any]:
        return {
            "row_count": self.row_count,
            "first_sequence": self.first_sequence,
            "first_row_hash": self.first_row_hash,
            "last_sequence": self.last_sequence,
            "last_row_hash": self.last_row_hash,
        }


@dataclass
class ExportSummary:
    """What a manifest states about the rows: count, totals per currency, each partition's chain span."""

    row_count: int = 0
    totals: dict[str, Decimal] = field(default_factory=dict)
    partitions: dict[str, ChainSpan] = field(default_factory=dict)

    def add(
        self, *, cost: Decimal, currency: str, partition: str, sequence: int, row_hash: str, prev_hash: str
    ) -> None:
        self.row_count += 1
        self.totals[currency] = self.totals.get(currency, Decimal("0")) + cost
        span = self.partitions.get(partition)
        if span is None:
            span = self.partitions[partition] = ChainSpan()
        span.add(sequence=sequence, row_hash=row_hash, prev_hash=prev_hash)

    def as_json(self) -> dict[str, Any]:
        return {
            "row_count": self.row_count,
            "totals": {currency: ledger_text(total) for currency, total in sorted(self.totals.items())},
            "partitions": {p: span.as_json() for p, span in sorted(self.partitions.items())},
        }


def rows_counted(rows: Iterable[Row], summary: ExportSummary) -> Iterator[Row]:
    """The rows, unchanged, each added to `summary` as it passes."""
    for row in rows:
        summary.add(
            cost=row[COST],
            currency=row[CURRENCY],
            partition=row[PARTITION],
            sequence=row[SEQUENCE],
            row_hash=row[ROW_HASH],
            prev_hash=row[PREV_HASH],
        )
        yield row
