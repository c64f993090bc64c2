"""The project's object store (OBJECT_STORE_URL), for tensors, checkpoints and exports.

The store itself is the Django-free blob store in storage.objectstore; this module binds it
to settings, for every app.
"""

from __future__ import annotations

from urllib.parse import urlparse

from django.conf import settings

from storage.objectstore import ObjectStore, open_store


def default_store() -> ObjectStore:
    return open_store(settings.OBJECT_STORE_URL, endpoint_url=settings.OBJECT_STORE_ENDPOINT_URL)


def object_store_ensure_bucket() -> str:
    """Create the S3 bucket named by OBJECT_STORE_URL if it is missing (file:// needs nothing)."""
    parsed = urlparse(settings.OBJECT_STORE_URL)
    if parsed.scheme != "s3":
        default_store()  # creates the directory
        return f"directory ready: {settings.OBJECT_STORE_URL}"
    import boto3
    from botocore.exceptions import ClientError

    client = boto3.client("s3", endpoint_url=settings.OBJECT_STORE_ENDPOINT_URL)
    try:
        client.head_bucket(Bucket=parsed.netloc)
        return f"bucket exists: {parsed.netloc}"
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
            raise
    client.create_bucket(Bucket=parsed.netloc)
    return f"bucket created: {parsed.netloc}"


def object_store_health() -> dict[str, object]:
    """Whether the store answers (lists one key); never raises."""
    try:
        default_store().list("healthz/")
        return {"ok": True, "url": settings.OBJECT_STORE_URL}
    except Exception as exc:  # any failure means "unreachable" for /healthz
        return {"ok": False, "url": settings.OBJECT_STORE_URL, "error": f"{type(exc).__name__}: {exc}"}
