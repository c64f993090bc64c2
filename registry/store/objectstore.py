"""The project's object store (OBJECT_STORE_URL), for tensors, checkpoints and exports.

The store itself is the Django-free blob store in storage.objectstore; this module binds it
to settings, for every app. Every S3 request passes the outbound guard (installed by
registry.apps): the endpoint is an admin's setting, so it may be private, never link-local
or a metadata address.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlparse

from django.conf import settings

from storage.objectstore import ObjectStore, open_store, s3_client


def default_store() -> ObjectStore:
    return configured_store(settings.OBJECT_STORE_URL)


def configured_store(url: str) -> ObjectStore:
    """A store at `url` on the configured endpoint (a bucket of the installation's S3)."""
    return open_store(
        url, endpoint_url=settings.OBJECT_STORE_ENDPOINT_URL, transfer=settings.OBJECT_STORE_TRANSFER
    )


def object_store_ensure_bucket() -> str:
    """Create the S3 bucket named by OBJECT_STORE_URL if it is missing (file:// needs nothing)."""
    parsed = urlparse(settings.OBJECT_STORE_URL)
    if parsed.scheme != "s3":
        default_store()  # creates the directory
        return f"directory ready: {settings.OBJECT_STORE_URL}"
    from botocore.exceptions import ClientError

    client = s3_client(settings.OBJECT_STORE_ENDPOINT_URL)
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


STORE_URI_REFUSED = "must be a file:// or s3:// URI inside the installation's object store (OBJECT_STORE_URL)"


def store_uri_problem(uri: str) -> str | None:
    """Why `uri` is not an object inside OBJECT_STORE_URL, or None.

    Model artifacts are read by `serve_model` with the server's file access and S3 credentials,
    so a user may only name one inside the installation's store: no other bucket, no path of
    the machine (`..`, symlinks and all are judged after resolving), one message for every
    refusal whether or not the target exists.
    """
    store = urlparse(settings.OBJECT_STORE_URL)
    parsed = urlparse(uri)
    if parsed.scheme != store.scheme or parsed.params or parsed.query or parsed.fragment:
        return STORE_URI_REFUSED
    if any(seg in (".", "..") for seg in parsed.path.split("/")) or "\\" in uri or not uri.isprintable():
        return STORE_URI_REFUSED
    if parsed.scheme == "file":
        root = os.path.realpath(unquote(store.netloc + store.path))
        path = os.path.realpath(unquote(parsed.netloc + parsed.path))
        return None if path.startswith(root.rstrip("/") + "/") else STORE_URI_REFUSED
    if parsed.scheme == "s3":
        prefix = store.path.strip("/")
        key = parsed.path.lstrip("/")
        inside = parsed.netloc == store.netloc and (not prefix or key.startswith(prefix + "/"))
        return None if inside else STORE_URI_REFUSED
    return STORE_URI_REFUSED


def object_store_key(uri: str) -> str | None:
    """The key that `uri` (file:// or s3://) names inside OBJECT_STORE_URL ("" for the store's
    root itself), or None if it lies outside the store. file:// paths are compared after
    resolving symlinks and `..`, so a path that reaches the store another way still counts as
    inside it (registry.store.keys judges who may name it)."""
    store = urlparse(settings.OBJECT_STORE_URL)
    parsed = urlparse(uri)
    if parsed.scheme != store.scheme:
        return None
    if parsed.scheme == "file":
        root = os.path.realpath(unquote(store.netloc + store.path)).rstrip("/")
        path = os.path.realpath(unquote(parsed.netloc + parsed.path))
        if path == root:
            return ""
        return path[len(root) + 1 :] if path.startswith(root + "/") else None
    if parsed.scheme == "s3":
        prefix = store.path.strip("/")
        key = parsed.path.lstrip("/").rstrip("/")
        if parsed.netloc != store.netloc:
            return None
        if not prefix:
            return key
        if key == prefix:
            return ""
        return key[len(prefix) + 1 :] if key.startswith(prefix + "/") else None
    return None
