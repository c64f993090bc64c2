"""The tensor blob: a JSON header and raw little-endian tensor bytes, no pickle.

Layout: b"SYD1", a 4-byte little-endian header length, the JSON header
({"meta": ..., "tensors": [{"name", "dtype", "shape", "n"}, ...]}), then each tensor's bytes in
order. Loading a blob never runs code. The engine's deltas, global versions and checkpoints and
the model artifacts use it.

A blob is written and read as a stream, so no blob exists whole in memory beside its tensors:
``pack_stream`` yields the header (every size is known from the tensors' shapes and dtypes)
and then each tensor's own memory, uncopied; ``read`` fills freshly allocated tensors straight
from a readable stream. ``pack`` and ``unpack`` are the same format as one byte string, for
small blobs. ``blob_write`` and ``blob_read`` stream a blob into and out of an object store;
given a ``Meter``, they count the bytes that crossed (every piece handed to the store, every
byte read from it), so a caller reports measured traffic instead of computing it.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable, Container, Iterator
from typing import Any, Protocol

import torch

from storage.objectstore import ObjectStore

_MAGIC = b"SYD1"
_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
}


class Readable(Protocol):
    """What ``read`` needs of a stream: an open file, io.BytesIO, ObjectStore.open_read's stream."""

    def read(self, n: int = -1, /) -> bytes: ...

    def readinto(self, buffer: memoryview, /) -> int | None: ...


class Meter:
    """Bytes a caller wrote to and read from a store through blob_write and blob_read."""

    def __init__(self) -> None:
        self.written = 0
        self.read = 0

    def pieces(self, chunks: Iterator[bytes | memoryview]) -> Iterator[bytes | memoryview]:
        """`chunks`, counting each piece as the store takes it."""
        for chunk in chunks:
            self.written += memoryview(chunk).nbytes
            yield chunk


class _MeteredReader:
    """A Readable that counts what it hands out into its meter."""

    def __init__(self, stream: Readable, meter: Meter) -> None:
        self._stream = stream
        self._meter = meter

    def read(self, n: int = -1, /) -> bytes:
        data = self._stream.read(n)
        self._meter.read += len(data)
        return data

    def readinto(self, buffer: memoryview, /) -> int | None:
        n = self._stream.readinto(buffer)
        self._meter.read += n or 0
        return n


def _bytes_view(t: torch.Tensor) -> memoryview:
    """The tensor's bytes as a flat view of its own memory (a copy only if it is not contiguous)."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return flat.view(torch.uint8).numpy().data


def pack_stream(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Iterator[bytes | memoryview]:
    """The blob of `meta` (JSON-serialisable) and the tensors, in the order given, as pieces:
    the header, then one view per tensor."""
    index = [
        {
            "name": name,
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
            "n": t.numel() * t.element_size(),
        }
        for name, t in tensors.items()
    ]
    header = json.dumps({"meta": meta, "tensors": index}).encode()
    yield _MAGIC + struct.pack("<I", len(header)) + header
    for t in tensors.values():
        yield _bytes_view(t)


def pack(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> bytes:
    """One blob of `meta` and the tensors as a byte string (``pack_stream`` joined)."""
    return b"".join(pack_stream(meta, tensors))


def _fill(stream: Readable, target: memoryview) -> None:
    """Read exactly len(target) bytes into target; ValueError if the stream ends first."""
    done = 0
    while done < len(target):
        n = stream.readinto(target[done:])
        if not n:
            raise ValueError(f"truncated tensor blob: {len(target) - done} bytes missing")
        done += n


def _read(stream: Readable, n: int) -> bytes:
    buf = bytearray(n)
    _fill(stream, memoryview(buf))
    return bytes(buf)


def read_header(stream: Readable) -> dict[str, Any]:
    """The meta of the blob at the stream's position, without reading its tensors."""
    if stream.read(4) != _MAGIC:
        raise ValueError("not a Switchyard tensor blob")
    (hlen,) = struct.unpack("<I", _read(stream, 4))
    meta: dict[str, Any] = json.loads(_read(stream, hlen))["meta"]
    return meta


SKIP_BLOCK = 1 << 20  # bytes read at a time past a tensor the reader does not keep


def read(
    stream: Readable, keep: Callable[[list[str]], Container[str]] | None = None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(meta, tensors) of the blob at the stream's position; ValueError for anything else.

    `keep`, given the names of the blob's tensors, says which to return: the others are read
    past a block at a time and never held (a learner wants a version's mirror, not its params
    and momentum)."""
    if stream.read(4) != _MAGIC:
        raise ValueError("not a Switchyard tensor blob")
    (hlen,) = struct.unpack("<I", _read(stream, 4))
    header = json.loads(_read(stream, hlen))
    wanted = keep([item["name"] for item in header["tensors"]]) if keep is not None else None
    scratch = memoryview(bytearray(SKIP_BLOCK)) if wanted is not None else None
    tensors: dict[str, torch.Tensor] = {}
    for item in header["tensors"]:
        if wanted is not None and item["name"] not in wanted:
            assert scratch is not None  # noqa: S101 (made with wanted)
            left = int(item["n"])
            while left:
                step = min(left, SKIP_BLOCK)
                _fill(stream, scratch[:step])
                left -= step
            continue
        t = torch.empty(item["shape"], dtype=_DTYPES[item["dtype"]])
        if t.numel() * t.element_size() != item["n"]:
            raise ValueError(f"tensor {item['name']!r}: {item['n']} bytes do not fit shape {item['shape']}")
        if item["n"]:
            _fill(stream, t.reshape(-1).view(torch.uint8).numpy().data)
        tensors[item["name"]] = t
    return header["meta"], tensors


def unpack(blob: bytes) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(meta, tensors) of a blob that `pack` wrote; ValueError for anything else."""
    return read(io.BytesIO(blob))


def blob_write(
    store: ObjectStore,
    key: str,
    meta: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    *,
    if_absent: bool = False,
    meter: Meter | None = None,
) -> bool:
    """Stream a blob into `store` at `key`; with `if_absent`, False (nothing written) if it exists.
    `meter` counts the bytes the store took (for `if_absent`, what it read before refusing)."""
    chunks = pack_stream(meta, tensors)
    if meter is not None:
        chunks = meter.pieces(chunks)
    if if_absent:
        return store.put_stream_if_absent(key, chunks)
    store.put_stream(key, chunks)
    return True


def blob_read(
    store: ObjectStore,
    key: str,
    *,
    meter: Meter | None = None,
    keep: Callable[[list[str]], Container[str]] | None = None,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(meta, tensors) of the blob at `key`, streamed; ObjectNotFoundError if it is missing.
    `meter` counts the bytes read from the store; `keep` selects the tensors returned (`read`)."""
    with store.open_read(key) as stream:
        return read(stream if meter is None else _MeteredReader(stream, meter), keep)


def blob_meta(store: ObjectStore, key: str, *, meter: Meter | None = None) -> dict[str, Any]:
    """The meta of the blob at `key`, read from its header only (a few KiB however large the
    blob); ObjectNotFoundError if it is missing. `meter` counts the bytes read."""
    with store.open_read(key) as stream:
        return read_header(stream if meter is None else _MeteredReader(stream, meter))
