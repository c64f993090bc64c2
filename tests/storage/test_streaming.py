"""Blobs larger than a part move through the store as streams, in parts, with bounded memory.

The S3 tests run moto's S3 server in a child process, not the suite's in-process `s3_server`:
tracemalloc counts every thread of this process, and moto keeps each uploaded part in memory,
so a server in this process would count the object twice over against the client.
"""

from __future__ import annotations

import json
import math
import os
import socket
import struct
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import torch

from storage.multipart import MIB, Transfer, transfer_from_env
from storage.objectstore import ObjectNotFoundError, S3Store, open_store
from storage.tensorblob import blob_read, blob_write, pack, pack_stream, unpack
from tests.integration.processes import stop_process

PART = 5 * MIB  # S3's smallest part
BUCKET = "switchyard-streaming"


def _tensors() -> dict[str, torch.Tensor]:
    """About 42 MiB of tensors: eight float32 of 5 MiB, a bfloat16 one and a few small ones."""
    g = torch.Generator().manual_seed(7)
    tensors = {f"layer{i}.weight": torch.randn(1024, 1280, generator=g) for i in range(8)}
    tensors["embed"] = torch.randn(512, 1024, generator=g).bfloat16()
    tensors["bias"] = torch.randn(1280, generator=g)
    tensors["codes"] = torch.randint(-8, 8, (333,), generator=g, dtype=torch.int8)
    tensors["empty"] = torch.empty(0, 4)
    return tensors


def _blob_size(meta: dict[str, object], tensors: dict[str, torch.Tensor]) -> int:
    return sum(len(memoryview(piece)) for piece in pack_stream(meta, tensors))


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name], t), name


def _traced_peak(fn):  # type: ignore[no-untyped-def]
    """(fn's result, the peak bytes Python allocated while it ran)."""
    tracemalloc.start()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


@pytest.fixture(scope="module")
def s3_child() -> Iterator[str]:
    """moto's S3 server in its own process, on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    server = subprocess.Popen(  # noqa: S603  our own interpreter running moto
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.1)
        with pytest.MonkeyPatch.context() as mp:
            for key, value in (
                ("AWS_ACCESS_KEY_ID", "testing"),
                ("AWS_SECRET_ACCESS_KEY", "testing"),
                ("AWS_DEFAULT_REGION", "us-east-1"),
            ):
                mp.setenv(key, value)
            url = f"http://127.0.0.1:{port}"
            boto3.client("s3", endpoint_url=url).create_bucket(Bucket=BUCKET)
            yield url
    finally:
        stop_process(server, what="moto's S3 server")


def _s3_store(url: str, prefix: str, *, concurrency: int = 1) -> S3Store:
    store = open_store(
        f"s3://{BUCKET}/{prefix}",
        endpoint_url=url,
        transfer=Transfer(part_bytes=PART, concurrency=concurrency),
    )
    assert isinstance(store, S3Store)
    return store


def _count_calls(store: S3Store, operation: str) -> list[int]:
    """A list that grows by one for every `operation` request the store's client sends."""
    calls: list[int] = []
    store.client.meta.events.register(f"before-call.s3.{operation}", lambda **kw: calls.append(1))
    return calls


def test_a_blob_larger_than_a_part_goes_to_s3_in_parts_and_back_with_bounded_memory(s3_child):
    store = _s3_store(s3_child, "big")
    tensors = _tensors()
    meta = {"fragment": 0, "version": 3}
    size = _blob_size(meta, tensors)
    assert size > 8 * PART
    parts, single_puts = _count_calls(store, "UploadPart"), _count_calls(store, "PutObject")

    _, write_peak = _traced_peak(lambda: blob_write(store, "runs/1/v3.syd", meta, tensors))

    assert len(parts) == math.ceil(size / PART) and not single_puts
    head = store.client.head_object(Bucket=BUCKET, Key="big/runs/1/v3.syd", PartNumber=1)
    assert head["PartsCount"] == len(parts) and head["ContentLength"] == PART
    assert store.client.head_object(Bucket=BUCKET, Key="big/runs/1/v3.syd")["ContentLength"] == size
    ranges = _count_calls(store, "GetObject")

    (got_meta, got), read_peak = _traced_peak(lambda: blob_read(store, "runs/1/v3.syd"))

    assert got_meta == meta
    _assert_same(got, tensors)
    assert len(ranges) == len(parts)  # one ranged GET per part
    # The part being filled plus the one in flight, never the object (about 42 MiB).
    assert write_peak < 3 * PART < size
    assert read_peak < 3 * PART < size


def test_a_blob_of_one_part_is_a_single_put_and_a_single_get(s3_child):
    store = _s3_store(s3_child, "small")
    tensors = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4)}
    parts, puts = _count_calls(store, "UploadPart"), _count_calls(store, "PutObject")
    blob_write(store, "d/one.syd", {"n": 1}, tensors)
    assert (len(parts), len(puts)) == (0, 1)
    gets = _count_calls(store, "GetObject")
    meta, got = blob_read(store, "d/one.syd")
    assert meta == {"n": 1} and len(gets) == 1
    _assert_same(got, tensors)
    assert store.get("d/one.syd") == pack({"n": 1}, tensors)


def test_a_multipart_write_once_keeps_the_first_object(s3_child, monkeypatch):
    store = _s3_store(s3_child, "once", concurrency=2)
    first, second = _tensors(), {k: t + 1 if t.is_floating_point() else t for k, t in _tensors().items()}
    assert blob_write(store, "v/1.syd", {"who": "first"}, first, if_absent=True) is True
    assert blob_write(store, "v/1.syd", {"who": "second"}, second, if_absent=True) is False
    # Two publishers racing past the existence check: completing the upload is what refuses.
    monkeypatch.setattr("storage.multipart._exists", lambda *a: False)
    assert blob_write(store, "v/1.syd", {"who": "second"}, second, if_absent=True) is False
    meta, got = blob_read(store, "v/1.syd")
    assert meta == {"who": "first"}
    _assert_same(got, first)
    assert not store.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads")  # none left behind


def test_a_failed_multipart_write_leaves_no_object_and_no_upload(s3_child):
    store = _s3_store(s3_child, "broken")

    def chunks() -> Iterator[bytes]:
        for _ in range(3):
            yield bytes(PART)
        raise OSError("disk went away")

    with pytest.raises(OSError, match="disk went away"):
        store.put_stream("half.bin", chunks())
    assert not store.exists("half.bin")
    assert not store.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads")
    with pytest.raises(ObjectNotFoundError):
        store.open_read("half.bin")


def test_a_blob_goes_through_a_file_store_in_chunks_with_bounded_memory(tmp_path):
    store = open_store(f"file://{tmp_path}/objects")
    tensors = _tensors()
    size = _blob_size({"k": 1}, tensors)

    _, write_peak = _traced_peak(lambda: blob_write(store, "runs/2/c.syd", {"k": 1}, tensors))
    (meta, got), read_peak = _traced_peak(lambda: blob_read(store, "runs/2/c.syd"))

    assert meta == {"k": 1}
    _assert_same(got, tensors)
    assert (tmp_path / "objects/runs/2/c.syd").stat().st_size == size
    assert write_peak < MIB and read_peak < MIB  # the header and file buffers; no blob copy
    assert not list((tmp_path / "objects/runs/2").glob(".tmp-*"))


def test_a_failed_file_write_leaves_the_old_object_and_no_temp_file(tmp_path):
    store = open_store(f"file://{tmp_path}")
    store.put("a/obj", b"old")

    def chunks() -> Iterator[bytes]:
        yield b"new, half"
        raise OSError("killed")

    with pytest.raises(OSError, match="killed"):
        store.put_stream("a/obj", chunks())
    assert store.get("a/obj") == b"old"
    assert [p.name for p in Path(tmp_path, "a").iterdir()] == ["obj"]


def test_a_blob_written_before_streaming_reads_back_bit_exact():
    """The SYD1 layout, spelled out byte by byte as the pre-streaming writer produced it."""
    index = [
        {"name": "w", "dtype": "float32", "shape": [2, 3], "n": 24},
        {"name": "b", "dtype": "bfloat16", "shape": [2], "n": 4},
        {"name": "q", "dtype": "int8", "shape": [2], "n": 2},
        {"name": "e", "dtype": "float32", "shape": [0], "n": 0},
    ]
    header = json.dumps({"meta": {"step": 3}, "tensors": index}).encode()
    body = struct.pack("<6f", 0, 0.25, 0.5, 0.75, 1.0, 1.25) + bytes.fromhex("c03f00c0") + bytes([0xFD, 0x07])
    old_blob = b"SYD1" + struct.pack("<I", len(header)) + header + body

    meta, tensors = unpack(old_blob)

    assert meta == {"step": 3}
    assert torch.equal(tensors["w"], torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4)
    assert torch.equal(tensors["b"], torch.tensor([1.5, -2.0], dtype=torch.bfloat16))
    assert torch.equal(tensors["q"], torch.tensor([-3, 7], dtype=torch.int8))
    assert tensors["e"].shape == (0,)
    assert pack(meta, tensors) == old_blob  # and the streaming writer writes the same bytes


def test_a_truncated_blob_is_refused():
    blob = pack({}, {"w": torch.ones(4)})
    with pytest.raises(ValueError, match="truncated"):
        unpack(blob[:-1])


def test_transfer_settings_come_from_the_environment_and_bad_values_fail_loudly():
    assert transfer_from_env({}) == Transfer(part_bytes=64 * MIB, concurrency=4)
    env = {"SWITCHYARD_OBJECT_STORE_PART_BYTES": str(8 * MIB), "SWITCHYARD_OBJECT_STORE_CONCURRENCY": "2"}
    assert transfer_from_env(env) == Transfer(part_bytes=8 * MIB, concurrency=2)
    with pytest.raises(ValueError, match="at least 5242880"):
        transfer_from_env({"SWITCHYARD_OBJECT_STORE_PART_BYTES": "1000"})
    with pytest.raises(ValueError, match="SWITCHYARD_OBJECT_STORE_CONCURRENCY must be an integer"):
        transfer_from_env({"SWITCHYARD_OBJECT_STORE_CONCURRENCY": "many"})
