"""Ed25519-signed export manifests: verified with the public key alone (the command and the
standalone script), across a key rotation, and old HMAC manifests still checked."""

from __future__ import annotations

import hashlib
import hmac
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import Client

from billing.exports import (
    ExportFilters,
    export_job_create,
    export_job_run,
    export_key_id,
    export_signing_key,
    export_signing_private_key,
    export_write_files,
    manifest_body,
    manifest_bytes,
)
from billing.models import ExportJob, Unit
from billing.services import UsageInput, usage_record_batch, usage_reverse
from tests.factories import make_cluster, make_price, unique

pytestmark = pytest.mark.django_db
DAY = datetime(2026, 5, 4, 9, tzinfo=UTC)
SCRIPT = Path(django_settings.BASE_DIR) / "scripts" / "verify_export.py"
FILES = ("usage.csv", "usage.jsonl", "usage.parquet")


@pytest.fixture
def billed() -> None:
    cluster = make_cluster(slug=unique("gpu"), price=None)
    make_price(cluster=cluster, unit_price=Decimal("1.25"), effective_from=DAY - timedelta(days=1))
    records = usage_record_batch(
        items=[
            UsageInput(unit=Unit.ACCELERATOR_HOUR, quantity=Decimal("0.5"), occurred_at=DAY + timedelta(hours=i),
                       idempotency_key=unique("u"), subject_type="training_run", subject_id="r1", cluster=cluster)
            for i in range(5)
        ]
    )  # fmt: skip
    usage_reverse(record=records[0], reason="double billed", occurred_at=DAY + timedelta(hours=6))


def _key_pem() -> str:
    return (
        Ed25519PrivateKey.generate().private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()
    )


def _job_files(s3_store: Any, auditor: User, directory: Path) -> ExportJob:
    """An export job run into the S3 store, its files and manifest downloaded from the store."""
    job = export_job_create(created_by=auditor, filters=ExportFilters(), formats=["csv", "jsonl", "parquet"])
    export_job_run(job_id=job.pk)
    job.refresh_from_db()
    assert job.status == "succeeded", job.error
    directory.mkdir(parents=True)
    for name in (*FILES, "manifest.json"):
        body = s3_store.get_object(Bucket=s3_store.bucket, Key=f"switchyard/exports/{job.pk}/{name}")["Body"]
        (directory / name).write_bytes(body.read())
    return job


def _script(key: Path, manifest: Path) -> subprocess.CompletedProcess[str]:
    # A clean environment: the script needs no Django settings, database or secret.
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": ""}
    return subprocess.run(  # noqa: S603 (this interpreter and our own script)
        [sys.executable, str(SCRIPT), str(key), str(manifest)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


def _verify(manifest: Path, *keys: Path) -> str:
    out = manifest.parent / "verify.out"
    with out.open("w") as fh:
        args = [a for key in keys for a in ("--public-key", str(key))]
        call_command("export", "verify", "--manifest", str(manifest), *args, stdout=fh)
    return out.read_text()


def _flip_one_byte(path: Path, needle: bytes) -> bytes:
    original = path.read_bytes()
    at = original.index(needle) + len(needle)
    changed = bytearray(original)
    changed[at] = ord("7") if changed[at] != ord("7") else ord("8")
    path.write_bytes(bytes(changed))
    return original


def test_an_export_verifies_with_the_served_public_key_alone_and_fails_after_one_byte_changes(
    billed: None, s3_store: Any, auditor: User, tmp_path: Path
) -> None:
    job = _job_files(s3_store, auditor, tmp_path / "export")
    manifest_path = tmp_path / "export" / "manifest.json"
    # The key set, fetched without logging in, as an outside auditor would.
    served = Client().get("/.well-known/switchyard-export-keys.json")
    assert served.status_code == 200
    (current,) = served.json()["keys"]
    assert current["status"] == "current" and current["key_id"] == job.manifest["signature"]["key_id"]
    assert (
        len(current["key_id"]) == 16
        and Client().post("/.well-known/switchyard-export-keys.json").status_code == 405
    )
    key = tmp_path / "key.pem"
    key.write_text(current["public_key_pem"])
    printed = tmp_path / "printed.pem"
    with printed.open("w") as fh:
        call_command("export", "public-key", stdout=fh, stderr=open(os.devnull, "w"))  # noqa: SIM115
    assert printed.read_text() == current["public_key_pem"]

    ok = _script(key, manifest_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == f"OK: signed by key {current['key_id']}; 3 files match the manifest"
    assert "signature: ok: Ed25519 signature matches key" in _verify(manifest_path, key)

    csv_path = tmp_path / "export" / "usage.csv"
    original = _flip_one_byte(csv_path, b"\n")  # one byte of the first data row
    failed = _script(key, manifest_path)
    assert failed.returncode == 1 and failed.stderr.strip().splitlines() == [
        "FAIL: usage.csv differs from the signed manifest (sha256 or size)"
    ]
    with pytest.raises(CommandError, match=r"^export does not match its manifest: usage\.csv: sha256 "):
        _verify(manifest_path, key)
    csv_path.write_bytes(original)

    _flip_one_byte(manifest_path, b'"row_count": ')  # one digit of the signed row count
    failed = _script(key, manifest_path)
    assert failed.returncode == 1 and len(failed.stderr.strip().splitlines()) == 1
    assert failed.stderr.startswith(
        f"FAIL: manifest signature (Ed25519, key {current['key_id']}): InvalidSignature"
    )
    with pytest.raises(
        CommandError, match=r"^export does not match its manifest: signature: Ed25519 signature does"
    ):
        _verify(manifest_path, key)
    proc = subprocess.run(  # noqa: S603 (the command line, for its exit code and one line)
        [sys.executable, "manage.py", "export", "verify", "--manifest", str(manifest_path), "--public-key", str(key)],
        cwd=django_settings.BASE_DIR, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "CommandError: export does not match its manifest: signature: Ed25519 signature does not match key "
        f"{current['key_id']}: the manifest was changed (and 3 more)"  # the 3 files' row counts
    ]


def test_after_a_key_rotation_old_exports_still_verify_with_the_retired_public_key(
    billed: None, s3_store: Any, auditor: User, tmp_path: Path, settings: Any
) -> None:
    settings.EXPORT_ED25519_KEY = _key_pem()
    key1 = export_signing_private_key().public_key()
    old = _job_files(s3_store, auditor, tmp_path / "old")
    retired = tmp_path / "key1.pem"
    retired.write_bytes(key1.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))

    # Rotate: key 2 signs from now on; key 1's public half stays in the key set.
    settings.EXPORT_ED25519_KEY = _key_pem()
    settings.EXPORT_RETIRED_PUBLIC_KEYS = [str(retired)]
    new = _job_files(s3_store, auditor, tmp_path / "new")
    key2_id = export_key_id(export_signing_private_key().public_key())
    assert (
        old.manifest["signature"]["key_id"]
        == export_key_id(key1)
        != new.manifest["signature"]["key_id"]
        == key2_id
    )

    keys = Client().get("/.well-known/switchyard-export-keys.json").json()["keys"]
    assert [(k["key_id"], k["status"]) for k in keys] == [
        (key2_id, "current"),
        (export_key_id(key1), "retired"),
    ]
    assert f"Ed25519 signature matches key {export_key_id(key1)} (retired)" in _verify(
        tmp_path / "old" / "manifest.json"
    )
    assert "(current)" in _verify(tmp_path / "new" / "manifest.json")
    assert _script(retired, tmp_path / "old" / "manifest.json").returncode == 0
    key2 = tmp_path / "key2.pem"
    key2.write_text(keys[0]["public_key_pem"])
    with pytest.raises(
        CommandError, match=f"signed by key {export_key_id(key1)}, which is not among the public keys"
    ):
        _verify(tmp_path / "old" / "manifest.json", key2)
    assert _script(key2, tmp_path / "old" / "manifest.json").returncode == 1


def test_a_manifest_signed_with_hmac_before_ed25519_still_verifies_on_the_server(
    billed: None, tmp_path: Path
) -> None:
    manifest = export_write_files(filters=ExportFilters(), formats=["csv"], directory=tmp_path)
    # What version 2 wrote: the same body, an HMAC-SHA256 signature under the server's secret key.
    legacy = {k: v for k, v in manifest.items() if k != "signature"} | {"version": 2}
    digest = hmac.new(export_signing_key(), manifest_body(legacy), hashlib.sha256).hexdigest()
    (tmp_path / "manifest.json").write_bytes(
        manifest_bytes({**legacy, "signature": {"algorithm": "HMAC-SHA256", "value": digest}})
    )
    assert "signature: ok: HMAC-SHA256 matches (an export from before Ed25519 signing)" in _verify(
        tmp_path / "manifest.json"
    )
    key = tmp_path / "key.pem"
    key.write_bytes(
        export_signing_private_key()
        .public_key()
        .public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(CommandError, match="needs the server's key, not a public key"):
        _verify(tmp_path / "manifest.json", key)


def test_the_development_key_is_made_once_under_var_and_production_refuses_to_sign_without_one(
    settings: Any, tmp_path: Path
) -> None:
    settings.VAR_DIR = tmp_path
    settings.EXPORT_ED25519_KEY = settings.EXPORT_ED25519_KEY_FILE = ""
    first = export_key_id(export_signing_private_key().public_key())
    assert (tmp_path / "export-ed25519.pem").stat().st_mode & 0o777 == 0o600
    assert export_key_id(export_signing_private_key().public_key()) == first
    settings.EXPORT_ED25519_KEY_FILE = str(tmp_path / "export-ed25519.pem")
    settings.PRODUCTION = True
    assert export_key_id(export_signing_private_key().public_key()) == first  # a configured file
    settings.EXPORT_ED25519_KEY_FILE = ""
    with pytest.raises(
        ImproperlyConfigured, match="EXPORT_ED25519_KEY or EXPORT_ED25519_KEY_FILE in production"
    ):
        export_signing_private_key()
    settings.EXPORT_ED25519_KEY = "not a key"
    with pytest.raises(
        ImproperlyConfigured, match="EXPORT_ED25519_KEY is not an unencrypted PEM private key"
    ):
        export_signing_private_key()


def test_the_docs_show_the_verification_script_as_it_is() -> None:
    page = (Path(django_settings.BASE_DIR) / "docs" / "billing.md").read_text()
    section = page[page.index("## Exports: FOCUS 1.2 columns and verification") :]
    block = section[section.index("```python\n") + len("```python\n") :]
    block = block[: block.index("```")]
    script = SCRIPT.read_text()
    missing = [line for line in block.splitlines() if line.strip() and line not in script]
    assert missing == []
    assert len(block.splitlines()) >= 15
