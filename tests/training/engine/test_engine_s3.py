"""The object-store transport against a real S3 HTTP endpoint: moto's server on loopback."""

from __future__ import annotations

import boto3
import pytest
import torch
from moto.server import ThreadedMotoServer

from storage.objectstore import ObjectNotFoundError, open_store
from training.engine.compression import Compressor
from training.engine.config import CompressionConfig, OuterConfig, SyncerConfig
from training.engine.messages import FragmentDelta
from training.engine.syncer import Syncer
from training.engine.transport import ObjectStoreTransport

BUCKET = "switchyard-engine-test"


@pytest.fixture(scope="module")
def s3_endpoint():
    with pytest.MonkeyPatch.context() as mp:
        for key, value in (
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
        ):
            mp.setenv(key, value)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=url).create_bucket(Bucket=BUCKET)
        try:
            yield url
        finally:
            server.stop()


def test_the_s3_store_puts_gets_lists_and_writes_once(s3_endpoint):
    store = open_store(f"s3://{BUCKET}/store-test", endpoint_url=s3_endpoint)
    store.put("a/one", b"1")
    store.put("a/two", b"22")
    store.put("b/three", b"333")
    assert store.get("a/two") == b"22"
    assert store.exists("a/one") and not store.exists("a/nope")
    assert store.list("a/") == ["a/one", "a/two"]
    assert store.put_if_absent("a/one", b"other") is False
    assert store.get("a/one") == b"1"
    assert store.put_if_absent("c/new", b"x") is True
    with pytest.raises(ObjectNotFoundError):
        store.get("missing")
    store.delete("a/two")
    store.delete("a/two")  # deleting twice is harmless
    assert store.list("a/") == ["a/one"] and not store.exists("a/two")
    # The prefix keeps runs apart inside one bucket.
    assert open_store(f"s3://{BUCKET}/elsewhere", endpoint_url=s3_endpoint).list() == []


def test_the_s3_store_uploads_a_file_and_streams_it_back_in_blocks(s3_endpoint, tmp_path):
    store = open_store(f"s3://{BUCKET}/files", endpoint_url=s3_endpoint)
    source = tmp_path / "export.csv"
    source.write_bytes(b"x" * 150_000)
    store.put_file("exports/3/export.csv", source)
    blocks = list(store.iter_chunks("exports/3/export.csv", block=64_000))
    assert [len(b) for b in blocks] == [64_000, 64_000, 22_000]
    with pytest.raises(ObjectNotFoundError):
        store.iter_chunks("exports/3/missing.csv")


def test_a_syncer_publishes_to_s3_and_a_new_one_resumes_from_it(s3_endpoint):
    store = open_store(f"s3://{BUCKET}/syncer-test", endpoint_url=s3_endpoint)
    transport = ObjectStoreTransport(store, prefix="runs/42")
    cfg, outer = SyncerConfig(learners=2), OuterConfig()
    init = {"w": torch.zeros(4, 3)}
    s = Syncer(cfg=cfg, outer=outer, fragments=[["w"]], init=init, transport=transport)
    comp = Compressor(CompressionConfig(kind="4bit"))
    for learner in (0, 1):
        transport.put_delta(
            FragmentDelta(
                learner=learner,
                fragment=0,
                base_version=0,
                seq=0,
                steps=3,
                tokens=96,
                tensors=comp.compress({"w": torch.full((4, 3), 0.01 * (learner + 1))}),
            )
        )
    assert s.pull(now=0.0) == 2
    (snap,) = s.poll(now=0.0)
    assert store.list("runs/42/versions/") == [
        "runs/42/versions/f000/v00000000.syd",
        "runs/42/versions/f000/v00000001.syd",
    ]
    again = Syncer.resume(cfg=cfg, outer=outer, fragments=[["w"]], transport=transport)
    assert again.version == [1]
    assert again.pull(now=1.0) == 0
    torch.testing.assert_close(again.params["w"], snap.params["w"])
    torch.testing.assert_close(again.outer.momentum["w"], s.outer.momentum["w"])
