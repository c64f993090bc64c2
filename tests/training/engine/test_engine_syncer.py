"""The decoupled syncer's decisions (arXiv 2604.21428): quorum, grace, staleness, weights."""

from __future__ import annotations

import pytest
import torch

from training.engine.compression import Compressor
from training.engine.config import CompressionConfig, OuterConfig, SyncerConfig
from training.engine.messages import FragmentDelta
from training.engine.syncer import Syncer

AVG = OuterConfig(lr=1.0, momentum=0.0)  # outer step = apply the mean delta


def _delta(learner, value, *, base=0, tokens=100, seq=0, fragment=0):
    comp = Compressor(CompressionConfig())
    return FragmentDelta(
        learner=learner,
        fragment=fragment,
        base_version=base,
        seq=seq,
        steps=1,
        tokens=tokens,
        tensors=comp.compress({"w": torch.full((2,), float(value))}),
    )


def _syncer(**kw):
    cfg = SyncerConfig(**{"learners": 3, "quorum": 2, "grace": 5.0, **kw})
    return Syncer(cfg=cfg, outer=AVG, fragments=[["w"]], init={"w": torch.zeros(2)})


def test_it_waits_for_the_quorum_then_for_the_grace_window():
    s = _syncer()
    s.submit(_delta(0, 1.0), now=1.0)
    assert not s.ready(0, now=100.0)  # one of a quorum of two
    assert s.next_deadline() is None
    s.submit(_delta(1, 1.0), now=10.0)
    assert s.next_deadline() == 15.0
    assert s.poll(now=14.9) == []
    (snap,) = s.poll(now=15.0)
    assert snap.version == 1 and snap.meta["learners"] == [0, 1]


def test_a_late_learner_inside_the_grace_window_is_merged():
    s = _syncer()
    s.submit(_delta(0, 1.0), now=0.0)
    s.submit(_delta(1, 1.0), now=1.0)
    s.submit(_delta(2, 4.0), now=3.0)  # all three in: no need to wait for the deadline
    (snap,) = s.poll(now=3.0)
    assert snap.meta["learners"] == [0, 1, 2]
    torch.testing.assert_close(snap.params["w"], torch.full((2,), -2.0))  # 0 - mean(1, 1, 4)


def test_all_learners_reporting_merges_at_once_and_a_barrier_waits_for_all():
    s = _syncer(quorum=None, grace=0.0)  # K = M: plain DiLoCo
    s.submit(_delta(0, 1.0), now=0.0)
    s.submit(_delta(1, 1.0), now=0.0)
    assert s.poll(now=1e9) == []
    s.submit(_delta(2, 1.0), now=2.0)
    assert len(s.poll(now=2.0)) == 1


def test_learners_weigh_by_tokens():
    s = _syncer(quorum=2, grace=0.0, learners=2)
    s.submit(_delta(0, 1.0, tokens=300), now=0.0)
    s.submit(_delta(1, 5.0, tokens=100), now=0.0)
    (snap,) = s.poll(now=0.0)
    torch.testing.assert_close(snap.params["w"], torch.full((2,), -2.0))  # (3*1 + 1*5) / 4


def _advance_to_version_one(s):
    s.submit(_delta(0, 0.0, seq=0), now=0.0)
    s.submit(_delta(1, 0.0, seq=0), now=0.0)
    s.poll(now=10.0)
    assert s.version == [1]


def test_a_stale_delta_is_applied_with_a_discount():
    s = _syncer(discount=0.5, token_weighting=False)
    _advance_to_version_one(s)
    s.submit(_delta(2, 3.0, base=0), now=11.0)  # staleness 1
    s.submit(_delta(0, 0.0, base=1, seq=1), now=11.0)
    s.submit(_delta(1, 0.0, base=1, seq=1), now=11.0)
    decision = s.decide(0)
    weights = {i.split("-")[0]: (w, st) for i, w, st in decision.included}
    assert weights["l0002"] == (pytest.approx(0.5 / 2.5), 1)
    assert weights["l0000"] == (pytest.approx(1.0 / 2.5), 0)
    (snap,) = s.poll(now=20.0)
    torch.testing.assert_close(snap.params["w"], torch.full((2,), -3.0 * 0.2))
    assert snap.meta["staleness"] == [1, 0, 0]


def test_the_drop_policy_ignores_stale_deltas_but_marks_them_consumed():
    s = _syncer(stale_policy="drop")
    _advance_to_version_one(s)
    stale = _delta(2, 3.0, base=0)
    s.submit(stale, now=11.0)
    s.submit(_delta(0, 1.0, base=1, seq=1), now=11.0)
    s.submit(_delta(1, 1.0, base=1, seq=1), now=11.0)
    (snap,) = s.poll(now=20.0)
    assert snap.meta["dropped"] == [stale.id]
    assert stale.id in snap.merged and stale.id in s.consumed
    torch.testing.assert_close(snap.params["w"], torch.full((2,), -1.0))
    assert s.submit(stale, now=21.0) is False  # never counted again


def test_deltas_staler_than_the_limit_are_dropped_even_when_discounting():
    s = _syncer(max_staleness=0)
    _advance_to_version_one(s)
    s.submit(_delta(2, 3.0, base=0), now=11.0)
    decision = s.decide(0)
    assert decision.included == [] and len(decision.dropped) == 1


def test_stale_deltas_do_not_count_towards_the_quorum():
    s = _syncer(grace=0.0)
    _advance_to_version_one(s)
    s.submit(_delta(2, 1.0, base=0), now=11.0)
    s.submit(_delta(0, 1.0, base=1, seq=1), now=11.0)
    assert not s.ready(0, now=50.0)


def test_radial_directional_averaging_keeps_the_mean_norm():
    s = Syncer(
        cfg=SyncerConfig(learners=2, radial_directional=True, token_weighting=False),
        outer=AVG,
        fragments=[["w"]],
        init={"w": torch.zeros(2)},
    )
    comp = Compressor(CompressionConfig())
    for i, vec in enumerate(([2.0, 0.0], [0.0, 2.0])):
        s.submit(
            FragmentDelta(
                learner=i,
                fragment=0,
                base_version=0,
                seq=0,
                steps=1,
                tokens=1,
                tensors=comp.compress({"w": torch.tensor(vec)}),
            ),
            now=0.0,
        )
    (snap,) = s.poll(now=0.0)
    # A plain mean would give norm sqrt(2); RDA keeps norm 2 along the mean direction.
    torch.testing.assert_close(snap.params["w"], -torch.tensor([2.0, 2.0]) / 2**0.5)


def test_the_adaptive_grace_window_waits_as_long_as_late_learners_take_and_not_for_lost_ones():
    s = _syncer(grace=10.0, adaptive_grace=True)
    fixed = _syncer(grace=10.0)
    for syncer in (s, fixed):
        syncer.submit(_delta(0, 1.0, seq=0), now=0.0)
        syncer.submit(_delta(1, 1.0, seq=0), now=0.0)
    assert s.grace_for(0) == 10.0  # learner 2 has no history yet: the whole cap
    s.submit(_delta(2, 1.0, seq=0), now=2.0)  # it comes 2 s after the quorum
    (v1,) = s.poll(now=2.0)
    assert v1.meta["lags"] == {"0": 0.0, "1": 0.0, "2": 2.0}

    # Next round: the window is learner 2's expected lag with a margin, not the cap.
    s.submit(_delta(0, 1.0, base=1, seq=1), now=100.0)
    s.submit(_delta(1, 1.0, base=1, seq=1), now=100.0)
    assert s.grace_for(0) == pytest.approx(2.5)
    assert not s.ready(0, now=102.4) and s.ready(0, now=102.5)
    assert s.next_deadline() == pytest.approx(102.5)
    (v2,) = s.poll(now=102.5)
    assert v2.meta["learners"] == [0, 1] and v2.meta["grace"] == pytest.approx(2.5)

    # Learner 2 turns up 30 s after that round's quorum: expected beyond the cap from now on,
    # so the next round merges at its quorum instead of idling for a learner that will be late.
    s.submit(_delta(2, 1.0, base=1, seq=2), now=130.0)
    assert s.lag[2] == pytest.approx(0.5 * 30.0 + 0.5 * 2.0)
    s.submit(_delta(0, 1.0, base=2, seq=2), now=200.0)
    s.submit(_delta(1, 1.0, base=2, seq=2), now=200.0)
    assert s.grace_for(0) == 0.0 and s.ready(0, now=200.0)
    # The fixed window always waits the configured grace.
    assert fixed.grace_for(0) == 10.0 and not fixed.ready(0, now=9.9)


def test_a_resumed_syncer_keeps_the_lags_it_had_learned(tmp_path):
    from storage.objectstore import open_store
    from training.engine.transport import ObjectStoreTransport

    transport = ObjectStoreTransport(open_store(f"file://{tmp_path}/o"), prefix="runs/2")
    cfg = SyncerConfig(learners=3, quorum=2, grace=10.0, adaptive_grace=True)
    s = Syncer(cfg=cfg, outer=AVG, fragments=[["w"]], init={"w": torch.zeros(2)}, transport=transport)
    for learner, at in ((0, 0.0), (1, 0.0), (2, 4.0)):
        transport.put_delta(_delta(learner, 1.0, seq=0))
        s.pull(now=at)
    s.poll(now=4.0)
    resumed = Syncer.resume(cfg=cfg, outer=AVG, fragments=[["w"]], transport=transport)
    assert resumed.lag == {0: 0.0, 1: 0.0, 2: 4.0}
