"""Import price versions from a CSV file or a provider catalog file (JSON).

CSV columns (a header row names them; order does not matter):

- target_type: cluster, deployment or provider;
- target: the slug of that cluster, deployment or provider;
- unit: one of billing.models.Unit (accelerator_hour, input_tokens_1m, ...);
- unit_price: a decimal ≥ 0, at most 9 decimal places;
- currency: three letters (ISO 4217, e.g. USD);
- effective_from: ISO 8601 with a UTC offset or Z (2026-05-01T00:00:00Z);
- effective_to: optional, same format, after effective_from;
- note: optional, at most 200 characters.

A catalog file is a JSON list of objects with the same fields; its errors name
the entry number (1-based) where a CSV's name the line.

Every row is validated before anything is written; on any error nothing is
imported and each error names its line and column. Otherwise every row is
published through billing.services.price_book_publish (the one way prices are
created) in one transaction. A row identical to a version that already exists
(same target, unit, effective_from, effective_to, unit_price and currency) is
skipped, so importing the same file twice adds nothing.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from billing.models import PriceBook, PriceSource, Unit, UsageRecord
from billing.selectors import PriceResolver
from billing.services import price_book_publish
from registry.models import Cluster, Deployment, Provider
from registry.validation import (
    InputError,
    JSONSyntaxError,
    currency_parse,
    datetime_parse,
    decimal_parse,
    json_parse,
    text_problem,
)

MAX_UPLOAD_BYTES = 20 * 1024 * 1024  # the largest file the pages and the API accept

PRICE_COLUMNS = (
    "target_type",
    "target",
    "unit",
    "unit_price",
    "currency",
    "effective_from",
    "effective_to",
    "note",
)
REQUIRED_COLUMNS = ("target_type", "target", "unit", "unit_price", "currency", "effective_from")
TARGET_TYPES = ("cluster", "deployment", "provider")
CATALOG_MAX_DEPTH = 3  # a list of objects of values; deeper is not a catalog
PRICE_MAX_DIGITS, PRICE_DECIMAL_PLACES = 24, 9  # PriceBook.unit_price
NOTE_MAX_LENGTH = 200


@dataclass(frozen=True)
class RowError:
    """One problem in an imported file: where (line or entry, column) and what."""

    line: int
    column: str
    message: str
    where: str = "line"

    def __str__(self) -> str:
        return f"{self.where} {self.line}, column {self.column}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "column": self.column, "message": self.message}


class FileImportError(ValueError):
    """The file has errors; nothing was imported. `errors` lists each one."""

    def __init__(self, errors: Sequence[RowError]) -> None:
        self.errors = list(errors)
        super().__init__(f"{len(self.errors)} error(s); nothing was imported")


@dataclass(frozen=True)
class PriceRow:
    line: int
    target_type: str
    target: Cluster | Deployment | Provider
    unit: str
    unit_price: Decimal
    currency: str
    effective_from: datetime
    effective_to: datetime | None
    note: str


@dataclass
class PriceImportResult:
    created: list[PriceBook] = field(default_factory=list)
    unchanged: int = 0


# --- Reading CSV, shared with billing.reconciliation ---------------------------------------------

MAX_CSV_FIELD_CHARS = 128 * 1024  # one cell; longer is refused naming its line and column
# The csv module's own field limit (128 KiB by default, one setting for the whole process) ends
# reading with a bare csv.Error that names neither line nor column. It is raised to the upload
# limit here, so no cell of an accepted file trips it, and csv_records refuses a cell longer
# than MAX_CSV_FIELD_CHARS itself, naming where it is.
csv.field_size_limit(max(csv.field_size_limit(), MAX_UPLOAD_BYTES))


def _cell_errors(line: int, cells: Sequence[str], columns: Sequence[str]) -> list[RowError]:
    errors = []
    for index, cell in enumerate(cells):
        column = columns[index] if index < len(columns) else f"{index + 1}"
        if len(cell) > MAX_CSV_FIELD_CHARS:
            errors.append(RowError(line, column, f"longer than {MAX_CSV_FIELD_CHARS} characters"))
        elif (problem := text_problem(cell)) is not None:
            errors.append(RowError(line, column, problem))
    return errors


def csv_records(text: str, errors: list[RowError]) -> tuple[list[str], Iterator[tuple[int, dict[str, str]]]]:
    """The header's column names and (line number, row) for each non-blank record.

    A record with a cell that cannot be taken (longer than MAX_CSV_FIELD_CHARS, or holding a
    control character) is not yielded: its errors, naming line and column, go to `errors`;
    a file that stops being CSV ends the records with one error there."""
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff")))
    try:
        header = next(reader, None)
    except csv.Error as exc:
        errors.append(RowError(reader.line_num or 1, "", f"not valid CSV: {exc}"))
        header = None
    columns = [name.strip() for name in header] if header else []
    header_errors = _cell_errors(1, columns, [f"{i + 1}" for i in range(len(columns))])
    if header_errors:
        errors.extend(header_errors)
        columns = []

    def records() -> Iterator[tuple[int, dict[str, str]]]:
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                errors.append(RowError(reader.line_num, "", f"not valid CSV: {exc}"))
                return
            line = reader.line_num
            if not any(cell.strip() for cell in cells):
                continue
            cell_errors = _cell_errors(line, cells, columns)
            if cell_errors:
                errors.extend(cell_errors)
                continue
            row = {name: cells[i] if i < len(cells) else "" for i, name in enumerate(columns)}
            if len(cells) > len(columns):
                row[""] = ",".join(cells[len(columns) :])
            yield line, row

    return columns, records() if columns else iter(())


# --- Validation ---------------------------------------------------------------------------------


def _targets(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str], Cluster | Deployment | Provider]:
    slugs: dict[str, set[str]] = {kind: set() for kind in TARGET_TYPES}
    for row in rows:
        kind = str(row.get("target_type") or "").strip()
        if kind in slugs:
            slugs[kind].add(str(row.get("target") or "").strip())
    found: dict[tuple[str, str], Cluster | Deployment | Provider] = {}
    for cluster in Cluster.objects.filter(slug__in=slugs["cluster"]):
        found["cluster", cluster.slug] = cluster
    for deployment in Deployment.objects.filter(slug__in=slugs["deployment"]):
        found["deployment", deployment.slug] = deployment
    for provider in Provider.objects.filter(slug__in=slugs["provider"]):
        found["provider", provider.slug] = provider
    return found


def _validate_row(
    line: int,
    raw: dict[str, Any],
    targets: dict[tuple[str, str], Cluster | Deployment | Provider],
    where: str,
) -> tuple[PriceRow | None, list[RowError]]:
    errors: list[RowError] = []

    def cell(name: str) -> str:
        value = raw.get(name)
        return "" if value is None else str(value).strip()

    def err(column: str, message: str) -> None:
        errors.append(RowError(line, column, message, where))

    for name in REQUIRED_COLUMNS:
        if not cell(name):
            err(name, "required")
    if raw.get(""):
        err("", f"more cells than the header has columns: {raw['']!r}")

    target: Cluster | Deployment | Provider | None = None
    kind, slug = cell("target_type"), cell("target")
    if kind and kind not in TARGET_TYPES:
        err("target_type", f"must be one of {', '.join(TARGET_TYPES)}: {kind!r}")
    elif kind and slug:
        target = targets.get((kind, slug))
        if target is None:
            err("target", f"no {kind} with slug {slug!r}")
    unit = cell("unit")
    if unit and unit not in Unit.values:
        err("unit", f"must be one of {', '.join(Unit.values)}: {unit!r}")
    unit_price: Decimal | None = None
    if cell("unit_price"):
        try:
            unit_price = decimal_parse(
                cell("unit_price"),
                max_digits=PRICE_MAX_DIGITS,
                decimal_places=PRICE_DECIMAL_PLACES,
                minimum=Decimal(0),
            )
        except InputError as exc:
            err("unit_price", str(exc))
    currency = cell("currency")
    if currency:
        try:
            currency = currency_parse(currency)
        except InputError as exc:
            err("currency", str(exc))
    times: dict[str, datetime | None] = {"effective_from": None, "effective_to": None}
    for name in times:
        if cell(name):
            try:
                times[name] = datetime_parse(cell(name))
            except InputError as exc:
                err(name, str(exc))
    start, end = times["effective_from"], times["effective_to"]
    if start is not None and end is not None and end <= start:
        err("effective_to", "must be after effective_from")
    if len(cell("note")) > NOTE_MAX_LENGTH:
        err("note", f"longer than {NOTE_MAX_LENGTH} characters")
    if errors or target is None or unit_price is None or start is None:
        return None, errors
    return (
        PriceRow(
            line=line,
            target_type=kind,
            target=target,
            unit=unit,
            unit_price=unit_price,
            currency=currency,
            effective_from=start,
            effective_to=end,
            note=cell("note"),
        ),
        [],
    )


def price_import_validate(
    *, records: Sequence[tuple[int, dict[str, Any]]], where: str = "line"
) -> tuple[list[PriceRow], list[RowError]]:
    """Check every record; returns the valid rows and every error (both, never just the first)."""
    targets = _targets(raw for _, raw in records)
    rows: list[PriceRow] = []
    errors: list[RowError] = []
    seen: dict[tuple[str, str, str, datetime], int] = {}
    for line, raw in records:
        row, row_errors = _validate_row(line, raw, targets, where)
        errors += row_errors
        if row is None:
            continue
        key = (row.target_type, row.target.slug, row.unit, row.effective_from)
        if key in seen:
            errors.append(
                RowError(
                    line,
                    "effective_from",
                    f"{where} {seen[key]} already prices this {row.target_type} and unit from this time",
                    where,
                )
            )
            continue
        seen[key] = line
        rows.append(row)
    return rows, errors


def _header_errors(columns: Sequence[str]) -> list[RowError]:
    errors = [RowError(1, name, "missing column") for name in REQUIRED_COLUMNS if name not in columns]
    errors += [
        RowError(1, name or "(blank)", f"unknown column (expected {', '.join(PRICE_COLUMNS)})")
        for name in columns
        if name not in PRICE_COLUMNS
    ]
    seen: set[str] = set()
    for name in columns:
        if name in seen:
            errors.append(RowError(1, name, "column appears twice"))
        seen.add(name)
    return errors


def price_import_parse_csv(*, text: str) -> tuple[list[PriceRow], list[RowError]]:
    read_errors: list[RowError] = []
    columns, records = csv_records(text, read_errors)
    if read_errors and not columns:
        return [], read_errors
    if not columns:
        return [], [RowError(1, "", "the file is empty; expected a header row")]
    header_errors = _header_errors(columns)
    if header_errors:
        return [], header_errors
    rows, errors = price_import_validate(records=list(records))
    return rows, sorted(read_errors + errors, key=lambda e: e.line)


def price_import_parse_catalog(*, text: str) -> tuple[list[PriceRow], list[RowError]]:
    try:
        data = json_parse(text, max_depth=CATALOG_MAX_DEPTH)
    except InputError as exc:
        return [], [_catalog_error(exc)]
    if not isinstance(data, list):
        return [], [RowError(1, "", "a catalog file is a JSON list of price objects")]
    records: list[tuple[int, dict[str, Any]]] = []
    errors: list[RowError] = []
    for index, entry in enumerate(data, start=1):
        if not isinstance(entry, dict):
            errors.append(RowError(index, "", "not an object", "entry"))
            continue
        for name in entry:
            if name not in PRICE_COLUMNS:
                errors.append(RowError(index, str(name), "unknown field", "entry"))
        records.append((index, {k: ("" if v is None else str(v)) for k, v in entry.items()}))
    rows, row_errors = price_import_validate(records=records, where="entry")
    return rows, sorted(errors + row_errors, key=lambda e: e.line)


def _catalog_error(exc: InputError) -> RowError:
    """A catalog's parse error as a RowError: the entry and field when the path names them."""
    if isinstance(exc, JSONSyntaxError):
        return RowError(exc.line, "", f"not valid JSON: {exc.reason}")
    match = re.fullmatch(r"\[(\d+)\](?:\.(.+))?", exc.field or "")
    if match is None:
        return RowError(1, exc.field or "", str(exc))
    column = re.split(r"[.\[]", match.group(2) or "")[0]  # the entry's field, not the path inside it
    return RowError(int(match.group(1)) + 1, column, str(exc), "entry")


def _already_present(row: PriceRow) -> bool:
    target = Q(**{row.target_type: row.target})
    if row.target_type == "provider":
        target &= Q(cluster__isnull=True, deployment__isnull=True)
    return PriceBook.objects.filter(
        target,
        unit=row.unit,
        effective_from=row.effective_from,
        effective_to=row.effective_to,
        unit_price=row.unit_price,
        currency=row.currency,
    ).exists()


def price_import_rows(*, rows: Sequence[PriceRow], source: PriceSource | str) -> PriceImportResult:
    """Publish validated rows in one transaction (all or none)."""
    result = PriceImportResult()
    with transaction.atomic():
        for row in rows:
            if _already_present(row):
                result.unchanged += 1
                continue
            result.created.append(
                price_book_publish(
                    unit=row.unit,
                    unit_price=row.unit_price,
                    effective_from=row.effective_from,
                    effective_to=row.effective_to,
                    currency=row.currency,
                    note=row.note,
                    source=source,
                    **{row.target_type: row.target},  # type: ignore[arg-type]
                )
            )
    return result


def price_import_file(*, text: str, file_format: str) -> PriceImportResult:
    """Validate a CSV ("csv") or catalog ("json") file and import it; FileImportError if any row is bad."""
    if file_format == "csv":
        rows, errors = price_import_parse_csv(text=text)
        source = PriceSource.CSV
    elif file_format == "json":
        rows, errors = price_import_parse_catalog(text=text)
        source = PriceSource.CATALOG
    else:
        raise ValueError(f"unknown format {file_format!r}: csv or json")
    if errors:
        raise FileImportError(errors)
    return price_import_rows(rows=rows, source=source)


def price_import_format_for(filename: str, requested: str | None = None) -> str:
    if requested:
        return requested
    return "json" if filename.lower().endswith(".json") else "csv"


def decode_upload(data: bytes) -> str:
    """Uploaded bytes as text (UTF-8, with or without a byte-order mark)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileImportError([RowError(1, "", f"not UTF-8 text (byte {exc.start})")]) from None


def read_upload(upload: UploadedFile) -> str:
    """An uploaded file's text (a price file or an invoice); FileImportError when too big or not UTF-8."""
    if upload.size is not None and upload.size > MAX_UPLOAD_BYTES:
        raise FileImportError([RowError(1, "", f"file larger than {MAX_UPLOAD_BYTES // 2**20} MiB")])
    return decode_upload(upload.read())


def price_import_upload(*, upload: UploadedFile, file_format: str | None) -> PriceImportResult:
    """price_import_file for an uploaded file; the format from `file_format`, else from its name."""
    return price_import_file(
        text=read_upload(upload), file_format=price_import_format_for(upload.name or "", file_format)
    )


# --- The price list page ------------------------------------------------------------------------


@dataclass(frozen=True)
class PriceVersionView:
    price: PriceBook
    in_force: bool
    used: bool


@dataclass(frozen=True)
class PriceTargetView:
    target_type: str
    target: str
    unit: str
    versions: list[PriceVersionView]


def price_book_listing(*, at: datetime | None = None) -> list[PriceTargetView]:
    """Every price version grouped per (target, unit), newest first, marking the one in force at `at`."""
    at = at or timezone.now()
    prices = (
        PriceBook.objects.select_related("provider", "cluster", "deployment")
        .annotate(used=Exists(UsageRecord.objects.filter(price_book=OuterRef("pk"))))
        .order_by("-effective_from", "-version")
    )
    groups: dict[tuple[str, str, str], list[PriceBook]] = {}
    for price in prices:
        if price.cluster is not None:
            key = ("cluster", price.cluster.slug, price.unit)
        elif price.deployment is not None:
            key = ("deployment", price.deployment.slug, price.unit)
        else:
            key = ("provider", price.provider.slug if price.provider else "", price.unit)
        groups.setdefault(key, []).append(price)
    listing = []
    for (kind, slug, unit), versions in sorted(groups.items()):
        # The same rule as the ledger's pricing (PriceResolver), over one target's own versions.
        current = PriceResolver._pick(versions, at)
        listing.append(
            PriceTargetView(
                kind,
                slug,
                unit,
                [PriceVersionView(p, p is current, bool(getattr(p, "used", False))) for p in versions],
            )
        )
    return listing
