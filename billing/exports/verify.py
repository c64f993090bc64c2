"""Checking a downloaded export against its manifest: signature, file digests, rows and totals."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

from billing.exports.columns import COLUMNS, PARQUET_BATCH_ROWS
from billing.exports.manifest import file_digest, manifest_signature_check
from billing.exports.rows import ExportSummary
from billing.exports.signing import ExportPublicKey
from billing.exports.writers import parquet_schema
from registry.validation import json_parse


@dataclass(frozen=True)
class ExportCheck:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{self.name}: {'ok' if self.ok else 'MISMATCH'}: {self.detail}"


def _tally_csv(path: Path, columns: tuple[str, ...]) -> ExportSummary:
    summary = ExportSummary()
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or tuple(header) != columns:
            raise ValueError("the header is not the manifest's column set")
        # By name: an export written before the FOCUS 1.2 columns verifies with its own columns.
        cost, currency, partition, sequence, row_hash, prev_hash = (
            columns.index(name)
            for name in (
                "BilledCost",
                "BillingCurrency",
                "x_Partition",
                "x_Sequence",
                "x_RowHash",
                "x_PrevHash",
            )
        )
        for cells in reader:
            summary.add(
                cost=Decimal(cells[cost]),
                currency=cells[currency],
                partition=cells[partition],
                sequence=int(cells[sequence]),
                row_hash=cells[row_hash],
                prev_hash=cells[prev_hash],
            )
    return summary


def _tally_jsonl(path: Path, columns: tuple[str, ...]) -> ExportSummary:
    summary = ExportSummary()
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            row = json_parse(line)
            if not isinstance(row, dict):
                raise ValueError("a line is not a JSON object")
            summary.add(
                cost=Decimal(row["BilledCost"]),
                currency=row["BillingCurrency"],
                partition=row["x_Partition"],
                sequence=int(row["x_Sequence"]),
                row_hash=row["x_RowHash"],
                prev_hash=row["x_PrevHash"],
            )
    return summary


def _tally_parquet(path: Path, columns: tuple[str, ...]) -> ExportSummary:
    import pyarrow.parquet as pq  # lazily: only checking a Parquet file needs it

    summary = ExportSummary()
    wanted = ["BilledCost", "BillingCurrency", "x_Partition", "x_Sequence", "x_RowHash", "x_PrevHash"]
    parquet = pq.ParquetFile(str(path))
    if parquet.schema_arrow.field("BilledCost").type != parquet_schema().field("BilledCost").type:
        raise ValueError("BilledCost is not decimal128(28, 9)")
    for batch in parquet.iter_batches(columns=wanted, batch_size=PARQUET_BATCH_ROWS):
        data = batch.to_pydict()
        for cost, currency, partition, sequence, row_hash, prev_hash in zip(
            *(data[c] for c in wanted), strict=True
        ):
            summary.add(
                cost=cost,
                currency=currency,
                partition=partition,
                sequence=sequence,
                row_hash=row_hash,
                prev_hash=prev_hash,
            )
    return summary


_TALLIES = {"csv": _tally_csv, "jsonl": _tally_jsonl, "parquet": _tally_parquet}


def export_verify(
    *, manifest_path: Path, directory: Path | None = None, public_keys: list[ExportPublicKey] | None = None
) -> list[ExportCheck]:
    """Check a downloaded export against its manifest: signature (with `public_keys`, default the
    current and retired keys), each file's sha256 and size, then each file re-read to recount
    rows and re-sum totals per currency."""
    directory = directory or manifest_path.parent
    try:
        manifest = json_parse(manifest_path.read_bytes())
    except (OSError, ValueError) as exc:  # missing, unreadable, not JSON (InputError is a ValueError)
        return [ExportCheck(manifest_path.name, False, f"cannot read the manifest: {exc}")]
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files", {}), dict):
        return [ExportCheck(manifest_path.name, False, "not an export manifest (a JSON object with files)")]
    signed, why = manifest_signature_check(manifest, public_keys=public_keys)
    checks = [ExportCheck("signature", signed, why)]
    columns = tuple(manifest.get("columns") or COLUMNS)
    expected = {k: manifest.get(k) for k in ExportSummary().as_json()}
    for name, meta in sorted(manifest.get("files", {}).items()):
        if not isinstance(meta, dict) or "/" in name or name in ("", ".", ".."):
            checks.append(ExportCheck(str(name), False, "not a file entry of an export manifest"))
            continue
        path = directory / name
        if not path.is_file():
            checks.append(ExportCheck(name, False, f"missing from {directory}"))
            continue
        sha256, size = file_digest(path)
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
            summary = _TALLIES[meta["format"]](path, columns)
            tally = summary.as_json()
        except (KeyError, ValueError, TypeError, InvalidOperation, IndexError, OSError, csv.Error) as exc:
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
        checks.append(_chain_check(name, summary, manifest.get("heads")))
    return checks


def _chain_check(name: str, summary: ExportSummary, heads: object) -> ExportCheck:
    """Each partition's rows link up (x_PrevHash names the previous row's x_RowHash wherever
    chain neighbours are file neighbours), and a chain exported up to its head ends in the
    head's hash."""
    if not isinstance(heads, dict):
        return ExportCheck(f"{name} chains", False, "the manifest names no partition heads")
    problems: list[str] = []
    for partition, span in sorted(summary.partitions.items()):
        head = heads.get(partition)
        if not isinstance(head, dict) or not isinstance(head.get("sequence"), int):
            problems.append(f"partition {partition} is not among the manifest's heads")
            continue
        if span.broken_links:
            problems.append(f"partition {partition}: {span.broken_links} rows do not link to their neighbour")
        if span.last_sequence > head["sequence"]:
            problems.append(f"partition {partition} has rows after its head sequence {head['sequence']}")
        elif span.last_sequence == head["sequence"] and span.last_row_hash != head.get("hash"):
            problems.append(f"partition {partition}: the row at its head sequence is not the head's hash")
    if problems:
        return ExportCheck(f"{name} chains", False, "; ".join(problems))
    return ExportCheck(
        f"{name} chains", True, f"{len(summary.partitions)} partitions link up and end within their heads"
    )
