"""Global versions are written once; a killed syncer resumes without applying a step twice."""

from __future__ import annotations

import pytest
import torch

from storage.objectstore import open_store
from training.engine.compression import Compressor
from training.engine.config import CompressionConfig, OuterConfig, SyncerConfig
from training.engine.messages import FragmentDelta, GlobalVersion
from training.engine.syncer import Syncer
from training.engine.transport import InMemoryTransport, ObjectStoreTransport, latest_version

OUTER = OuterConfig(lr=0.7, momentum=0.9)
CFG = SyncerConfig(learners=2)
FRAGS = [["a"], ["b"]]
INIT = {"a": torch.zeros(3), "b": torch.ones(2)}


def _delta(learner, fragment, seq, base, value):
    comp = Compressor(CompressionConfig(kind="int8"))
    name = FRAGS[fragment][0]
    return FragmentDelta(
        learner=learner,
        fragment=fragment,
        base_version=base,
        seq=seq,
        steps=5,
        tokens=50,
        tensors=comp.compress({name: torch.full(INIT[name].shape, value)}),
    )


def _round(transport, r):
    for learner in (0, 1):
        for f in (0, 1):
            transport.put_delta(_delta(learner, f, seq=r * 2 + f, base=r, value=0.1 * (r + 1 + learner)))


@pytest.fixture(params=["memory", "file"])
def transport(request, tmp_path):
    if request.param == "memory":
        return InMemoryTransport()
    return ObjectStoreTransport(open_store(f"file://{tmp_path}/objects"), prefix="runs/1")


def test_a_version_is_written_once(transport):
    v = GlobalVersion(fragment=0, version=3, params={"a": torch.zeros(3)}, momentum={})
    assert transport.publish(v) is True
    other = GlobalVersion(fragment=0, version=3, params={"a": torch.ones(3)}, momentum={})
    assert transport.publish(other) is False
    assert torch.equal(transport.get_version(0, 3).params["a"], torch.zeros(3))


def test_a_killed_syncer_resumes_without_applying_a_delta_twice(transport):
    # Reference: one syncer that never dies, three rounds.
    ref_transport = InMemoryTransport()
    ref = Syncer(cfg=CFG, outer=OUTER, fragments=FRAGS, init=INIT, transport=ref_transport)
    for r in range(3):
        _round(ref_transport, r)
        ref.pull(now=float(r))
        ref.poll(now=float(r))
    # Same rounds, but the syncer is killed after round 0 is published and again after
    # round 1 (its in-memory state is gone; only the transport remains).
    s = Syncer(cfg=CFG, outer=OUTER, fragments=FRAGS, init=INIT, transport=transport)
    _round(transport, 0)
    s.pull(now=0.0)
    s.poll(now=0.0)
    _round(transport, 1)
    s = Syncer.resume(cfg=CFG, outer=OUTER, fragments=FRAGS, transport=transport)
    assert s.version == [1, 1]
    assert s.pull(now=1.0) == 4  # only round 1's deltas are new
    s.poll(now=1.0)
    s = Syncer.resume(cfg=CFG, outer=OUTER, fragments=FRAGS, transport=transport)
    assert s.pull(now=1.5) == 0 and s.poll(now=1.5) == []  # nothing to apply twice
    _round(transport, 2)
    s.pull(now=2.0)
    s.poll(now=2.0)
    assert s.version == [3, 3] == ref.version
    for f, name in ((0, "a"), (1, "b")):
        got = latest_version(transport, f)
        assert got is not None and got.version == 3
        torch.testing.assert_close(got.params[name], ref.params[name])
        torch.testing.assert_close(got.momentum[name], ref.outer.momentum[name])
    assert transport.versions(0) == [0, 1, 2, 3]


def test_a_duplicate_syncer_defers_to_the_version_already_published(transport):
    first = Syncer(cfg=CFG, outer=OUTER, fragments=FRAGS, init=INIT, transport=transport)
    twin = Syncer(cfg=CFG, outer=OUTER, fragments=FRAGS, init=INIT, transport=transport)
    _round(transport, 0)
    first.pull(now=0.0)
    twin.pull(now=0.0)
    # The twin merges a different set (one delta lost in its view) after the first published.
    twin.pending[0] = twin.pending[0][:1] + [_delta(1, 0, seq=99, base=0, value=5.0)]
    published = first.poll(now=0.0)
    assert [v.version for v in published] == [1, 1]
    twin.poll(now=0.0)
    stored = transport.get_version(0, 1)
    torch.testing.assert_close(twin.params["a"], stored.params["a"])
    torch.testing.assert_close(twin.params["a"], first.params["a"])
