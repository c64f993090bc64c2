"""Signed manifests: writing an export's files with one (Ed25519), and checking a signature
(Ed25519 with a public key; HMAC-SHA256 for manifests written before, with the server's key)."""

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
from billing.exports.signing import (
    ALGORITHM,
    ExportPublicKey,
    ed25519_check,
    ed25519_sign,
    export_public_keys,
)
from billing.exports.writers import write_format
from billing.models import UsageRecord

# 2: rows of every partition merged by time, an x_Partition column, per-partition chain
# spans ("partitions") and the pinned heads ("heads") instead of one chain's first/last row.
# 3: FOCUS 1.2 columns; signed with Ed25519 (signature: algorithm, key_id, value) instead of HMAC.
MANIFEST_VERSION = 3


def export_signing_key() -> bytes:
    """The HMAC key of manifests written before Ed25519 signing (version 2 and older)."""
    configured = settings.EXPORT_SIGNING_KEY
    if configured:
        return configured.encode()
    # A dedicated key derived from SECRET_KEY, never SECRET_KEY itself.
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"switchyard-export-manifest").derive(
        settings.SECRET_KEY.encode()
    )


def manifest_body(manifest: Mapping[str, Any]) -> bytes:
    """The signed bytes: the manifest without its signature, as canonical JSON (sorted keys, no
    spaces, ASCII), which scripts/verify_export.py rebuilds with the standard library alone."""
    unsigned = {k: v for k, v in manifest.items() if k != "signature"}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def manifest_sign(manifest: Mapping[str, Any]) -> dict[str, Any]:
    return {**manifest, "signature": ed25519_sign(manifest_body(manifest))}


def manifest_signature_check(
    manifest: Mapping[str, Any], *, public_keys: list[ExportPublicKey] | None = None
) -> tuple[bool, str]:
    """(ok, why). Ed25519 with `public_keys` (default: the current and retired keys); an older
    HMAC-SHA256 manifest with the server's HMAC key (it cannot be checked with a public key)."""
    signature = manifest.get("signature")
    if not isinstance(signature, dict):
        return False, "the manifest is not signed"
    algorithm = signature.get("algorithm")
    if algorithm == ALGORITHM:
        keys = export_public_keys() if public_keys is None else public_keys
        return ed25519_check(manifest_body(manifest), signature, keys)
    if algorithm == "HMAC-SHA256":
        if public_keys is not None:
            return (
                False,
                "HMAC-SHA256 (an export from before Ed25519) needs the server's key, not a public key",
            )
        expected = hmac.new(export_signing_key(), manifest_body(manifest), hashlib.sha256).hexdigest()
        if hmac.compare_digest(expected, str(signature.get("value", ""))):
            return True, "HMAC-SHA256 matches (an export from before Ed25519 signing)"
        return False, "HMAC-SHA256 does not match: the manifest was changed or signed with another key"
    return False, f"unknown signature algorithm {algorithm!r}"


def manifest_signature_ok(manifest: Mapping[str, Any]) -> bool:
    return manifest_signature_check(manifest)[0]


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
