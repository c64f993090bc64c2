"""A cluster's own object store (Cluster.object_store_url): its checks and the store itself.

A cluster in another cloud keeps its learners' checkpoints in a store of its own, so that state
which never needs to leave its region does not cross to the installation's store
(OBJECT_STORE_URL) and back. Only deltas and global versions cross; training.services.transfers
measures and bills what does.

The URL, endpoint and credentials are an operator's input and become a path the workers write
to, a host they connect to and a header they sign with: they are checked here, where they enter
(registry.services.clusters calls these checks for the API, the page form and the admin alike).

- ``s3://bucket[/prefix]``: a bucket name as S3 allows it (3-63 lower-case letters, digits,
  dots and hyphens, not an IP address), a prefix of plain segments; no query, fragment, user or
  port. Every request goes through the outbound guard (registry.apps installs it on every boto3
  client): private endpoints yes, link-local and metadata addresses never.
- ``file:///dir``: a directory under CLUSTER_STORE_FILE_ROOT, judged after resolving symlinks
  and ``..``, so that no path of the machine outside that root is ever written.
- credentials: ``ACCESS_KEY_ID:SECRET_ACCESS_KEY``, stored encrypted (registry.crypto), never
  shown again.
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote, urlsplit

from django.conf import settings

from registry.crypto import decrypt_secret
from registry.models import Cluster
from registry.outbound.endpoints import endpoint_url_problem
from storage.objectstore import ObjectStore, open_store

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IP_LIKE = re.compile(r"^\d+\.\d+\.\d+\.\d+$")
_SEGMENT = re.compile(r"^[A-Za-z0-9._=+-]+$")
_KEY_ID = re.compile(r"^[A-Za-z0-9]{4,128}$")
MAX_SECRET = 256


def cluster_store_url_problem(url: str) -> str | None:
    """Why `url` cannot be a cluster's object store, or None ('' is the installation's store)."""
    if not url:
        return None
    if not url.isprintable() or "\\" in url or "%" in url or len(url) > 500:
        return "must be a plain s3:// or file:// URL (no escapes, backslashes or control characters)"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "must be an s3://bucket[/prefix] or file:///dir URL"
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        return "must not have a query string or fragment"
    if parts.username is not None or parts.password is not None or port is not None:
        return "must not carry a user, password or port (credentials and endpoint are fields of their own)"
    segments = [s for s in parts.path.split("/") if s]
    if any(s in (".", "..") for s in parts.path.split("/")):
        return "must not contain . or .. path segments"
    if parts.scheme == "s3":
        bucket = parts.netloc
        if not _BUCKET.match(bucket) or ".." in bucket or _IP_LIKE.match(bucket):
            return "s3://: the bucket must be a valid S3 bucket name (3-63 of a-z, 0-9, '.', '-')"
        if any(not _SEGMENT.match(s) for s in segments):
            return "s3://: the prefix may hold letters, digits and . _ = + - between slashes"
        return None
    if parts.scheme == "file":
        if parts.netloc:
            return "file://: must be an absolute path (file:///dir)"
        root = os.path.realpath(settings.CLUSTER_STORE_FILE_ROOT)
        path = os.path.realpath(unquote(parts.path))
        if not path.startswith(root.rstrip("/") + "/"):
            return f"file://: must be a directory under {root} (CLUSTER_STORE_FILE_ROOT)"
        return None
    return "must be an s3://bucket[/prefix] or file:///dir URL"


def cluster_store_endpoint_problem(url: str) -> str | None:
    """Why `url` cannot be a cluster store's S3 endpoint, or None ('' is the default endpoint)."""
    return endpoint_url_problem(url) if url else None


def cluster_store_credentials_problem(text: str) -> str | None:
    """Why `text` is not ``ACCESS_KEY_ID:SECRET_ACCESS_KEY``, or None ('' clears them)."""
    if not text:
        return None
    key_id, sep, secret = text.partition(":")
    if not sep or not _KEY_ID.match(key_id):
        return "must be ACCESS_KEY_ID:SECRET_ACCESS_KEY (the key id: 4-128 letters and digits)"
    if not secret or len(secret) > MAX_SECRET or not secret.isprintable() or not secret.isascii():
        return f"the secret access key must be 1-{MAX_SECRET} printable ASCII characters"
    if any(c.isspace() for c in secret):
        return "the secret access key must not contain spaces"
    return None


def cluster_store(cluster: Cluster) -> ObjectStore | None:
    """The cluster's own store, or None when it uses the installation's (OBJECT_STORE_URL)."""
    if not cluster.object_store_url:
        return None
    credentials = None
    if cluster.object_store_credentials_encrypted:
        key_id, _, secret = decrypt_secret(cluster.object_store_credentials_encrypted).partition(":")
        credentials = (key_id, secret)
    return open_store(
        cluster.object_store_url,
        endpoint_url=cluster.object_store_endpoint_url or settings.OBJECT_STORE_ENDPOINT_URL,
        transfer=settings.OBJECT_STORE_TRANSFER,
        credentials=credentials,
    )


def store_identity(cluster: Cluster | None) -> str:
    """Which store a cluster's learners keep their state in: '' for the installation's, else
    the cluster's endpoint and URL (two clusters naming the same bucket share one store)."""
    if cluster is None or not cluster.object_store_url:
        return ""
    endpoint = cluster.object_store_endpoint_url or settings.OBJECT_STORE_ENDPOINT_URL or ""
    return f"{endpoint.rstrip('/')}|{cluster.object_store_url.rstrip('/')}"
