"""Export jobs: files and a signed manifest in a real S3 endpoint (moto on loopback), verified offline."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from rest_framework.test import APIClient

from billing.exports import ExportFilters, export_job_create, export_job_run, export_public_keys
from billing.models import ExportJob, LedgerHead, Unit
from billing.services import UsageInput, usage_record_batch
from stack.celery import app as celery_app
from tests.factories import api_client, make_cluster, make_price, make_provider, unique

pytestmark = pytest.mark.django_db
DAY = datetime(2026, 5, 4, 9, tzinfo=UTC)
FILES = ["manifest.json", "usage.csv", "usage.jsonl", "usage.parquet"]


@pytest.fixture
def eager_celery() -> Iterator[None]:
    # The task runs in this process when the transaction's on_commit hooks fire.
    before = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    try:
        yield
    finally:
        celery_app.conf.task_always_eager = before


@pytest.fixture
def billed() -> None:
    usd = make_cluster(slug=unique("usd"), price=None, provider=make_provider(display_name="Lab"))
    eur = make_cluster(slug=unique("eur"), price=None)
    make_price(cluster=usd, unit_price=Decimal("1.25"), effective_from=DAY - timedelta(days=1))
    make_price(cluster=usd, unit_price=Decimal("1.5"), effective_from=DAY + timedelta(hours=10))
    make_price(cluster=eur, unit_price=Decimal("0.9"), currency="EUR", effective_from=DAY - timedelta(days=1))
    usage_record_batch(
        items=[
            UsageInput(unit=Unit.ACCELERATOR_HOUR, quantity=Decimal("0.123456789"),
                       occurred_at=DAY + timedelta(hours=i), idempotency_key=unique("u"),
                       subject_type="training_run", subject_id="r1", cluster=usd if i % 3 else eur)
            for i in range(24)
        ]
    )  # fmt: skip


def _another_key_pem() -> str:
    key = Ed25519PrivateKey.generate()
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()


def _download(client: Client, job: ExportJob, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        response = client.get(f"/billing/exports/{job.pk}/files/{name}")
        assert response.status_code == 200 and response.streaming, name
        (directory / name).write_bytes(b"".join(response.streaming_content))


def _verify(directory: Path) -> str:
    out = Path(directory / "verify.out")
    with out.open("w") as fh:
        call_command("export", "verify", "--manifest", str(directory / "manifest.json"), stdout=fh)
    return out.read_text()


def test_an_export_job_writes_files_and_a_signed_manifest_to_s3_that_verify_accepts_after_download(
    billed: None, s3_store: Any, auditor: User, eager_celery: None, tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = api_client(auditor).post(
            "/api/export-jobs/", {"filters": {"start": "2026-05-04", "end": "2026-05-06"}}, format="json"
        )
        assert response.status_code == 201, response.json()
        assert response.json()["status"] == "pending"  # nothing runs before the commit
    assert len(callbacks) == 1
    job = ExportJob.objects.get(pk=response.json()["id"])
    assert job.status == "succeeded", job.error
    assert job.created_by == auditor and job.row_count == 24

    keys = sorted(o["Key"] for o in s3_store.list_objects_v2(Bucket=s3_store.bucket)["Contents"])
    assert keys == [f"switchyard/exports/{job.pk}/{name}" for name in FILES]
    manifest = job.manifest
    assert manifest["row_count"] == 24 and set(manifest["totals"]) == {"USD", "EUR"}
    chain = manifest["partitions"]["main"]
    assert (chain["row_count"], chain["first_sequence"], chain["last_sequence"]) == (24, 1, 24)
    head = LedgerHead.objects.get(partition="main")
    assert manifest["heads"] == {"main": {"sequence": 24, "hash": head.last_hash}}
    assert manifest["filters"]["start"] == "2026-05-04T00:00:00.000000Z"
    assert manifest["signature"]["algorithm"] == "Ed25519"
    assert manifest["signature"]["key_id"] == export_public_keys()[0].key_id
    assert set(manifest["files"]) == {"usage.csv", "usage.jsonl", "usage.parquet"}

    detail = api_client(auditor).get(f"/api/export-jobs/{job.pk}/").json()
    assert [f["name"] for f in detail["files"]] == FILES
    assert detail["manifest"]["totals"] == manifest["totals"]

    page = Client()
    page.force_login(auditor)
    _download(page, job, tmp_path / "download")
    stored = s3_store.get_object(Bucket=s3_store.bucket, Key=f"switchyard/exports/{job.pk}/usage.parquet")
    assert (tmp_path / "download" / "usage.parquet").read_bytes() == stored["Body"].read()
    out = _verify(tmp_path / "download")
    assert "signature: ok" in out
    assert "usage.csv rows: ok: 24 rows, totals EUR " in out
    assert "usage.csv chains: ok: 1 partitions link up" in out
    assert out.strip().endswith("export verified: 10 checks passed")


def test_verify_names_the_file_when_one_byte_changes_and_the_signature_when_it_is_wrong(
    billed: None, s3_store: Any, auditor: User, tmp_path: Path, settings: Any
) -> None:
    job = export_job_create(created_by=auditor, filters=ExportFilters(), formats=["csv", "jsonl", "parquet"])
    export_job_run(job_id=job.pk)
    job.refresh_from_db()
    page = Client()
    page.force_login(auditor)
    _download(page, job, tmp_path)
    _verify(tmp_path)

    csv_path = tmp_path / "usage.jsonl"
    original = csv_path.read_bytes()
    changed = bytearray(original)
    at = original.index(b'"BilledCost":"') + len(b'"BilledCost":"')
    changed[at] = ord("9") if changed[at] != ord("9") else ord("8")  # one digit of one amount
    csv_path.write_bytes(bytes(changed))
    with pytest.raises(CommandError, match=r"^export does not match its manifest: usage\.jsonl: sha256 "):
        _verify(tmp_path)
    assert "usage.jsonl rows: MISMATCH: totals is" in (tmp_path / "verify.out").read_text()
    csv_path.write_bytes(original)

    manifest_path = tmp_path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["totals"]["USD"] = "0.000000000"  # a doctored total the files no longer match
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(
        CommandError,
        match=r"^export does not match its manifest: signature: Ed25519 signature does not match",
    ):
        _verify(tmp_path)
    manifest_path.write_text(json.dumps(job.manifest))
    _verify(tmp_path)
    settings.EXPORT_ED25519_KEY = _another_key_pem()
    with pytest.raises(CommandError, match="signature: signed by key .* which is not among the public keys"):
        _verify(tmp_path)


def test_running_the_task_twice_is_a_no_op_and_a_killed_run_starts_over_on_the_same_keys(
    billed: None, s3_store: Any, auditor: User
) -> None:
    from billing.tasks import export_job_run_task

    assert export_job_run_task.name == "billing.export_job_run"
    job = export_job_create(created_by=auditor, filters=ExportFilters(), formats=["csv", "parquet"])
    export_job_run_task(job.pk)
    job.refresh_from_db()
    finished, manifest = job.finished_at, job.manifest
    key = f"switchyard/exports/{job.pk}/usage.csv"
    etag = s3_store.head_object(Bucket=s3_store.bucket, Key=key)["ETag"]

    assert export_job_run(job_id=job.pk) is None  # finished: nothing happens
    export_job_run_task(job.pk)
    job.refresh_from_db()
    assert (job.finished_at, job.manifest) == (finished, manifest)
    assert export_job_run(job_id=987654321) is None  # a job that is gone

    # A worker died mid-run: the job is still `running` and its message comes back.
    billed_later = make_cluster(price=None)
    make_price(cluster=billed_later, unit_price=Decimal("3"), effective_from=DAY - timedelta(days=1))
    usage_record_batch(items=[UsageInput(unit=Unit.ACCELERATOR_HOUR, quantity=Decimal("1"), occurred_at=DAY,
                                         idempotency_key="after", subject_type="x", subject_id="1",
                                         cluster=billed_later)])  # fmt: skip
    ExportJob.objects.filter(pk=job.pk).update(status=ExportJob.Status.RUNNING, manifest={})
    s3_store.delete_object(Bucket=s3_store.bucket, Key=key)
    rerun = export_job_run(job_id=job.pk)
    assert rerun is not None and rerun.status == "succeeded"
    # Same rows (pinned to the ledger head when the job was made), same bytes, same keys.
    assert rerun.manifest["row_count"] == 24 and rerun.manifest["files"] == manifest["files"]
    assert s3_store.head_object(Bucket=s3_store.bucket, Key=key)["ETag"] == etag
    keys = [o["Key"] for o in s3_store.list_objects_v2(Bucket=s3_store.bucket)["Contents"]]
    assert len(keys) == 3


def test_an_api_token_downloads_each_file_the_job_lists(
    billed: None, auditor: User, viewer: User, settings: Any, tmp_path: Path
) -> None:
    """`files[].url` is the API's own download, which a bearer token reaches (it used to be the
    page's link, which answered a token with a redirect to the login page)."""
    settings.OBJECT_STORE_URL = f"file://{tmp_path}/objects"
    job = export_job_create(
        created_by=auditor, filters=ExportFilters(unit="accelerator_hour"), formats=["csv"]
    )
    export_job_run(job_id=job.pk)
    client = api_client(auditor)
    files = client.get(f"/api/export-jobs/{job.pk}/").json()["files"]
    assert sorted(f["name"] for f in files) == ["manifest.json", "usage.csv"]
    for listed in files:
        download = client.get(listed["url"])
        assert download.status_code == 200, listed
        stored = tmp_path / "objects" / "exports" / str(job.pk) / listed["name"]
        assert b"".join(download.streaming_content) == stored.read_bytes()
        disposition = f'attachment; filename="switchyard-export-{job.pk}-{listed["name"]}"'
        assert download["Content-Disposition"] == disposition
    assert client.get(f"/api/export-jobs/{job.pk}/files/usage.parquet/").status_code == 404
    assert client.get(f"/api/export-jobs/{job.pk}/files/..%2Fsecret/").status_code == 404
    assert api_client(viewer).get(files[0]["url"]).status_code == 403
    assert APIClient().get(files[0]["url"]).status_code == 401


def test_the_export_jobs_api_refuses_bad_input_and_outsiders(auditor: User, viewer: User) -> None:
    assert APIClient().get("/api/export-jobs/").status_code == 401
    assert api_client(viewer).get("/api/export-jobs/").status_code == 403
    assert api_client(viewer).post("/api/export-jobs/", {}, format="json").status_code == 403
    bad = api_client(auditor).post(
        "/api/export-jobs/",
        {"filters": {"start": "2026-05-03", "end": "2026-05-01", "unit": "litres"}, "formats": ["xlsx"]},
        format="json",
    )
    assert bad.status_code == 400
    body = bad.json()
    assert body["filters"]["end"] == ["end must be after start"] and "unit" in body["filters"]
    assert body["formats"] == ["unknown format 'xlsx'; one of csv, jsonl, parquet"]
    assert ExportJob.objects.count() == 0
    assert api_client(auditor).get("/api/export-jobs/").json()["results"] == []


def test_the_job_page_shows_the_manifest_and_files_to_ledger_readers_only(
    billed: None, auditor: User, viewer: User, settings: Any, tmp_path: Path
) -> None:
    settings.OBJECT_STORE_URL = f"file://{tmp_path}/objects"  # the local-directory store works the same
    job = export_job_create(
        created_by=auditor, filters=ExportFilters(unit="accelerator_hour"), formats=["csv"]
    )
    export_job_run(job_id=job.pk)
    job.refresh_from_db()
    assert (tmp_path / "objects" / "exports" / str(job.pk) / "usage.csv").is_file()

    page = Client()
    page.force_login(auditor)
    html = page.get(f"/billing/exports/{job.pk}/").content.decode()
    assert "Succeeded" in html and job.manifest["heads"]["main"]["hash"] in html
    assert f"/billing/exports/{job.pk}/files/usage.csv" in html
    download = page.get(f"/billing/exports/{job.pk}/files/usage.csv")
    assert download["Content-Disposition"] == f'attachment; filename="switchyard-export-{job.pk}-usage.csv"'
    assert b"".join(download.streaming_content).count(b"\n") == 25
    assert page.get(f"/billing/exports/{job.pk}/files/usage.parquet").status_code == 404
    assert page.get(f"/billing/exports/{job.pk}/files/..%2Fsecret").status_code == 404

    outsider = Client()
    outsider.force_login(viewer)
    assert outsider.get(f"/billing/exports/{job.pk}/").status_code == 403
    assert outsider.get(f"/billing/exports/{job.pk}/files/usage.csv").status_code == 403

    # The export page starts a job for all three formats and lands on its page.
    with_job = page.post("/billing/export/", {"format": "csv", "action": "job"})
    newest = ExportJob.objects.order_by("-pk").first()
    assert newest is not None and with_job["Location"] == f"/billing/exports/{newest.pk}/"
    assert newest.formats == ["csv", "jsonl", "parquet"]


def test_export_run_writes_a_local_export_that_verifies(billed: None, tmp_path: Path) -> None:
    out = tmp_path / "local"
    with (tmp_path / "run.out").open("w") as fh:
        call_command("export", "run", "--format", "csv", "--format", "parquet", "--unit", "accelerator_hour",
                     "--start", "2026-05-04T12:00:00Z", "--out", str(out), stdout=fh)  # fmt: skip
    assert "21 rows as of the ledger heads (main 24)" in (tmp_path / "run.out").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "usage.csv", "usage.parquet"]
    assert "export verified: 7 checks passed" in _verify(out)
    with pytest.raises(CommandError, match="bad filters: start:"):
        call_command("export", "run", "--start", "soon", "--out", str(out))
