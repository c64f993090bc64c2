"""Fixtures shared by the billing tests."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from registry.store.objectstore import object_store_ensure_bucket
from tests.factories import unique


@pytest.fixture
def s3_store(s3_server: str, settings: Any) -> Any:
    """OBJECT_STORE_URL on a fresh bucket of the loopback S3 endpoint; returns a boto3 client."""
    bucket = unique("exports")
    settings.OBJECT_STORE_URL = f"s3://{bucket}/switchyard"
    settings.OBJECT_STORE_ENDPOINT_URL = s3_server
    object_store_ensure_bucket()
    client = boto3.client("s3", endpoint_url=s3_server)
    client.bucket = bucket  # for the tests' own reads
    return client
