"""A small blob store over ``file://`` directories and ``s3://`` buckets.

The engine keeps deltas and global versions here; the Django side reuses this module for its
``OBJECT_STORE_URL``. Keys are ``/``-separated relative names (``runs/7/versions/f0/v00000003``).

    store = open_store("file:///var/lib/switchyard/objects")
    store = open_store("s3://bucket/prefix", endpoint_url="http://127.0.0.1:9000")
    store.put("a/b", b"...");  store.get("a/b");  store.exists("a/b")
    store.list("a/")                  # sorted keys under a prefix
    store.put_if_absent("a/c", b"x")  # True if this call wrote it, False if it existed
    store.delete("a/b")               # gone (a missing key is not an error)

Large objects (tensor blobs, checkpoints, exports) move as streams with bounded memory, never
as one byte string: ``put_stream`` writes an iterable of chunks, ``open_read`` returns a readable
stream, ``put_file`` and ``iter_chunks`` copy a local file in and stream an object out in blocks.
On S3 that is a multipart upload of part-sized parts and ranged reads (storage.multipart: part
size and concurrency are settings); on ``file://`` chunked writes to a temp file renamed into
place, so a reader never sees half an object.

    store.put_stream("a/big", chunks)           # chunks: bytes, bytearray or memoryview pieces
    with store.open_read("a/big") as stream:    # ObjectNotFoundError here if it is missing
        stream.readinto(buffer)

``put_if_absent`` is what makes publishing a global version idempotent. On ``file://`` it is
atomic (``os.link`` of a finished temp file refuses to overwrite). On S3 it uses a conditional
write (``If-None-Match: *`` on the PUT, or on completing a multipart upload), which AWS S3,
MinIO and moto honour.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

from storage.multipart import Chunk, Transfer, s3_open, s3_upload, transfer_from_env

BLOCK = 1 << 16  # bytes per chunk when streaming an object
FILE_BLOCK = 1 << 20  # bytes per read when copying a local file into a store

# A check every S3 request runs before it is sent (botocore's `before-send` event), set once per
# process by the application (registry.apps: the outbound guard). It receives the request
# and raises to stop it. Kept here as a plain callable so this module stays free of Django.
_request_guard: Callable[..., None] | None = None


def set_request_guard(guard: Callable[..., None] | None) -> None:
    """Install the check that every S3 client made here runs before each request."""
    global _request_guard
    _request_guard = guard


def _guarded(request: Any, **kwargs: Any) -> None:
    if _request_guard is not None:
        _request_guard(request=request, **kwargs)


def s3_client(endpoint_url: str | None = None, credentials: tuple[str, str] | None = None) -> Any:
    """A boto3 S3 client whose requests pass the installed request guard.

    `credentials` (access key id, secret access key) are this client's own (a cluster's store);
    without them boto3 finds the process's (environment, profile, instance role)."""
    import boto3  # imported lazily: only S3 users need it

    keys = {}
    if credentials is not None:
        keys = {"aws_access_key_id": credentials[0], "aws_secret_access_key": credentials[1]}
    client = boto3.client("s3", endpoint_url=endpoint_url, **keys)
    client.meta.events.register("before-send", _guarded)
    return client


class ObjectStore(Protocol):
    """What every store offers. Keys never start with ``/``."""

    url: str

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int:
        """The object's size in bytes; ObjectNotFoundError if it is missing."""
        ...

    def list(self, prefix: str = "") -> list[str]: ...

    def put_if_absent(self, key: str, data: bytes) -> bool: ...

    def delete(self, key: str) -> None: ...

    def put_file(self, key: str, path: Path) -> None: ...

    def iter_chunks(self, key: str, block: int = BLOCK) -> Iterator[bytes]: ...

    def put_stream(self, key: str, chunks: Iterable[Chunk]) -> None: ...

    def put_stream_if_absent(self, key: str, chunks: Iterable[Chunk]) -> bool: ...

    def open_read(self, key: str) -> io.BufferedIOBase: ...


class ObjectNotFoundError(KeyError):
    """Raised by ``get`` for a missing key."""


def _check_key(key: str) -> str:
    if not key or key.startswith("/") or ".." in key.split("/"):
        raise ValueError(f"bad object key: {key!r}")
    return key


class FileStore:
    """Objects as files under a root directory; writes are atomic (temp file + rename)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def _temp(self, path: Path, chunks: Iterable[Chunk]) -> str:
        """The chunks written one by one to a temp file beside `path` (removed if writing fails)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                for chunk in chunks:
                    fh.write(chunk)
        except BaseException:
            os.unlink(tmp)
            raise
        return tmp

    def put(self, key: str, data: bytes) -> None:
        self.put_stream(key, (data,))

    def put_stream(self, key: str, chunks: Iterable[Chunk]) -> None:
        path = self._path(key)
        os.replace(self._temp(path, chunks), path)

    def put_file(self, key: str, path: Path) -> None:
        """Copy a local file in (temp file + rename, like ``put``), without reading it whole."""
        self.put_stream(key, _file_blocks(path, FILE_BLOCK))

    def local_path(self, key: str) -> Path:
        """The file that holds `key` (for libraries that map a file); ObjectNotFoundError if none."""
        path = self._path(key)
        if not path.is_file():
            raise ObjectNotFoundError(key)
        return path

    def open_read(self, key: str) -> io.BufferedIOBase:
        try:
            return self._path(key).open("rb")
        except (FileNotFoundError, IsADirectoryError):
            raise ObjectNotFoundError(key) from None

    def iter_chunks(self, key: str, block: int = BLOCK) -> Iterator[bytes]:
        """The object in blocks; ObjectNotFoundError now, not at the first read, if it is missing."""
        path = self._path(key)
        if not path.is_file():
            raise ObjectNotFoundError(key)
        return _file_blocks(path, block)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectNotFoundError(key) from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        path = self._path(key)
        if not path.is_file():
            raise ObjectNotFoundError(key)
        return path.stat().st_size

    def list(self, prefix: str = "") -> list[str]:
        keys = []
        # Walk only the deepest directory the prefix names, not the whole store.
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        if not base.is_dir():
            return []
        for p in base.rglob("*"):
            if p.is_file() and not p.name.startswith(".tmp-"):
                key = p.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.put_stream_if_absent(key, (data,))

    def put_stream_if_absent(self, key: str, chunks: Iterable[Chunk]) -> bool:
        path = self._path(key)
        tmp = self._temp(path, chunks)
        try:
            os.link(tmp, path)  # fails if path exists: the first writer wins, atomically
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


class S3Store:
    """Objects in an S3 (or S3-compatible) bucket under an optional prefix, via boto3."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        client: Any = None,
        transfer: Transfer | None = None,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        self.client = client if client is not None else s3_client(endpoint_url, credentials)
        self.transfer = transfer if transfer is not None else transfer_from_env()
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.prefix}"

    def _key(self, key: str) -> str:
        return self.prefix + _check_key(key)

    def put(self, key: str, data: bytes) -> None:
        self.put_stream(key, (data,))

    def put_stream(self, key: str, chunks: Iterable[Chunk]) -> None:
        s3_upload(self.client, self.bucket, self._key(key), chunks, self.transfer)

    def put_stream_if_absent(self, key: str, chunks: Iterable[Chunk]) -> bool:
        return s3_upload(self.client, self.bucket, self._key(key), chunks, self.transfer, if_absent=True)

    def open_read(self, key: str) -> io.BufferedIOBase:
        from botocore.exceptions import ClientError  # imported lazily, like boto3

        try:
            return s3_open(self.client, self.bucket, self._key(key), self.transfer)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise ObjectNotFoundError(key) from None
            raise

    def get(self, key: str) -> bytes:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except self.client.exceptions.NoSuchKey:
            raise ObjectNotFoundError(key) from None
        return bytes(resp["Body"].read())

    def put_file(self, key: str, path: Path) -> None:
        """Upload a local file a part at a time (multipart when larger than one part)."""
        self.put_stream(key, _file_blocks(path, FILE_BLOCK))

    def iter_chunks(self, key: str, block: int = BLOCK) -> Iterator[bytes]:
        """The object's body streamed in blocks; ObjectNotFoundError now if it is missing."""
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        except self.client.exceptions.NoSuchKey:
            raise ObjectNotFoundError(key) from None
        return _closing(body.iter_chunks(block), body)

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def size(self, key: str) -> int:
        from botocore.exceptions import ClientError

        try:
            return int(self.client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise ObjectNotFoundError(key) from None
            raise

    def delete(self, key: str) -> None:
        # S3 answers 204 for a key that does not exist: deleting twice is harmless.
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def list(self, prefix: str = "") -> list[str]:
        keys: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
            for obj in page.get("Contents", []):
                keys.append(obj["Key"][len(self.prefix) :])
        return sorted(keys)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.put_stream_if_absent(key, (data,))


def copy_between(source: ObjectStore, target: ObjectStore, key: str, *, block: int = FILE_BLOCK) -> int:
    """Stream object `key` from `source` into `target` (same key) a block at a time, never whole
    in memory; returns the bytes that crossed. ObjectNotFoundError if `source` lacks it."""
    crossed = 0

    def counted() -> Iterator[bytes]:
        nonlocal crossed
        for data in source.iter_chunks(key, block):
            crossed += len(data)
            yield data

    target.put_stream(key, counted())
    return crossed


def _file_blocks(path: Path, block: int) -> Iterator[bytes]:
    with path.open("rb") as fh:
        while data := fh.read(block):
            yield data


def _closing(chunks: Iterator[bytes], body: Any) -> Iterator[bytes]:
    """Yield from `chunks`, closing the HTTP body when the reader stops (early too)."""
    try:
        yield from chunks
    finally:
        body.close()


def open_store(
    url: str,
    *,
    endpoint_url: str | None = None,
    transfer: Transfer | None = None,
    credentials: tuple[str, str] | None = None,
) -> ObjectStore:
    """A store for ``file:///abs/dir``, ``file://rel/dir`` or ``s3://bucket[/prefix]``; S3 transfers
    use `transfer` (default: the environment's settings, storage.multipart.transfer_from_env) and
    `credentials` (access key id, secret; default: the process's own)."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return FileStore(unquote(parsed.netloc + parsed.path))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"s3 url needs a bucket: {url!r}")
        return S3Store(
            parsed.netloc, parsed.path, endpoint_url=endpoint_url, transfer=transfer, credentials=credentials
        )
    raise ValueError(f"unsupported object store url: {url!r}")
