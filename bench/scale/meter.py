"""What crossed the store, counted where it crosses, and how much memory a process peaked at.

:class:`CountingStore` wraps any storage.objectstore store and counts the objects written
(each ``put_stream``: one logical object, whatever its size), the objects read and deleted.
On S3 it also hooks the boto3 client's own events, so every HTTP request that carries a body
is counted with its size: ``PutObject`` (an object of one part) and ``UploadPart`` (one part of
a multipart upload), and the multipart uploads begun and completed. S3 refuses a single PUT
above 5 GiB; the largest request body is what that limit is checked against.
"""

from __future__ import annotations

import io
import resource
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from storage.multipart import Chunk
from storage.objectstore import BLOCK, ObjectStore, S3Store
from training.engine.transport import object_sizes


def peak_rss_bytes() -> int:
    """This process's peak resident set so far: Linux's VmHWM, which exec resets.

    Not ru_maxrss: getrusage keeps it across execve, so a spawned child would report its
    parent's peak when that is higher (each drill process would start at the bench's own).
    """
    try:
        with open("/proc/self/status") as fh:
            lines = fh.readlines()
    except OSError:
        lines = []  # no /proc (not Linux): getrusage's figure below
    for line in lines:
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


class S3Requests:
    """Counts of the S3 requests a boto3 client sent, from its ``before-parameter-build`` events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # parts are sent on storage.multipart's thread pool
        self.put_object = 0
        self.upload_part = 0
        self.multipart_begun = 0
        self.multipart_completed = 0
        self.get_object = 0
        self.head_object = 0
        self.largest_put_bytes = 0

    def attach(self, client: Any) -> None:
        events = client.meta.events
        events.register("before-parameter-build.s3.PutObject", self._on_body("put_object"))
        events.register("before-parameter-build.s3.UploadPart", self._on_body("upload_part"))
        events.register("before-parameter-build.s3.CreateMultipartUpload", self._on("multipart_begun"))
        events.register("before-parameter-build.s3.CompleteMultipartUpload", self._on("multipart_completed"))
        events.register("before-parameter-build.s3.GetObject", self._on("get_object"))
        events.register("before-parameter-build.s3.HeadObject", self._on("head_object"))

    def _on(self, counter: str) -> Any:
        def count(**_: Any) -> None:
            with self._lock:
                setattr(self, counter, getattr(self, counter) + 1)

        return count

    def _on_body(self, counter: str) -> Any:
        def count(params: dict[str, Any], **_: Any) -> None:
            size = _body_size(params.get("Body", b""))
            with self._lock:
                setattr(self, counter, getattr(self, counter) + 1)
                self.largest_put_bytes = max(self.largest_put_bytes, size)

        return count

    def as_dict(self) -> dict[str, int]:
        return {
            "put_object_requests": self.put_object,
            "upload_part_requests": self.upload_part,
            "multipart_uploads": self.multipart_begun,
            "multipart_completed": self.multipart_completed,
            "get_object_requests": self.get_object,
            "head_object_requests": self.head_object,
            "largest_put_bytes": self.largest_put_bytes,
        }


def _body_size(body: Any) -> int:
    if isinstance(body, bytes | bytearray | memoryview):
        return memoryview(body).nbytes
    if isinstance(body, io.IOBase) and body.seekable():
        here = body.tell()
        size = body.seek(0, io.SEEK_END) - here
        body.seek(here)
        return size
    return 0


class CountingStore:
    """An ObjectStore that counts what passes through it (module docstring)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.s3: S3Requests | None = None
        if isinstance(inner, S3Store):
            self.s3 = S3Requests()
            self.s3.attach(inner.client)
        self.objects_written = 0
        self.bytes_written = 0
        self.largest_object_bytes = 0
        self.objects_read = 0
        self.deletes = 0
        self.lists = 0

    def _counted(self, chunks: Iterable[Chunk], size: list[int]) -> Iterator[Chunk]:
        for chunk in chunks:
            size[0] += memoryview(chunk).nbytes
            yield chunk

    def _wrote(self, size: int) -> None:
        self.objects_written += 1
        self.bytes_written += size
        self.largest_object_bytes = max(self.largest_object_bytes, size)

    def put_stream(self, key: str, chunks: Iterable[Chunk]) -> None:
        size = [0]
        self.inner.put_stream(key, self._counted(chunks, size))
        self._wrote(size[0])

    def put_stream_if_absent(self, key: str, chunks: Iterable[Chunk]) -> bool:
        size = [0]
        wrote = self.inner.put_stream_if_absent(key, self._counted(chunks, size))
        if wrote:
            self._wrote(size[0])
        return wrote

    def put(self, key: str, data: bytes) -> None:
        self.put_stream(key, (data,))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.put_stream_if_absent(key, (data,))

    def put_file(self, key: str, path: Path) -> None:
        self.put_stream(key, _file_chunks(path))

    def open_read(self, key: str) -> io.BufferedIOBase:
        self.objects_read += 1
        return self.inner.open_read(key)

    def get(self, key: str) -> bytes:
        self.objects_read += 1
        return self.inner.get(key)

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def iter_chunks(self, key: str, block: int = BLOCK) -> Iterator[bytes]:
        self.objects_read += 1
        return self.inner.iter_chunks(key, block)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list(self, prefix: str = "") -> list[str]:
        self.lists += 1
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.deletes += 1
        self.inner.delete(key)

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """For training.engine.transport.object_sizes, which cannot see through the wrapper."""
        return object_sizes(self.inner, prefix)

    def counters(self) -> dict[str, Any]:
        return {
            "objects_written": self.objects_written,
            "bytes_written": self.bytes_written,
            "largest_object_bytes": self.largest_object_bytes,
            "objects_read": self.objects_read,
            "deletes": self.deletes,
            "lists": self.lists,
            "s3": self.s3.as_dict() if self.s3 is not None else None,
        }


def _file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as fh:
        while data := fh.read(1 << 20):
            yield data
