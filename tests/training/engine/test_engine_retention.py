"""Bounded retention: a resumed syncer reads O(1) objects, and the sweep deletes old versions and
spent deltas without taking one a learner still follows."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import boto3
import torch

from storage.objectstore import ObjectStore, open_store
from training.engine.compression import Compressor
from training.engine.config import CompressionConfig, OuterConfig, SyncerConfig
from training.engine.messages import FragmentDelta
from training.engine.syncer import Syncer
from training.engine.transport import InMemoryTransport, ObjectStoreTransport, Retention, object_sizes

OUTER = OuterConfig(lr=0.7, momentum=0.9)
FRAGS = [["a"], ["b"]]
INIT = {"a": torch.zeros(3), "b": torch.ones(2)}


class CountingStore:
    """A store that counts the objects read (whole, ``get``, or streamed, ``open_read``) and
    passes everything else through."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.gets = 0

    def get(self, key: str) -> bytes:
        self.gets += 1
        return self.inner.get(key)

    def open_read(self, key: str) -> io.BufferedIOBase:
        self.gets += 1
        return self.inner.open_read(key)

    def sizes(self, prefix: str = "") -> dict[str, int]:
        return object_sizes(self.inner, prefix)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _delta(learner: int, fragment: int, seq: int, base: int, value: float) -> FragmentDelta:
    name = FRAGS[fragment][0]
    return FragmentDelta(
        learner=learner,
        fragment=fragment,
        base_version=base,
        seq=seq,
        steps=5,
        tokens=50,
        tensors=Compressor(CompressionConfig(kind="int8")).compress(
            {name: torch.full(INIT[name].shape, value)}
        ),
    )


def _push_round(transport: Any, r: int) -> None:
    for learner in (0, 1):
        for f in (0, 1):
            transport.put_delta(_delta(learner, f, seq=r, base=r, value=0.01 * (r + 1 + learner)))


def _killed_after(tmp_path: Path, versions: int) -> tuple[CountingStore, ObjectStoreTransport]:
    """A store where a syncer published `versions` versions of each fragment, then died with the
    next round's deltas pending."""
    store = CountingStore(open_store(f"file://{tmp_path}/objects"))
    transport = ObjectStoreTransport(store, prefix="runs/1")  # type: ignore[arg-type]
    syncer = Syncer(
        cfg=SyncerConfig(learners=2), outer=OUTER, fragments=FRAGS, init=INIT, transport=transport
    )
    for r in range(versions):
        _push_round(transport, r)
        syncer.pull(now=float(r))
        assert len(syncer.poll(now=float(r))) == 2
    _push_round(transport, versions)
    return store, transport


def test_a_killed_syncer_resumes_reading_the_same_objects_after_5_versions_as_after_20(
    tmp_path: Path,
) -> None:
    reads = {}
    for versions in (5, 20):
        store, transport = _killed_after(tmp_path / str(versions), versions)
        store.gets = 0
        syncer = Syncer.resume(
            cfg=SyncerConfig(learners=2), outer=OUTER, fragments=FRAGS, transport=transport
        )
        assert syncer.version == [versions, versions]
        assert syncer.pull(now=100.0) == 4  # the pending round only: nothing consumed comes back
        reads[versions] = store.gets
        assert [v.version for v in syncer.poll(now=100.0)] == [versions + 1, versions + 1]
    # Per fragment: its newest version, and the two pending deltas.
    assert reads == {5: 2 * (1 + 2), 20: 2 * (1 + 2)}


def test_a_resumed_syncer_continues_exactly_as_one_that_never_died(tmp_path: Path) -> None:
    ref_transport = InMemoryTransport()
    ref = Syncer(
        cfg=SyncerConfig(learners=2), outer=OUTER, fragments=FRAGS, init=INIT, transport=ref_transport
    )
    for r in range(7):
        _push_round(ref_transport, r)
        ref.pull(now=float(r))
        ref.poll(now=float(r))
    _, transport = _killed_after(tmp_path, 6)
    syncer = Syncer.resume(cfg=SyncerConfig(learners=2), outer=OUTER, fragments=FRAGS, transport=transport)
    syncer.pull(now=6.0)
    syncer.poll(now=6.0)
    assert syncer.version == ref.version == [7, 7]
    for name, t in ref.global_params().items():
        assert torch.equal(syncer.global_params()[name], t)


def _versions_and_deltas(transport: ObjectStoreTransport, fragment: int) -> tuple[list[int], list[str]]:
    return transport.versions(fragment), transport.delta_ids(fragment)


def test_the_sweep_keeps_k_versions_and_each_learners_newest_delta_and_resume_still_reads_o1(
    tmp_path: Path,
) -> None:
    store = CountingStore(open_store(f"file://{tmp_path}/objects"))
    transport = ObjectStoreTransport(store, prefix="runs/1")  # type: ignore[arg-type]
    syncer = Syncer(
        cfg=SyncerConfig(learners=2), outer=OUTER, fragments=FRAGS, init=INIT, transport=transport
    )
    listed = []
    for r in range(12):
        _push_round(transport, r)
        syncer.pull(now=float(r))
        syncer.poll(now=float(r))
        before = object_sizes(store.inner, "runs/1/")
        swept = transport.sweep(Retention(keep_newest=2), {f: syncer.spent_deltas(f) for f in (0, 1)})
        after = object_sizes(store.inner, "runs/1/")
        # What it reports is what left the store, and what is left.
        gone = set(before) - set(after)
        assert swept.objects == len(gone) and swept.bytes_freed == sum(before[k] for k in gone)
        assert swept.bytes_kept == sum(after.values())
        listed.append(len(after))
    assert _versions_and_deltas(transport, 0) == ([11, 12], ["l0000-f000-s00000011", "l0001-f000-s00000011"])
    assert not any(
        k.startswith("runs/1/down/") and not k.endswith(("v00000011.syd", "v00000012.syd")) for k in after
    )
    assert listed[4] == listed[-1]  # the store stops growing
    # A killed syncer resumes from what is left, without applying a spent delta again.
    _push_round(transport, 12)
    store.gets = 0
    resumed = Syncer.resume(cfg=SyncerConfig(learners=2), outer=OUTER, fragments=FRAGS, transport=transport)
    assert resumed.pull(now=20.0) == 4 and store.gets == 2 * (1 + 2)
    assert [v.version for v in resumed.poll(now=20.0)] == [13, 13]


def test_a_learner_whose_base_is_old_keeps_its_versions_and_can_follow_them_to_the_newest(
    tmp_path: Path,
) -> None:
    cfg = SyncerConfig(learners=2, quorum=1, max_staleness=10)
    transport = ObjectStoreTransport(open_store(f"file://{tmp_path}/objects"), prefix="runs/1")
    frags = [["a", "b"]]
    syncer = Syncer(cfg=cfg, outer=OUTER, fragments=frags, init=INIT, transport=transport, down="int8")
    comp = Compressor(CompressionConfig(kind="int8"))

    def push(learner: int, seq: int, base: int, value: float) -> None:
        tensors = comp.compress({n: torch.full(INIT[n].shape, value) for n in ("a", "b")})
        transport.put_delta(
            FragmentDelta(
                learner=learner, fragment=0, base_version=base, seq=seq, steps=5, tokens=50, tensors=tensors
            )
        )

    def sweep(live: set[int]) -> None:
        bases = [b for j, b in syncer.learner_bases(0).items() if j in live]
        transport.sweep(
            Retention(keep_newest=1, learner_bases={0: bases}, reach=10), {0: syncer.spent_deltas(0)}
        )

    # Learner 0 is fast: a delta per version. Learner 1 pushed once, on version 2, and is slow.
    for r in range(8):
        push(0, seq=r, base=r, value=0.1 + 0.01 * r)
        if r == 2:
            push(1, seq=0, base=2, value=-0.05)
        syncer.pull(now=float(r))
        syncer.poll(now=float(r))
        sweep(live={0, 1})
    assert syncer.version == [8]
    # K = 1 would keep version 8 alone; learner 1 holds version 2 (or newer), so 2..8 stay.
    assert transport.versions(0) == [2, 3, 4, 5, 6, 7, 8]
    # From its copy of version 2 the down-deltas bring it to version 8's copy, bit for bit.
    held = transport.get_version(0, 2).held
    for v in range(3, 9):
        down = transport.get_down(0, v).decoded()
        held = {n: t + down[n] for n, t in held.items()}
    newest = transport.get_version(0, 8).held
    assert all(torch.equal(held[n], newest[n]) for n in newest)
    # Its next delta, still on version 2, merges as a stale one beside learner 0's fresh one.
    push(0, seq=8, base=8, value=0.2)
    push(1, seq=1, base=2, value=-0.05)
    syncer.pull(now=9.0)
    (v9,) = syncer.poll(now=9.0)
    assert v9.meta["learners"] == [0, 1] and v9.meta["staleness"] == [0, 6]
    # Once learner 1 is no longer live, nothing keeps its versions: only K and learner 0's base.
    sweep(live={0})
    assert transport.versions(0) == [8, 9]
    sweep(live=set())
    assert transport.versions(0) == [9]


def test_the_sweep_reads_sizes_from_an_s3_listing(s3_server: str) -> None:
    bucket = "retention-sizes"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=bucket)
    store = open_store(f"s3://{bucket}/inst", endpoint_url=s3_server)
    store.put("runs/1/learners/l0000/g000000-c00000000.syd", b"x" * 7)
    transport = ObjectStoreTransport(store, prefix="runs/1")
    syncer = Syncer(
        cfg=SyncerConfig(learners=2), outer=OUTER, fragments=FRAGS, init=INIT, transport=transport
    )
    for r in range(3):
        _push_round(transport, r)
        syncer.pull(now=float(r))
        syncer.poll(now=float(r))
    sizes = object_sizes(store, "runs/1/")
    assert sizes["runs/1/learners/l0000/g000000-c00000000.syd"] == 7
    assert len(sizes) == len(store.list("runs/1/")) and all(n > 0 for n in sizes.values())
    swept = transport.sweep(Retention(keep_newest=1), {f: syncer.spent_deltas(f) for f in (0, 1)})
    assert swept.versions == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert swept.bytes_kept == sum(object_sizes(store, "runs/1/").values())
    assert swept.bytes_freed == sum(n for k, n in sizes.items() if k not in store.list("runs/1/"))
    assert transport.versions(0) == [3] and transport.versions(1) == [3]
