"""Streaming S3 transfers with bounded memory: a multipart upload fed part by part, and a
reader that fetches an object in ranged GETs.

A model-sized object (a 1B-parameter version blob is about 15 GB) never exists whole in this
process: the upload holds the part it is filling plus at most ``concurrency`` parts in flight,
the reader at most ``concurrency`` parts fetched ahead. An object that fits in one part is one
``PutObject``, a larger one a multipart upload (S3 refuses single PUTs above 5 GB). Every part
carries a CRC32 checksum that S3 verifies on receipt (``ChecksumAlgorithm``); an object of one
part is read back with ``ChecksumMode`` so botocore verifies it too; ranged reads of a larger
object are pinned to the ETag seen when the read began (``IfMatch``), so an object overwritten
mid-read fails instead of mixing two versions.

Part size and concurrency are read from the environment in one place (``transfer_from_env``):

    SWITCHYARD_OBJECT_STORE_PART_BYTES    bytes per part, default 64 MiB, at least 5 MiB (S3's minimum)
    SWITCHYARD_OBJECT_STORE_CONCURRENCY   parts in flight per transfer, default 4
"""

from __future__ import annotations

import io
import os
from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20
MIN_PART_BYTES = 5 * MIB  # S3 refuses smaller parts (except the last)
MAX_PARTS = 10_000  # S3's limit per multipart upload
CHECKSUM = "CRC32"  # computed by botocore without extra packages, verified by S3 per part

Chunk = bytes | bytearray | memoryview


@dataclass(frozen=True)
class Transfer:
    """How large objects move: bytes per part and parts in flight per transfer."""

    part_bytes: int = 64 * MIB
    concurrency: int = 4

    def __post_init__(self) -> None:
        if self.part_bytes < MIN_PART_BYTES:
            raise ValueError(
                f"part size must be at least {MIN_PART_BYTES} bytes (S3's minimum), got {self.part_bytes}"
            )
        if self.concurrency < 1:
            raise ValueError(f"transfer concurrency must be at least 1, got {self.concurrency}")


def _env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def transfer_from_env(environ: Mapping[str, str] | None = None) -> Transfer:
    """The transfer settings from the environment; ValueError names a bad variable."""
    env = os.environ if environ is None else environ
    try:
        return Transfer(
            part_bytes=_env_int(env, "SWITCHYARD_OBJECT_STORE_PART_BYTES", Transfer.part_bytes),
            concurrency=_env_int(env, "SWITCHYARD_OBJECT_STORE_CONCURRENCY", Transfer.concurrency),
        )
    except ValueError as exc:
        raise ValueError(f"object store transfer settings: {exc}") from None


def _error_code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


PRECONDITION_FAILED = ("PreconditionFailed", "412", "ConditionalRequestConflict")


class _Multipart:
    """One multipart upload: parts sent on a small thread pool, at most `concurrency` in flight."""

    def __init__(self, client: Any, bucket: str, key: str, transfer: Transfer) -> None:
        self.client, self.bucket, self.key, self.transfer = client, bucket, key, transfer
        resp = client.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm=CHECKSUM)
        self.upload_id = resp["UploadId"]
        self.pool = ThreadPoolExecutor(max_workers=transfer.concurrency, thread_name_prefix="s3-part")
        self.in_flight: deque[Future[dict[str, Any]]] = deque()
        self.parts: list[dict[str, Any]] = []

    def _send(self, number: int, body: bytearray) -> dict[str, Any]:
        resp = self.client.upload_part(
            Bucket=self.bucket,
            Key=self.key,
            UploadId=self.upload_id,
            PartNumber=number,
            Body=body,
            ChecksumAlgorithm=CHECKSUM,
        )
        return {
            "PartNumber": number,
            "ETag": resp["ETag"],
            f"Checksum{CHECKSUM}": resp[f"Checksum{CHECKSUM}"],
        }

    def add(self, body: bytearray) -> None:
        number = len(self.parts) + len(self.in_flight) + 1
        if number > MAX_PARTS:
            raise ValueError(
                f"{self.key}: more than {MAX_PARTS} parts; raise SWITCHYARD_OBJECT_STORE_PART_BYTES"
            )
        while len(self.in_flight) >= self.transfer.concurrency:
            self.parts.append(self.in_flight.popleft().result())
        self.in_flight.append(self.pool.submit(self._send, number, body))

    def complete(self, *, if_absent: bool) -> bool:
        while self.in_flight:
            self.parts.append(self.in_flight.popleft().result())
        extra = {"IfNoneMatch": "*"} if if_absent else {}
        try:
            self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=self.key,
                UploadId=self.upload_id,
                MultipartUpload={"Parts": self.parts},
                **extra,
            )
        except Exception as exc:
            if if_absent and _error_code(exc) in PRECONDITION_FAILED:
                self.abort()
                return False
            raise
        self.pool.shutdown()
        return True

    def abort(self) -> None:
        for future in self.in_flight:
            future.cancel()
        self.pool.shutdown(wait=True)
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id)
        except Exception:  # noqa: S110  best effort: S3's lifecycle rules reap what is left
            pass


def s3_upload(
    client: Any,
    bucket: str,
    key: str,
    chunks: Iterable[Chunk],
    transfer: Transfer,
    *,
    if_absent: bool = False,
) -> bool:
    """Write the concatenated `chunks` to bucket/key, a part at a time.

    With `if_absent` the write is conditional (``If-None-Match: *``, on the PUT or on completing
    the multipart upload) and returns False, writing nothing, when the key already exists.
    """
    size = transfer.part_bytes
    buf = bytearray()  # grown as filled: a small object costs its size, not a part's
    upload: _Multipart | None = None
    try:
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            while view:
                if len(buf) == size:  # a full part and more to come: send it
                    if upload is None:
                        if if_absent and _exists(client, bucket, key):
                            return False  # published already: skip uploading a model's bytes again
                        upload = _Multipart(client, bucket, key, transfer)
                    upload.add(buf)
                    buf = bytearray()
                n = min(size - len(buf), len(view))
                buf += view[:n]
                view = view[n:]
        if upload is None:
            return _put_one(client, bucket, key, buf, if_absent=if_absent)
        if buf:
            upload.add(buf)
        return upload.complete(if_absent=if_absent)
    except BaseException:
        if upload is not None:
            upload.abort()
        raise


def _put_one(client: Any, bucket: str, key: str, body: bytearray, *, if_absent: bool) -> bool:
    extra = {"IfNoneMatch": "*"} if if_absent else {}
    try:
        client.put_object(Bucket=bucket, Key=key, Body=body, ChecksumAlgorithm=CHECKSUM, **extra)
    except Exception as exc:
        if if_absent and _error_code(exc) in PRECONDITION_FAILED:
            return False
        raise
    return True


def _exists(client: Any, bucket: str, key: str) -> bool:
    try:
        client.head_object(Bucket=bucket, Key=key)
        return True
    except Exception as exc:
        if _error_code(exc) in ("404", "NoSuchKey", "NotFound"):
            return False
        raise


class S3RangeReader(io.RawIOBase):
    """A readable stream over one S3 object, fetched in part-sized ranged GETs read ahead on a
    small thread pool. Open it with :func:`s3_open`."""

    def __init__(self, client: Any, bucket: str, key: str, size: int, etag: str, transfer: Transfer) -> None:
        super().__init__()
        self.client, self.bucket, self.key = client, bucket, key
        self.size, self.etag, self.transfer = size, etag, transfer
        self.pool = ThreadPoolExecutor(max_workers=transfer.concurrency, thread_name_prefix="s3-range")
        self.ahead: deque[Future[bytes]] = deque()
        self.next_start = 0
        self.current = memoryview(b"")

    def readable(self) -> bool:
        return True

    def _fetch(self, start: int, end: int) -> bytes:
        resp = self.client.get_object(
            Bucket=self.bucket, Key=self.key, Range=f"bytes={start}-{end - 1}", IfMatch=self.etag
        )
        with resp["Body"] as body:
            data = bytes(body.read())
        if len(data) != end - start:
            raise OSError(f"{self.key}: range {start}-{end} returned {len(data)} bytes")
        return data

    def _top_up(self) -> None:
        while len(self.ahead) < self.transfer.concurrency and self.next_start < self.size:
            end = min(self.next_start + self.transfer.part_bytes, self.size)
            self.ahead.append(self.pool.submit(self._fetch, self.next_start, end))
            self.next_start = end

    def readinto(self, buffer: Any) -> int:
        if not self.current:
            self._top_up()
            if not self.ahead:
                return 0
            self.current = memoryview(self.ahead.popleft().result())
            self._top_up()
        target = memoryview(buffer).cast("B")
        n = min(len(target), len(self.current))
        target[:n] = self.current[:n]
        self.current = self.current[n:]
        return n

    def close(self) -> None:
        for future in self.ahead:
            future.cancel()
        self.ahead.clear()
        self.current = memoryview(b"")
        self.pool.shutdown(wait=True)
        super().close()


def s3_open(client: Any, bucket: str, key: str, transfer: Transfer) -> io.BufferedIOBase:
    """A readable stream of bucket/key; raises the client's 404 error now if it is missing.

    An object of one part is one checksum-verified GET; a larger one is read in ranges."""
    head = client.head_object(Bucket=bucket, Key=key)
    if head["ContentLength"] <= transfer.part_bytes:
        resp = client.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        with resp["Body"] as body:
            return io.BytesIO(body.read())
    return io.BufferedReader(
        S3RangeReader(client, bucket, key, head["ContentLength"], head["ETag"], transfer)
    )
