"""OBJECT_STORE_URL through boto3 against a real S3 endpoint (moto's server on loopback)."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from django.core.management import call_command

from registry.store.objectstore import default_store, object_store_health


def test_ensure_bucket_creates_the_bucket_once_and_the_store_then_works(
    s3_server: str, settings: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    settings.OBJECT_STORE_URL = "s3://switchyard-objects/prefix"
    settings.OBJECT_STORE_ENDPOINT_URL = s3_server
    assert object_store_health()["ok"] is False  # no bucket yet

    call_command("ensure_bucket")
    call_command("ensure_bucket")
    out = capsys.readouterr().out
    assert "bucket created: switchyard-objects" in out
    assert "bucket exists: switchyard-objects" in out

    store = default_store()
    store.put("checkpoints/a", b"weights")
    keys = boto3.client("s3", endpoint_url=s3_server).list_objects_v2(Bucket="switchyard-objects")
    assert [o["Key"] for o in keys["Contents"]] == ["prefix/checkpoints/a"]
    assert object_store_health() == {"ok": True, "url": "s3://switchyard-objects/prefix"}


def test_healthz_reports_the_object_store(db: Any, admin_client: Any, tmp_path: Any, settings: Any) -> None:
    settings.OBJECT_STORE_URL = f"file://{tmp_path}/objects"
    body = admin_client.get("/healthz").json()  # the detail is for staff and admins

    assert body["object_store"] == {"ok": True, "url": f"file://{tmp_path}/objects"}
