"""An offloaded syncer (Syncer(offload=True)) keeps no fragment's state between merges and
publishes bitwise what a syncer holding every fragment in memory publishes; its resume reads
each version's header only and goes on the same way."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from storage.objectstore import open_store
from training.engine.compression import Compressor
from training.engine.config import CompressionConfig, OuterConfig, SyncerConfig
from training.engine.messages import FragmentDelta, GlobalVersion
from training.engine.syncer import Syncer
from training.engine.transport import InMemoryTransport, ObjectStoreTransport

OUTER = OuterConfig(lr=0.7, momentum=0.9)
CFG = SyncerConfig(learners=2)
FRAGS = [["a", "b"], ["c"]]
SHAPES = {"a": (64, 32), "b": (32,), "c": (128, 16)}


def _init() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(shape, generator=g) for n, shape in SHAPES.items()}


def _delta(learner: int, fragment: int, rnd: int) -> FragmentDelta:
    g = torch.Generator().manual_seed(1000 * rnd + 10 * learner + fragment)
    raw = {n: torch.randn(SHAPES[n], generator=g) * 0.01 for n in FRAGS[fragment]}
    return FragmentDelta(
        learner=learner,
        fragment=fragment,
        base_version=rnd,
        seq=rnd * 2 + fragment,
        steps=5,
        tokens=50 + learner,
        tensors=Compressor(CompressionConfig(kind="4bit")).compress(raw),
    )


def _run(transport, syncer: Syncer, rounds: range) -> None:
    for r in rounds:
        for learner in (0, 1):
            for f in range(len(FRAGS)):
                transport.put_delta(_delta(learner, f, r))
        syncer.pull(float(r))
        published = syncer.poll(float(r))
        assert [v.version for v in published] == [r + 1] * len(FRAGS)


def _versions(transport, rounds: int) -> list:
    return [transport.get_version(f, v) for v in range(rounds + 1) for f in range(len(FRAGS))]


def _same(a, b) -> None:
    assert (a.fragment, a.version, a.merged) == (b.fragment, b.version, b.merged)
    for part in ("params", "momentum", "mirror"):
        left, right = getattr(a, part), getattr(b, part)
        assert left.keys() == right.keys()
        assert all(torch.equal(left[n], right[n]) for n in left), part
    assert a.down.keys() == b.down.keys()
    assert all(torch.equal(a.down[n].values, b.down[n].values) for n in a.down)


def test_an_offloaded_syncer_publishes_what_a_resident_one_does_and_keeps_nothing(tmp_path: Path) -> None:
    resident_t = InMemoryTransport()
    resident = Syncer(cfg=CFG, outer=OUTER, fragments=FRAGS, init=_init(), transport=resident_t, down="4bit")
    offload_t = ObjectStoreTransport(open_store(f"file://{tmp_path}"), prefix="runs/1")
    offloaded = Syncer(
        cfg=CFG, outer=OUTER, fragments=FRAGS, init=_init(), transport=offload_t, down="4bit", offload=True
    )
    assert offloaded.params == {} and offloaded.mirror == {}
    _run(resident_t, resident, range(3))
    _run(offload_t, offloaded, range(3))
    for a, b in zip(_versions(resident_t, 3), _versions(offload_t, 3), strict=True):
        _same(a, b)
    # Between merges it holds no tensor of any fragment.
    assert offloaded.params == {} and offloaded.mirror == {} and offloaded.outer.momentum == {}
    assert offloaded.resident == set()
    # What it returns is the version without its tensors (they are in the store).
    offload_t.put_delta(_delta(0, 0, 3))
    offload_t.put_delta(_delta(1, 0, 3))
    offloaded.pull(3.0)
    (receipt,) = offloaded.poll(3.0)
    assert (receipt.fragment, receipt.version, receipt.params) == (0, 4, {})
    assert receipt.meta["learners"] == [0, 1] and len(receipt.merged) == 2
    full = offloaded.global_params()
    assert set(full) == set(SHAPES) and torch.equal(full["a"], offload_t.get_version(0, 4).params["a"])


@pytest.mark.parametrize("kill_after", [1, 2])
def test_a_killed_offloaded_syncer_resumes_from_headers_and_goes_on_the_same_way(
    tmp_path: Path, kill_after: int
) -> None:
    ref_t = InMemoryTransport()
    ref = Syncer(cfg=CFG, outer=OUTER, fragments=FRAGS, init=_init(), transport=ref_t, down="4bit")
    _run(ref_t, ref, range(3))

    transport = ObjectStoreTransport(open_store(f"file://{tmp_path}"), prefix="runs/1")
    first = Syncer(
        cfg=CFG, outer=OUTER, fragments=FRAGS, init=_init(), transport=transport, down="4bit", offload=True
    )
    _run(transport, first, range(kill_after))
    del first  # killed
    fresh = ObjectStoreTransport(open_store(f"file://{tmp_path}"), prefix="runs/1")
    resumed = Syncer.resume(cfg=CFG, outer=OUTER, fragments=FRAGS, transport=fresh, down="4bit", offload=True)
    assert resumed.version == [kill_after] * len(FRAGS)
    # The headers only: a few hundred bytes per fragment, not its tensors.
    assert 0 < fresh.bytes_down < 4096
    _run(fresh, resumed, range(kill_after, 3))
    for a, b in zip(_versions(ref_t, 3), _versions(fresh, 3), strict=True):
        _same(a, b)


def test_resuming_offloaded_before_any_version_publishes_version_zero_from_init(tmp_path: Path) -> None:
    transport = ObjectStoreTransport(open_store(f"file://{tmp_path}"), prefix="runs/1")
    with pytest.raises(ValueError, match="no published version and no init"):
        Syncer.resume(cfg=CFG, outer=OUTER, fragments=FRAGS, transport=transport, offload=True)
    init = _init()
    syncer = Syncer.resume(
        cfg=CFG, outer=OUTER, fragments=FRAGS, transport=transport, init=init, offload=True
    )
    assert syncer.version == [0, 0] and syncer.params == {}
    assert torch.equal(transport.get_version(1, 0).params["c"], init["c"])


def test_a_learner_reads_a_versions_mirror_without_holding_its_params_and_momentum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from storage import tensorblob

    w = torch.randn(512, 1024)  # 2 MiB in fp32
    transport = ObjectStoreTransport(open_store(f"file://{tmp_path}"), prefix="runs/1")
    version = GlobalVersion(
        fragment=0, version=1, params={"w": w}, momentum={"w": w * 0.5}, mirror={"w": w + 1.0}
    )
    assert transport.publish(version)
    # Every tensor the blob reader makes, by bytes (torch's allocator is not Python's: counted here).
    made: list[int] = []
    real_empty = torch.empty

    def counted_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        made.append(t.numel() * t.element_size())
        return t

    monkeypatch.setattr(tensorblob.torch, "empty", counted_empty)
    before = transport.bytes_down
    held = transport.get_held(0, 1)
    assert held.params == {} and held.momentum == {} and torch.equal(held.held["w"], w + 1.0)
    assert made == [w.numel() * 4]  # the mirror only: params and momentum were read past
    assert transport.bytes_down - before > 3 * w.numel() * 4  # what crossed is still the whole blob
    made.clear()
    transport.get_version(0, 1)
    assert made == [w.numel() * 4] * 3
    # A blob written before mirrors existed: its params are the learners' copy.
    assert transport.publish(GlobalVersion(fragment=1, version=1, params={"w": w}, momentum={}))
    assert torch.equal(transport.get_held(1, 1).held["w"], w)
