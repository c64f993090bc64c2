"""Signed manifests: writing an export's files with one, and the HMAC key that signs it."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from billing.chain import GENESIS_HASH
from billing.exports.columns import COLUMNS, FILE_NAMES, MANIFEST_NAME, iso_text
from billing.exports.filters import ExportFilters, export_formats_clean
from billing.exports.rows import ExportSummary, export_rows, rows_counted
from billing.exports.writers import write_format
from billing.models import UsageRecord

# 2: rows of every partition merged by time, an x_Partition column, per-partition chain
# spans ("partitions") and the pinned heads ("heads") instead of one chain's first/last row.
MANIFEST_VERSION = 2


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


def file_digest(path: Path) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of a file, read a MiB at a time."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def export_heads(heads: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """Each pinned partition's head: its sequence and the hash of the row there (the chain's end
    when the export started), so an auditor can check each chain offline against the rows."""
    at_head = Q(pk__in=[])
    for partition, sequence in heads.items():
        at_head |= Q(partition=partition, sequence=sequence)
    hashes = dict(UsageRecord.objects.filter(at_head).values_list("partition", "row_hash"))
    return {
        partition: {"sequence": sequence, "hash": hashes.get(partition, GENESIS_HASH)}
        for partition, sequence in sorted(heads.items())
    }


def export_write_files(
    *, filters: ExportFilters, formats: Sequence[str], directory: Path, job_id: int | None = None
) -> dict[str, Any]:
    """Write each format's file and a signed manifest.json into `directory`; return the manifest.

    Each format is a separate pass over the ledger (constant memory); the
    export is pinned to a ledger sequence, so every pass reads the same rows.
    """
    formats = export_formats_clean(formats)
    filters = filters.pinned()
    directory.mkdir(parents=True, exist_ok=True)
    summary: ExportSummary | None = None
    files: dict[str, dict[str, Any]] = {}
    for fmt in formats:
        this_pass = ExportSummary()
        path = directory / FILE_NAMES[fmt]
        write_format(fmt, rows_counted(export_rows(filters=filters), this_pass), path)
        if summary is not None and this_pass.as_json() != summary.as_json():
            raise RuntimeError("the ledger rows changed between passes of one export")
        summary = this_pass
        sha256, size = file_digest(path)
        files[FILE_NAMES[fmt]] = {"format": fmt, "sha256": sha256, "size": size}
    assert summary is not None  # noqa: S101 (at least one format, checked above)
    manifest = manifest_sign(
        {
            "version": MANIFEST_VERSION,
            "job_id": job_id,
            "generated_at": iso_text(timezone.now()),
            "filters": filters.as_json(),
            "columns": list(COLUMNS),
            **summary.as_json(),
            "heads": export_heads(filters.heads()),
            "files": files,
        }
    )
    (directory / MANIFEST_NAME).write_bytes(manifest_bytes(manifest))
    return manifest
