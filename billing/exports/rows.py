"""Ledger rows as export rows (FOCUS values, streamed) and the summary a manifest states about them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

from billing.exports.columns import CHUNK_ROWS, COST, CURRENCY, PARTITION, PREV_HASH, ROW_HASH, SEQUENCE, Row
from billing.exports.filters import ExportFilters, export_queryset
from billing.focus import FocusResource, focus_pricing_unit, focus_resource
from billing.models import Unit
from billing.money import ledger_text

_MICROS_PER_HOUR = Decimal(3_600_000_000)
_TAG_CACHE_SIZE = 10_000

# The ledger columns read per row, related names included (one query, no N+1).
_SOURCE_FIELDS = (
    "id",
    "partition",
    "sequence",
    "occurred_at",
    "subject_type",
    "subject_id",
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
    "team",
    "provider__slug",
    "provider__display_name",
    "cluster__slug",
    "deployment__slug",
    "workflow__slug",
    "api_key__prefix",
)


def export_rows(*, filters: ExportFilters, chunk_size: int = CHUNK_ROWS) -> Iterator[Row]:
    """Export rows (tuples in COLUMNS order), streamed from a server-side cursor."""
    source = export_queryset(filters=filters).values_list(*_SOURCE_FIELDS).iterator(chunk_size=chunk_size)
    resources: dict[tuple[str, str | None, str | None], FocusResource] = {}
    pricing_units: dict[str, str] = {}
    # Many rows share a subject (a training run bills every chunk): encode its Tags once.
    tag_texts: dict[tuple[str, str, str, str | None], str] = {}
    for (
        record_id,
        partition,
        sequence,
        occurred_at,
        subject_type,
        subject_id,
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
        team,
        provider_slug,
        provider_name,
        cluster_slug,
        deployment_slug,
        workflow_slug,
        api_key_prefix,
    ) in source:
        key = (unit, cluster_slug, deployment_slug)
        resource = resources.get(key)
        if resource is None:
            resource = resources[key] = focus_resource(
                unit=unit, cluster_slug=cluster_slug, deployment_slug=deployment_slug
            )
        pricing_unit = pricing_units.get(unit)
        if pricing_unit is None:
            pricing_unit = pricing_units[unit] = focus_pricing_unit(unit)
        period_start = occurred_at
        if unit == Unit.ACCELERATOR_HOUR:
            micros = (abs(quantity) * _MICROS_PER_HOUR).to_integral_value()
            period_start = occurred_at - timedelta(microseconds=int(micros))
        tag_key = (subject_type, subject_id, team, workflow_slug)
        tags = tag_texts.get(tag_key)
        if tags is None:
            if len(tag_texts) >= _TAG_CACHE_SIZE:
                tag_texts.clear()  # bounded: memory stays constant however many subjects
            tags = tag_texts[tag_key] = _tags_text(
                {
                    "subject": f"{subject_type}:{subject_id}",
                    "team": team or None,
                    "training_run": subject_id if subject_type == "training_run" else None,
                    "workflow": workflow_slug,
                }
            )
        yield (
            amount,
            amount,  # EffectiveCost: no discounts or credits are applied after the fact
            unit_price,
            quantity,
            pricing_unit,
            period_start,
            occurred_at,
            currency,
            provider_name or provider_slug or "",
            resource.service_name,
            resource.resource_id,
            resource.resource_type,
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
            api_key_prefix or "",
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


def _tags_text(tags: Mapping[str, Any]) -> str:
    return json.dumps(tags, sort_keys=True, separators=(",", ":"))
