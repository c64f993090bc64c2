"""Cost-audit exports of the usage ledger: FinOps FOCUS-style columns as CSV, JSON Lines and Parquet.

One row per ledger record, every partition merged by time (occurred_at, then
partition and sequence; one partition if the `partition` filter names it), read with a
server-side cursor (`.values_list(...).iterator()`) so memory stays constant at
any size. Money and quantities are Decimal end to end: the ledger's exact 9-place
strings in CSV and JSON Lines, decimal128(28, 9) in Parquet, never float.

Choices worth knowing:
- ChargePeriodEnd is the record's occurred_at (work is billed when it finishes,
  e.g. a probe job at its end); ChargePeriodStart is occurred_at minus the
  quantity in hours for accelerator-hours, and equal to the end for every other
  unit (tokens, requests, storage, egress are point-in-time charges here).
- Every export is pinned to each partition's head sequence when it starts
  (`through`, read in one query: a consistent snapshot), so a re-run of the same
  export job, or a concurrent append, can never change what it contains. The
  manifest names each partition's head (sequence and hash) and the span of its
  rows in the export; each row carries x_Partition, x_Sequence, x_PrevHash and
  x_RowHash, so an auditor can follow every chain offline.
- The manifest is signed with Ed25519 (billing.exports.signing): its signature names the
  key id, and the public keys (current and retired) verify it without any secret.
  Manifests written before were signed with HMAC-SHA256 under settings.EXPORT_SIGNING_KEY
  (or a key derived from SECRET_KEY with HKDF); the server still checks those.

The modules, lowest first: columns (the shape), filters (which rows), rows (ledger
rows as export rows), postgres (the COPY path), writers (CSV, JSON Lines, Parquet),
signing (Ed25519 keys), manifest (files plus a signed manifest), verify (checking a download), jobs (export
jobs in the object store). Import from here; the split is this package's own business.
"""

from __future__ import annotations

from billing.exports.columns import (
    CHUNK_ROWS,
    COLUMNS,
    CONTENT_TYPES,
    DECIMAL_COLUMNS,
    FILE_NAMES,
    FOCUS_COLUMNS,
    FORMATS,
    INT_COLUMNS,
    MANIFEST_NAME,
    PARQUET_BATCH_ROWS,
    PARQUET_PRECISION,
    PARQUET_SCALE,
    SWITCHYARD_COLUMNS,
    TIME_COLUMNS,
    Row,
)
from billing.exports.filters import (
    FILTER_FIELDS,
    ExportFilterError,
    ExportFilterForm,
    ExportFilters,
    export_filters_parse,
    export_queryset,
)
from billing.exports.jobs import (
    export_job_claim,
    export_job_create,
    export_job_file_chunks,
    export_job_file_names,
    export_job_prefix,
    export_job_run,
    export_jobs_of_teams,
)
from billing.exports.manifest import (
    MANIFEST_VERSION,
    export_signing_key,
    export_write_files,
    manifest_body,
    manifest_bytes,
    manifest_sign,
    manifest_signature_check,
    manifest_signature_ok,
)
from billing.exports.rows import ChainSpan, ExportSummary, export_rows
from billing.exports.signing import (
    ExportPublicKey,
    export_key_id,
    export_public_keys,
    export_public_keys_json,
    export_signing_private_key,
    public_keys_from_pem_files,
)
from billing.exports.verify import ExportCheck, export_verify
from billing.exports.writers import (
    csv_chunks,
    export_parquet_tempfile,
    export_stream,
    jsonl_chunks,
    parquet_write,
)

__all__ = [
    "CHUNK_ROWS",
    "COLUMNS",
    "CONTENT_TYPES",
    "DECIMAL_COLUMNS",
    "FILE_NAMES",
    "FILTER_FIELDS",
    "FOCUS_COLUMNS",
    "FORMATS",
    "INT_COLUMNS",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "PARQUET_BATCH_ROWS",
    "PARQUET_PRECISION",
    "PARQUET_SCALE",
    "SWITCHYARD_COLUMNS",
    "TIME_COLUMNS",
    "ChainSpan",
    "ExportCheck",
    "ExportFilterError",
    "ExportFilterForm",
    "ExportFilters",
    "ExportPublicKey",
    "ExportSummary",
    "Row",
    "csv_chunks",
    "export_filters_parse",
    "export_job_claim",
    "export_job_create",
    "export_job_file_chunks",
    "export_job_file_names",
    "export_job_prefix",
    "export_job_run",
    "export_jobs_of_teams",
    "export_key_id",
    "export_parquet_tempfile",
    "export_public_keys",
    "export_public_keys_json",
    "export_queryset",
    "export_rows",
    "export_signing_key",
    "export_signing_private_key",
    "export_stream",
    "export_verify",
    "export_write_files",
    "jsonl_chunks",
    "manifest_body",
    "manifest_bytes",
    "manifest_sign",
    "manifest_signature_check",
    "manifest_signature_ok",
    "parquet_write",
    "public_keys_from_pem_files",
]
