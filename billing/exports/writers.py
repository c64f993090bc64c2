"""Export rows written out: CSV and JSON Lines as streamed chunks, Parquet through pyarrow."""

from __future__ import annotations

import csv
import io
import json
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from django.db import connection

from billing.exports.columns import (
    CHUNK_ROWS,
    COLUMNS,
    DECIMAL_COLUMNS,
    FOCUS_TIME_COLUMNS,
    INT_COLUMNS,
    PARQUET_BATCH_ROWS,
    PARQUET_PRECISION,
    PARQUET_SCALE,
    TAGS,
    TIME_COLUMNS,
    Row,
    focus_time_text,
    iso_text,
)
from billing.exports.filters import ExportFilters
from billing.exports.postgres import postgres_csv_chunks
from billing.exports.rows import export_rows
from billing.money import ledger_text_or_none


def _cell_formatter(name: str) -> Callable[[Any], Any]:
    if name in DECIMAL_COLUMNS:
        return ledger_text_or_none  # x_CostAvoided is empty on most rows
    if name in FOCUS_TIME_COLUMNS:
        return focus_time_text
    if name in TIME_COLUMNS:
        return iso_text
    return _as_is


def _as_is(value: Any) -> Any:
    return value


_FORMATTERS = tuple(_cell_formatter(name) for name in COLUMNS)


def _text_cells(row: Row) -> list[Any]:
    """A row's cells as text: exact 9-place decimals, FOCUS times to the second, None kept (empty in CSV)."""
    return [value if value is None else fmt(value) for fmt, value in zip(_FORMATTERS, row, strict=True)]


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
    before, after = COLUMNS[:TAGS], COLUMNS[TAGS + 1 :]
    for row in rows:
        cells = _text_cells(row)
        # Tags is already JSON text: splice it in as an object, keeping the column order.
        head = json.dumps(dict(zip(before, cells[:TAGS], strict=True)), separators=(",", ":"))
        tail = json.dumps(dict(zip(after, cells[TAGS + 1 :], strict=True)), separators=(",", ":"))
        lines.append(f'{head[:-1]},"Tags":{row[TAGS]},{tail[1:]}')
        if len(lines) >= rows_per_chunk:
            yield ("\n".join(lines) + "\n").encode()
            lines = []
    if lines:
        yield ("\n".join(lines) + "\n").encode()


def parquet_schema() -> Any:
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
    import pyarrow as pa  # lazily, as in parquet_schema
    import pyarrow.parquet as pq

    schema = parquet_schema()
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


def write_format(fmt: str, rows: Iterable[Row], path: Path) -> None:
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
        return postgres_csv_chunks(filters.pinned())
    rows = export_rows(filters=filters.pinned())
    if fmt == "csv":
        return csv_chunks(rows)
    if fmt == "jsonl":
        return jsonl_chunks(rows)
    raise ValueError(f"cannot stream {fmt!r}; use csv or jsonl (Parquet needs a seekable file)")


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
