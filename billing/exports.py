"""Cost-audit exports of the usage ledger: FinOps FOCUS-style columns as CSV, JSON Lines and Parquet.

One row per ledger record, in chain order (partition, sequence), read with a
server-side cursor (`.values_list(...).iterator()`) so memory stays constant at
any size. Money and quantities are Decimal end to end: exact decimal strings in
CSV and JSON Lines, decimal128(28, 9) in Parquet, never float.

Choices worth knowing:
- ChargePeriodEnd is the record's occurred_at (work is billed when it finishes,
  e.g. a probe job at its end); ChargePeriodStart is occurred_at minus the
  quantity in hours for accelerator-hours, and equal to the end for every other
  unit (tokens, requests, storage, egress are point-in-time charges here).
- Every export is pinned to the ledger's head sequence when it starts
  (`through_sequence`), so a re-run of the same export job, or a concurrent
  append, can never change what it contains.
- The manifest is signed with HMAC-SHA256 under settings.EXPORT_SIGNING_KEY, or
  a key derived from SECRET_KEY with HKDF (info b"switchyard-export-manifest").
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import io
import json
import logging
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django import forms
from django.conf import settings
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from billing.focus import PRICING_UNIT, SERVICE_BY_UNIT, FocusResource, focus_pricing_unit, focus_resource
from billing.models import LEDGER_PARTITION, ExportJob, LedgerHead, Unit, UsageRecord
from stack.registry.errors import MultiFieldError
from stack.registry.models import Cluster, Provider, Workflow
from stack.registry.objectstore import default_store
from stack.registry.queues import CONTROL_QUEUE

if TYPE_CHECKING:
    from django.contrib.auth.models import User

logger = logging.getLogger(__name__)

FORMATS = ("csv", "jsonl", "parquet")
FILE_NAMES = {"csv": "usage.csv", "jsonl": "usage.jsonl", "parquet": "usage.parquet"}
CONTENT_TYPES = {
    "csv": "text/csv; charset=utf-8",
    "jsonl": "application/x-ndjson",
    "parquet": "application/vnd.apache.parquet",
    "json": "application/json",
}
MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1

FOCUS_COLUMNS = (
    "BilledCost",
    "EffectiveCost",
    "ListUnitPrice",
    "PricingQuantity",
    "PricingUnit",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "BillingCurrency",
    "ProviderName",
    "ServiceName",
    "ResourceId",
    "ResourceType",
    "Tags",
)
SWITCHYARD_COLUMNS = (
    "x_UsageRecordId",
    "x_Sequence",
    "x_PriceBookId",
    "x_PriceBookVersion",
    "x_RowHash",
    "x_PrevHash",
    "x_Unit",
    "x_IdempotencyKey",
)
COLUMNS = FOCUS_COLUMNS + SWITCHYARD_COLUMNS
DECIMAL_COLUMNS = frozenset({"BilledCost", "EffectiveCost", "ListUnitPrice", "PricingQuantity"})
TIME_COLUMNS = frozenset({"ChargePeriodStart", "ChargePeriodEnd"})
INT_COLUMNS = frozenset({"x_UsageRecordId", "x_Sequence", "x_PriceBookId", "x_PriceBookVersion"})
_COST = COLUMNS.index("BilledCost")
_CURRENCY = COLUMNS.index("BillingCurrency")
_TAGS = COLUMNS.index("Tags")
_SEQUENCE = COLUMNS.index("x_Sequence")
_ROW_HASH = COLUMNS.index("x_RowHash")

# Parquet: 28 digits with 9 after the point holds every ledger amount (24, 9) and any total.
PARQUET_PRECISION, PARQUET_SCALE = 28, 9
CHUNK_ROWS = 2000  # rows per database fetch and per streamed chunk
PARQUET_BATCH_ROWS = 10_000  # rows per Parquet record batch (and row group)
_MICROS_PER_HOUR = Decimal(3_600_000_000)
_TAG_CACHE_SIZE = 10_000

# The ledger columns read per row, related names included (one query, no N+1).
_SOURCE_FIELDS = (
    "id",
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
)

Row = tuple[Any, ...]  # one export row, values in COLUMNS order


# --- Filters ----------------------------------------------------------------------------------


class ExportFilterError(MultiFieldError, ValueError):
    """Filters that do not describe an export; `errors` maps each field to its messages."""

    def __init__(self, errors: Mapping[str, list[str]]) -> None:
        super().__init__(dict(errors))


@dataclass(frozen=True)
class ExportFilters:
    """Which ledger rows an export holds. Period: start <= occurred_at < end (UTC)."""

    start: datetime | None = None
    end: datetime | None = None
    provider: str = ""  # slugs
    cluster: str = ""
    workflow: str = ""
    team: str = ""
    training_run: str = ""  # subject_type "training_run" with this subject_id
    unit: str = ""
    partition: str = LEDGER_PARTITION
    # The ledger head when the export started: later appends are not part of it.
    through_sequence: int | None = None

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for name in FILTER_FIELDS:
            value = getattr(self, name)
            if isinstance(value, datetime):
                value = _iso(value)
            if value not in (None, ""):
                data[name] = value
        data["partition"] = self.partition
        if self.through_sequence is not None:
            data["through_sequence"] = self.through_sequence
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExportFilters:
        """Filters as stored on a job (already validated when the job was made)."""
        values: dict[str, Any] = {}
        for name in FILTER_FIELDS:
            if data.get(name) not in (None, ""):
                values[name] = data[name]
        for name in ("start", "end"):
            if name in values:
                values[name] = datetime.fromisoformat(values[name])
        return cls(
            **values,
            partition=data.get("partition", LEDGER_PARTITION),
            through_sequence=data.get("through_sequence"),
        )

    def pinned(self) -> ExportFilters:
        """These filters with the ledger head fixed, so the export cannot change under us."""
        if self.through_sequence is not None:
            return self
        head = LedgerHead.objects.filter(partition=self.partition).first()
        return replace(self, through_sequence=head.last_sequence if head is not None else 0)

    def file_stem(self) -> str:
        start = f"{self.start:%Y%m%dT%H%M%SZ}" if self.start else "beginning"
        end = f"{self.end:%Y%m%dT%H%M%SZ}" if self.end else "now"
        return f"switchyard-usage-{start}-{end}"


FILTER_FIELDS = ("start", "end", "provider", "cluster", "workflow", "team", "training_run", "unit")


class ExportFilterForm(forms.Form):
    """Validates export filters for the page, the API, the job API and the command alike."""

    start = forms.DateTimeField(
        required=False, help_text="UTC, inclusive: 2026-05-01 or 2026-05-01T00:00:00Z"
    )
    end = forms.DateTimeField(required=False, help_text="UTC, exclusive")
    provider = forms.ModelChoiceField(
        Provider.objects.order_by("slug"),
        to_field_name="slug",
        required=False,
        empty_label="any provider",
        error_messages={"invalid_choice": "no provider with slug %(value)s"},
    )
    cluster = forms.ModelChoiceField(
        Cluster.objects.order_by("slug"),
        to_field_name="slug",
        required=False,
        empty_label="any cluster",
        error_messages={"invalid_choice": "no cluster with slug %(value)s"},
    )
    workflow = forms.ModelChoiceField(
        Workflow.objects.order_by("slug"),
        to_field_name="slug",
        required=False,
        empty_label="any workflow",
        error_messages={"invalid_choice": "no workflow with slug %(value)s"},
    )
    team = forms.CharField(required=False, max_length=64)
    training_run = forms.CharField(required=False, max_length=64, label="Training run id")
    unit = forms.ChoiceField(
        required=False,
        choices=[("", "any unit"), *Unit.choices],
        error_messages={"invalid_choice": "unknown unit %(value)s; one of " + ", ".join(Unit.values)},
    )

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        start, end = cleaned.get("start"), cleaned.get("end")
        if start is not None and end is not None and end <= start:
            self.add_error("end", "end must be after start")
        return cleaned

    def filters(self) -> ExportFilters:
        data = self.cleaned_data
        return ExportFilters(
            start=data["start"].astimezone(UTC) if data.get("start") else None,
            end=data["end"].astimezone(UTC) if data.get("end") else None,
            provider=data["provider"].slug if data.get("provider") else "",
            cluster=data["cluster"].slug if data.get("cluster") else "",
            workflow=data["workflow"].slug if data.get("workflow") else "",
            team=data.get("team") or "",
            training_run=data.get("training_run") or "",
            unit=data.get("unit") or "",
        )


def export_filters_parse(*, params: Mapping[str, Any], ignore: Iterable[str] = ()) -> ExportFilters:
    """Filters from query parameters or a JSON object; ExportFilterError names each bad field.

    Unknown names are refused: a misspelt filter must not silently export everything.
    """
    skip = set(ignore)
    unknown = sorted(k for k in params if k not in FILTER_FIELDS and k not in skip)
    form = ExportFilterForm(data={k: params[k] for k in params if k in FILTER_FIELDS})
    valid = form.is_valid()
    errors: dict[str, list[str]] = {name: [str(m) for m in msgs] for name, msgs in form.errors.items()}
    for name in unknown:
        errors[name] = [f"unknown filter; use {', '.join(FILTER_FIELDS)}"]
    if errors or not valid:
        raise ExportFilterError(errors)
    return form.filters()


def export_queryset(*, filters: ExportFilters) -> QuerySet[UsageRecord]:
    """The ledger rows an export holds, in chain order."""
    rows = UsageRecord.objects.filter(partition=filters.partition)
    if filters.start is not None:
        rows = rows.filter(occurred_at__gte=filters.start)
    if filters.end is not None:
        rows = rows.filter(occurred_at__lt=filters.end)
    for name in ("provider", "cluster", "workflow"):
        if getattr(filters, name):
            rows = rows.filter(**{f"{name}__slug": getattr(filters, name)})
    if filters.team:
        rows = rows.filter(team=filters.team)
    if filters.training_run:
        rows = rows.filter(subject_type="training_run", subject_id=filters.training_run)
    if filters.unit:
        rows = rows.filter(unit=filters.unit)
    if filters.through_sequence is not None:
        rows = rows.filter(sequence__lte=filters.through_sequence)
    return rows.order_by("sequence")


# --- Rows -------------------------------------------------------------------------------------


def _iso(value: datetime) -> str:
    # Always six fractional digits, so every row has one fixed-width format
    # (and PostgreSQL's COPY path writes the very same text).
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def export_rows(*, filters: ExportFilters, chunk_size: int = CHUNK_ROWS) -> Iterator[Row]:
    """Export rows (tuples in COLUMNS order), streamed from a server-side cursor."""
    source = export_queryset(filters=filters).values_list(*_SOURCE_FIELDS).iterator(chunk_size=chunk_size)
    resources: dict[tuple[str, str | None, str | None], FocusResource] = {}
    pricing_units: dict[str, str] = {}
    # Many rows share a subject (a training run bills every chunk): encode its Tags once.
    tag_texts: dict[tuple[str, str, str, str | None], str] = {}
    for (
        record_id,
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
            sequence,
            price_book_id,
            price_book_version,
            row_hash,
            prev_hash,
            unit,
            idempotency_key,
        )


@dataclass
class ExportSummary:
    """What a manifest states about the rows: count, totals per currency, chain ends."""

    row_count: int = 0
    totals: dict[str, Decimal] = field(default_factory=dict)
    first_row_hash: str = ""
    last_row_hash: str = ""
    first_sequence: int | None = None
    last_sequence: int | None = None

    def add(self, *, cost: Decimal, currency: str, sequence: int, row_hash: str) -> None:
        if self.row_count == 0:
            self.first_row_hash, self.first_sequence = row_hash, sequence
        self.row_count += 1
        self.totals[currency] = self.totals.get(currency, Decimal("0")) + cost
        self.last_row_hash, self.last_sequence = row_hash, sequence

    def as_json(self) -> dict[str, Any]:
        return {
            "row_count": self.row_count,
            "totals": {currency: _decimal_text(total) for currency, total in sorted(self.totals.items())},
            "first_row_hash": self.first_row_hash,
            "last_row_hash": self.last_row_hash,
            "first_sequence": self.first_sequence,
            "last_sequence": self.last_sequence,
        }


def _counted(rows: Iterable[Row], summary: ExportSummary) -> Iterator[Row]:
    for row in rows:
        summary.add(
            cost=row[_COST], currency=row[_CURRENCY], sequence=row[_SEQUENCE], row_hash=row[_ROW_HASH]
        )
        yield row


def _decimal_text(value: Decimal) -> str:
    # Fixed-point, never exponent notation: 0E-9 would read as a float to some tools.
    return format(value, "f")


def _tags_text(tags: Mapping[str, Any]) -> str:
    return json.dumps(tags, sort_keys=True, separators=(",", ":"))


# --- Writers ----------------------------------------------------------------------------------


def _text_cells(row: Row) -> list[Any]:
    cost, effective, price, quantity, pricing_unit, start, end = row[:7]
    return [
        _decimal_text(cost),
        _decimal_text(effective),
        _decimal_text(price),
        _decimal_text(quantity),
        pricing_unit,
        _iso(start),
        _iso(end),
        *row[7:],
    ]


def csv_chunks(rows: Iterable[Row], *, rows_per_chunk: int = CHUNK_ROWS) -> Iterator[bytes]:
    """CSV (header first), encoded, a chunk of rows at a time."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    pending = 0
    for row in rows:
        writer.writerow(_text_cells(row))
        pending += 1
        if pending >= rows_per_chunk:
            yield buffer.getvalue().encode()
            buffer.seek(0)
            buffer.truncate()
            pending = 0
    yield buffer.getvalue().encode()


def jsonl_chunks(rows: Iterable[Row], *, rows_per_chunk: int = CHUNK_ROWS) -> Iterator[bytes]:
    """JSON Lines: one object per row; money as exact decimal strings, Tags as an object."""
    lines: list[str] = []
    before, after = COLUMNS[:_TAGS], COLUMNS[_TAGS + 1 :]
    for row in rows:
        cells = _text_cells(row)
        # Tags is already JSON text: splice it in as an object, keeping the column order.
        head = json.dumps(dict(zip(before, cells[:_TAGS], strict=True)), separators=(",", ":"))
        tail = json.dumps(dict(zip(after, cells[_TAGS + 1 :], strict=True)), separators=(",", ":"))
        lines.append(f'{head[:-1]},"Tags":{row[_TAGS]},{tail[1:]}')
        if len(lines) >= rows_per_chunk:
            yield ("\n".join(lines) + "\n").encode()
            lines = []
    if lines:
        yield ("\n".join(lines) + "\n").encode()


def _parquet_schema() -> Any:
    import pyarrow as pa  # lazily: the web process rarely needs it

    money = pa.decimal128(PARQUET_PRECISION, PARQUET_SCALE)
    when = pa.timestamp("us", tz="UTC")
    types = {
        **dict.fromkeys(DECIMAL_COLUMNS, money),
        **dict.fromkeys(TIME_COLUMNS, when),
        **dict.fromkeys(INT_COLUMNS, pa.int64()),
    }
    return pa.schema([(name, types.get(name, pa.string())) for name in COLUMNS])


def parquet_write(
    rows: Iterable[Row], sink: str | Path | Any, *, batch_rows: int = PARQUET_BATCH_ROWS
) -> None:
    """Parquet through pyarrow's ParquetWriter, one record batch (row group) at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _parquet_schema()
    columns: list[list[Any]] = [[] for _ in COLUMNS]

    def flush(writer: Any) -> None:
        arrays = [pa.array(values, type=schema.field(i).type) for i, values in enumerate(columns)]
        writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
        for values in columns:
            values.clear()

    with pq.ParquetWriter(sink, schema) as writer:
        for row in rows:
            for i, value in enumerate(row):
                columns[i].append(value)
            if len(columns[0]) >= batch_rows:
                flush(writer)
        if columns[0]:
            flush(writer)


def _write_format(fmt: str, rows: Iterable[Row], path: Path) -> None:
    if fmt == "parquet":
        parquet_write(rows, str(path))
        return
    chunks = csv_chunks(rows) if fmt == "csv" else jsonl_chunks(rows)
    with path.open("wb") as fh:
        for chunk in chunks:
            fh.write(chunk)


def export_stream(*, filters: ExportFilters, fmt: str) -> Iterator[bytes]:
    """An export as a stream of bytes (CSV or JSON Lines), for HTTP responses."""
    if fmt == "csv" and connection.vendor == "postgresql":
        return _postgres_csv_chunks(filters.pinned())
    rows = export_rows(filters=filters.pinned())
    if fmt == "csv":
        return csv_chunks(rows)
    if fmt == "jsonl":
        return jsonl_chunks(rows)
    raise ValueError(f"cannot stream {fmt!r}; use csv or jsonl (Parquet needs a seekable file)")


def _sql_case(column: str, mapping: Mapping[str, str], default: str) -> str:
    whens = " ".join(f"WHEN '{key}' THEN '{value}'" for key, value in mapping.items())
    return f"CASE {column} {whens} ELSE {default} END"


def _sql_iso(expression: str) -> str:
    """_iso() in SQL."""
    return f"""to_char(({expression}) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""


def _postgres_csv_chunks(filters: ExportFilters) -> Iterator[bytes]:
    """The CSV export, written by PostgreSQL itself (COPY ... TO STDOUT).

    Several times faster than formatting rows in Python, in constant memory:
    the server streams the CSV and we pass its chunks on. Same columns, values
    and order as csv_chunks(export_rows(...)); the text differs only where CSV
    and JSON allow it (PostgreSQL quotes an empty string as "", and writes
    non-ASCII in Tags as itself rather than as \\u escapes).
    """
    period_start = (
        "CASE WHEN u.unit = 'accelerator_hour' "
        "THEN u.occurred_at - make_interval(secs => round(abs(u.quantity) * 3600, 6)) "
        "ELSE u.occurred_at END"
    )
    tags = (
        """'{"subject":' || to_json(u.subject_type || ':' || u.subject_id)::text"""
        """ || ',"team":' || coalesce(to_json(nullif(u.team, ''))::text, 'null')"""
        """ || ',"training_run":' || CASE WHEN u.subject_type = 'training_run'"""
        """ THEN to_json(u.subject_id)::text ELSE 'null' END"""
        """ || ',"workflow":' || coalesce(to_json(w.slug)::text, 'null') || '}'"""
    )
    resource_id = "coalesce(nullif(c.slug, ''), nullif(d.slug, ''), '')"
    resource_type = (
        "CASE WHEN coalesce(c.slug, '') <> '' THEN 'cluster' "
        "WHEN coalesce(d.slug, '') <> '' THEN 'deployment' ELSE '' END"
    )
    expressions = {
        "BilledCost": "u.amount::text",
        "EffectiveCost": "u.amount::text",
        "ListUnitPrice": "u.unit_price::text",
        "PricingQuantity": "u.quantity::text",
        "PricingUnit": _sql_case("u.unit", {k.value: v for k, v in PRICING_UNIT.items()}, "u.unit"),
        "ChargePeriodStart": _sql_iso(period_start),
        "ChargePeriodEnd": _sql_iso("u.occurred_at"),
        "BillingCurrency": "u.currency",
        "ProviderName": "coalesce(nullif(p.display_name, ''), p.slug, '')",
        "ServiceName": _sql_case("u.unit", {k.value: v for k, v in SERVICE_BY_UNIT.items()}, "'Other'"),
        "ResourceId": resource_id,
        "ResourceType": resource_type,
        "Tags": tags,
        "x_UsageRecordId": "u.id",
        "x_Sequence": "u.sequence",
        "x_PriceBookId": "u.price_book_id",
        "x_PriceBookVersion": "pb.version",
        "x_RowHash": "u.row_hash",
        "x_PrevHash": "u.prev_hash",
        "x_Unit": "u.unit",
        "x_IdempotencyKey": "u.idempotency_key",
    }
    select = ", ".join(f'{expressions[name]} AS "{name}"' for name in COLUMNS)
    where: list[str] = ["u.partition = %s"]
    params: list[object] = [filters.partition]
    for condition, value in (
        ("u.occurred_at >= %s", filters.start),
        ("u.occurred_at < %s", filters.end),
        ("p.slug = %s", filters.provider),
        ("c.slug = %s", filters.cluster),
        ("w.slug = %s", filters.workflow),
        ("u.team = %s", filters.team),
        ("u.unit = %s", filters.unit),
        ("u.sequence <= %s", filters.through_sequence),
    ):
        if value not in (None, ""):
            where.append(condition)
            params.append(value)
    if filters.training_run:
        where.append("u.subject_type = 'training_run' AND u.subject_id = %s")
        params.append(filters.training_run)
    sql = (
        f"COPY (SELECT {select} FROM billing_usagerecord u "  # noqa: S608 (constants; values are bound)
        "JOIN billing_pricebook pb ON pb.id = u.price_book_id "
        "LEFT JOIN stack_provider p ON p.id = u.provider_id "
        "LEFT JOIN stack_cluster c ON c.id = u.cluster_id "
        "LEFT JOIN stack_deployment d ON d.id = u.deployment_id "
        "LEFT JOIN stack_workflow w ON w.id = u.workflow_id "
        f"WHERE {' AND '.join(where)} ORDER BY u.partition, u.sequence) TO STDOUT WITH (FORMAT csv, HEADER true)"
    )
    with connection.cursor() as cursor, cursor.cursor.copy(sql, params) as copy:
        for block in copy:
            yield bytes(block)


def export_parquet_tempfile(*, filters: ExportFilters) -> Any:
    """A Parquet export in an anonymous temporary file (disk, not memory), rewound for reading.

    Parquet writes its footer last, so it cannot go out as it is made; the
    caller streams the file and closing it deletes it.
    """
    handle = tempfile.TemporaryFile(prefix="switchyard-export-")  # noqa: SIM115 (the response closes it)
    try:
        parquet_write(export_rows(filters=filters.pinned()), handle)
        handle.seek(0)
    except BaseException:
        handle.close()
        raise
    return handle


# --- Manifest ---------------------------------------------------------------------------------


def export_signing_key() -> bytes:
    configured: str = getattr(settings, "EXPORT_SIGNING_KEY", "")
    if configured:
        return configured.encode()
    # A dedicated key derived from SECRET_KEY, never SECRET_KEY itself.
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"switchyard-export-manifest").derive(
        settings.SECRET_KEY.encode()
    )


def _manifest_body(manifest: Mapping[str, Any]) -> bytes:
    unsigned = {k: v for k, v in manifest.items() if k != "signature"}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def manifest_sign(manifest: Mapping[str, Any]) -> dict[str, Any]:
    digest = hmac.new(export_signing_key(), _manifest_body(manifest), hashlib.sha256).hexdigest()
    return {**manifest, "signature": {"algorithm": "HMAC-SHA256", "value": digest}}


def manifest_signature_ok(manifest: Mapping[str, Any]) -> bool:
    signature = manifest.get("signature")
    if not isinstance(signature, dict) or signature.get("algorithm") != "HMAC-SHA256":
        return False
    expected = hmac.new(export_signing_key(), _manifest_body(manifest), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, str(signature.get("value", "")))


def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def _file_digest(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def _clean_formats(formats: Sequence[str]) -> list[str]:
    cleaned = list(dict.fromkeys(formats))  # de-duplicated, order kept
    if not cleaned:
        raise ExportFilterError({"formats": ["choose at least one of " + ", ".join(FORMATS)]})
    bad = [f for f in cleaned if f not in FORMATS]
    if bad:
        raise ExportFilterError({"formats": [f"unknown format {bad[0]!r}; one of " + ", ".join(FORMATS)]})
    return cleaned


def export_write_files(
    *, filters: ExportFilters, formats: Sequence[str], directory: Path, job_id: int | None = None
) -> dict[str, Any]:
    """Write each format's file and a signed manifest.json into `directory`; return the manifest.

    Each format is a separate pass over the ledger (constant memory); the
    export is pinned to a ledger sequence, so every pass reads the same rows.
    """
    formats = _clean_formats(formats)
    filters = filters.pinned()
    directory.mkdir(parents=True, exist_ok=True)
    summary: ExportSummary | None = None
    files: dict[str, dict[str, Any]] = {}
    for fmt in formats:
        this_pass = ExportSummary()
        path = directory / FILE_NAMES[fmt]
        _write_format(fmt, _counted(export_rows(filters=filters), this_pass), path)
        if summary is not None and this_pass.as_json() != summary.as_json():
            raise RuntimeError("the ledger rows changed between passes of one export")
        summary = this_pass
        sha256, size = _file_digest(path)
        files[FILE_NAMES[fmt]] = {"format": fmt, "sha256": sha256, "size": size}
    assert summary is not None  # noqa: S101 (at least one format, checked above)
    manifest = manifest_sign(
        {
            "version": MANIFEST_VERSION,
            "job_id": job_id,
            "generated_at": _iso(timezone.now()),
            "filters": filters.as_json(),
            "columns": list(COLUMNS),
            **summary.as_json(),
            "files": files,
        }
    )
    (directory / MANIFEST_NAME).write_bytes(manifest_bytes(manifest))
    return manifest


# --- Verification -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportCheck:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{self.name}: {'ok' if self.ok else 'MISMATCH'}: {self.detail}"


def _tally_csv(path: Path) -> ExportSummary:
    summary = ExportSummary()
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or tuple(header) != COLUMNS:
            raise ValueError("the header is not the export's column set")
        for cells in reader:
            summary.add(
                cost=Decimal(cells[_COST]),
                currency=cells[_CURRENCY],
                sequence=int(cells[_SEQUENCE]),
                row_hash=cells[_ROW_HASH],
            )
    return summary


def _tally_jsonl(path: Path) -> ExportSummary:
    summary = ExportSummary()
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            row = json.loads(line)
            summary.add(
                cost=Decimal(row["BilledCost"]),
                currency=row["BillingCurrency"],
                sequence=int(row["x_Sequence"]),
                row_hash=row["x_RowHash"],
            )
    return summary


def _tally_parquet(path: Path) -> ExportSummary:
    import pyarrow.parquet as pq

    summary = ExportSummary()
    wanted = ["BilledCost", "BillingCurrency", "x_Sequence", "x_RowHash"]
    parquet = pq.ParquetFile(str(path))
    if parquet.schema_arrow.field("BilledCost").type != _parquet_schema().field("BilledCost").type:
        raise ValueError("BilledCost is not decimal128(28, 9)")
    for batch in parquet.iter_batches(columns=wanted, batch_size=PARQUET_BATCH_ROWS):
        data = batch.to_pydict()
        for cost, currency, sequence, row_hash in zip(*(data[c] for c in wanted), strict=True):
            summary.add(cost=cost, currency=currency, sequence=sequence, row_hash=row_hash)
    return summary


_TALLIES = {"csv": _tally_csv, "jsonl": _tally_jsonl, "parquet": _tally_parquet}


def export_verify(*, manifest_path: Path, directory: Path | None = None) -> list[ExportCheck]:
    """Check a downloaded export against its manifest: signature, each file's sha256 and
    size, then each file re-read to recount rows and re-sum totals per currency."""
    directory = directory or manifest_path.parent
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        return [ExportCheck(manifest_path.name, False, f"cannot read the manifest: {exc}")]
    checks = [
        ExportCheck(
            "signature",
            manifest_signature_ok(manifest),
            "HMAC-SHA256 matches"
            if manifest_signature_ok(manifest)
            else "HMAC-SHA256 does not match: the manifest was changed or signed with another key",
        )
    ]
    expected = {k: manifest.get(k) for k in ExportSummary().as_json()}
    for name, meta in sorted(manifest.get("files", {}).items()):
        path = directory / name
        if not path.is_file():
            checks.append(ExportCheck(name, False, f"missing from {directory}"))
            continue
        sha256, size = _file_digest(path)
        if (sha256, size) != (meta.get("sha256"), meta.get("size")):
            checks.append(
                ExportCheck(
                    name,
                    False,
                    f"sha256 {sha256[:16]}… size {size} differs from the manifest's "
                    f"{str(meta.get('sha256'))[:16]}… size {meta.get('size')}",
                )
            )
        else:
            checks.append(ExportCheck(name, True, f"sha256 and size ({size} bytes) match"))
        try:
            tally = _TALLIES[meta["format"]](path).as_json()
        except (KeyError, ValueError, InvalidOperation, IndexError, OSError) as exc:
            checks.append(
                ExportCheck(f"{name} rows", False, f"cannot be re-read: {type(exc).__name__}: {exc}")
            )
            continue
        differs = [k for k in expected if tally[k] != expected[k]]
        totals = ", ".join(f"{c} {t}" for c, t in tally["totals"].items()) or "no money"
        if differs:
            checks.append(
                ExportCheck(
                    f"{name} rows",
                    False,
                    "; ".join(f"{k} is {tally[k]!r}, manifest says {expected[k]!r}" for k in differs),
                )
            )
        else:
            checks.append(
                ExportCheck(
                    f"{name} rows", True, f"{tally['row_count']} rows, totals {totals}, chain ends match"
                )
            )
    return checks


# --- Export jobs ------------------------------------------------------------------------------


def export_job_create(
    *, created_by: User | None, filters: ExportFilters, formats: Sequence[str]
) -> ExportJob:
    """Record an export job and run it on the control queue once the transaction commits."""
    from billing.tasks import export_job_run_task

    job = ExportJob.objects.create(
        created_by=created_by, filters=filters.pinned().as_json(), formats=_clean_formats(formats)
    )
    job_id = job.pk
    transaction.on_commit(lambda: export_job_run_task.apply_async(args=(job_id,), queue=CONTROL_QUEUE))
    return job


def export_job_prefix(job_id: int) -> str:
    return f"exports/{job_id}/"


def export_job_claim(*, job_id: int) -> bool:
    """Claim a job to run: True unless it is finished or gone.

    A job still `running` is claimed again: its worker died and the broker
    redelivered the message; the run starts over and overwrites the same keys.
    """
    claimed = ExportJob.objects.filter(
        pk=job_id, status__in=[ExportJob.Status.PENDING, ExportJob.Status.RUNNING]
    ).update(status=ExportJob.Status.RUNNING, started_at=timezone.now(), error="")
    return claimed == 1


def export_job_run(*, job_id: int) -> ExportJob | None:
    """Run an export job: files and a signed manifest under exports/<id>/ in the object store.

    Idempotent: a finished (or deleted) job is a no-op and returns None.
    """
    if not export_job_claim(job_id=job_id):
        return None
    job = ExportJob.objects.get(pk=job_id)
    prefix = export_job_prefix(job_id)
    try:
        with tempfile.TemporaryDirectory(prefix="switchyard-export-") as tmp:
            manifest = export_write_files(
                filters=ExportFilters.from_json(job.filters),
                formats=job.formats,
                directory=Path(tmp),
                job_id=job_id,
            )
            store = default_store()
            # Data files first: a manifest in the store means its files are there too.
            for name in manifest["files"]:
                store.put_file(prefix + name, Path(tmp) / name)
            store.put_file(prefix + MANIFEST_NAME, Path(tmp) / MANIFEST_NAME)
    except Exception as exc:
        logger.exception("export job %s failed", job_id)
        ExportJob.objects.filter(pk=job_id, status=ExportJob.Status.RUNNING).update(
            status=ExportJob.Status.FAILED, finished_at=timezone.now(), error=f"{type(exc).__name__}: {exc}"
        )
        return ExportJob.objects.filter(pk=job_id).first()
    ExportJob.objects.filter(pk=job_id, status=ExportJob.Status.RUNNING).update(
        status=ExportJob.Status.SUCCEEDED,
        finished_at=timezone.now(),
        object_prefix=prefix,
        manifest=manifest,
        row_count=manifest["row_count"],
    )
    return ExportJob.objects.filter(pk=job_id).first()


def export_job_file_names(job: ExportJob) -> list[str]:
    """The files a finished job offers for download, manifest first."""
    if job.status != ExportJob.Status.SUCCEEDED:
        return []
    return [MANIFEST_NAME, *sorted(job.manifest.get("files", {}))]


def export_job_file_chunks(*, job: ExportJob, name: str) -> Iterator[bytes]:
    """A finished job's file, read from the object store in chunks (ObjectNotFoundError if gone)."""
    if name not in export_job_file_names(job):
        raise LookupError(f"export #{job.pk} has no file {name!r}")
    return default_store().iter_chunks((job.object_prefix or export_job_prefix(job.pk)) + name)
