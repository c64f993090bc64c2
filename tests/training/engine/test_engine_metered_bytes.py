"""An object-store transport reports the bytes that crossed the store (every blob written or
read, headers included), measured as they stream, not computed from the payloads."""

from __future__ import annotations

import uuid
from pathlib import Path

import boto3
import pytest
import torch

from storage.objectstore import FileStore, ObjectStore, open_store
from storage.tensorblob import Meter, blob_read, blob_write
from training.engine.compression import Compressor
from training.engine.config import CompressionConfig, OuterConfig, SyncerConfig
from training.engine.messages import FragmentDelta
from training.engine.syncer import Syncer
from training.engine.transport import ObjectStoreTransport


def _delta(learner: int, kind: str = "4bit") -> FragmentDelta:
    tensors = Compressor(CompressionConfig(kind=kind)).compress(
        {"w": torch.full((64, 48), 0.01 * (learner + 1))}
    )
    return FragmentDelta(
        learner=learner, fragment=0, base_version=0, seq=0, steps=3, tokens=96, tensors=tensors
    )


def _sizes(store: ObjectStore, prefix: str) -> dict[str, int]:
    if isinstance(store, FileStore):
        return {key: store.local_path(key).stat().st_size for key in store.list(prefix)}
    client = store.client  # type: ignore[attr-defined]
    return {
        key: client.head_object(Bucket=store.bucket, Key=store._key(key))["ContentLength"]  # type: ignore[attr-defined]
        for key in store.list(prefix)
    }


def _stores(tmp_path: Path, s3_server: str) -> list[ObjectStore]:
    bucket = f"metered-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=bucket)
    return [FileStore(tmp_path / "objects"), open_store(f"s3://{bucket}/p", endpoint_url=s3_server)]


def test_a_meter_counts_exactly_the_bytes_a_blob_occupies_written_and_read(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    meter = Meter()
    tensors = {"a": torch.randn(33, 7), "b": torch.arange(5, dtype=torch.int8)}
    blob_write(store, "x.syd", {"note": "n"}, tensors, meter=meter)
    size = store.local_path("x.syd").stat().st_size
    assert meter.written == size > 33 * 7 * 4 + 5  # the header crosses too
    _, back = blob_read(store, "x.syd", meter=meter)
    assert meter.read == size and torch.equal(back["a"], tensors["a"])


def test_the_transport_reports_what_crossed_each_store_both_ways(tmp_path: Path, s3_server: str) -> None:
    for store in _stores(tmp_path, s3_server):
        learner_side = ObjectStoreTransport(store, prefix="runs/7")
        syncer_side = ObjectStoreTransport(store, prefix="runs/7")
        syncer = Syncer(
            cfg=SyncerConfig(learners=2),
            outer=OuterConfig(),
            fragments=[["w"]],
            init={"w": torch.zeros(64, 48)},
            transport=syncer_side,
        )
        for learner in (0, 1):
            learner_side.put_delta(_delta(learner))
        deltas = _sizes(store, "runs/7/deltas/")
        assert len(deltas) == 2 and learner_side.bytes_up == sum(deltas.values())
        published_before = syncer_side.bytes_up
        assert syncer.pull(now=0.0) == 2
        assert syncer_side.bytes_down == sum(deltas.values())  # the syncer read both deltas whole
        syncer.poll(now=0.0)
        version = _sizes(store, "runs/7/versions/f000/v00000001.syd")
        down = _sizes(store, "runs/7/down/f000/v00000001.syd")
        assert syncer_side.bytes_up - published_before == sum(version.values()) + sum(down.values())
        # A learner following the chain reads the down-delta; one rejoining reads the full version.
        learner_side.get_down(0, 1)
        assert learner_side.bytes_down == sum(down.values())
        learner_side.get_version(0, 1)
        assert learner_side.bytes_down == sum(down.values()) + sum(version.values())


@pytest.mark.parametrize("kind", ["4bit", "int8", "fp32", "fp4_e3m0"])
def test_measured_delta_bytes_exceed_the_payload_only_by_the_blob_header(tmp_path: Path, kind: str) -> None:
    transport = ObjectStoreTransport(FileStore(tmp_path), prefix="r")
    delta = _delta(0, kind)
    transport.put_delta(delta)
    assert 0 < transport.bytes_up - delta.nbytes < 2048
