"""Global versions travel down compressed: learners hold the syncer's mirror bitwise, close to θ."""

from __future__ import annotations

import pytest
import torch

from storage.objectstore import open_store
from training.engine.config import CompressionConfig, InnerConfig, OuterConfig, SyncerConfig
from training.engine.data import BatchSampler
from training.engine.learner import Learner
from training.engine.model import build_model
from training.engine.simulator import LearnerSpec, SimConfig, Simulator
from training.engine.syncer import Syncer
from training.engine.transport import InMemoryTransport, ObjectStoreTransport, latest_version

INNER = InnerConfig(lr=3e-3, warmup_steps=2, total_steps=30, batch_size=4)


def _init(cfg):
    return {n: p.detach().clone() for n, p in build_model(cfg, seed=0).named_parameters()}


@pytest.mark.parametrize(("kind", "step_fraction"), [("int8", 1 / 2), ("4bit", 1 / 2), ("fp4_e3m0", 1 / 3)])
def test_learners_following_down_deltas_hold_the_mirror_bitwise_and_it_stays_near_theta(
    kind, step_fraction, tiny_cfg, stdlib_small, tmp_path
):
    init = _init(tiny_cfg)
    frags = [list(init)]
    transport = ObjectStoreTransport(open_store(f"file://{tmp_path}/objects"), prefix="runs/3")
    syncer = Syncer(
        cfg=SyncerConfig(learners=2),
        outer=OuterConfig(),
        fragments=frags,
        init=init,
        transport=transport,
        down=kind,
    )
    learners = [
        Learner(
            learner_id=i,
            model_cfg=tiny_cfg,
            inner=INNER,
            fragments=frags,
            sampler=BatchSampler(stdlib_small.train, block_size=32, batch_size=4, seed=i),
            init=init,
            compression=CompressionConfig(kind=kind),
            device="cpu",
        )
        for i in range(2)
    ]
    for _ in range(4):
        for learner in learners:
            learner.train(3)
            transport.put_delta(learner.make_delta(0))
        syncer.pull(now=0.0)
        (published,) = syncer.poll(now=0.0)
        for learner in learners:
            down = transport.get_down(0, published.version)
            assert down.nbytes < published.nbytes / 3  # quantised, not fp32
            learner.receive(down)
            assert learner.adopt_held(0, how="rebase")
    stored = latest_version(transport, 0)
    assert stored is not None and stored.version == 4
    for name in init:
        for learner in learners:
            assert torch.equal(learner.held[name], stored.mirror[name])  # bitwise, every learner
        # The mirror is θ up to half a quantisation step of the last down-delta (fp4_e3m0: a
        # third of its scale, the largest rounding error below it) by error feedback: the
        # residual does not pile up over versions.
        err = (stored.params[name] - stored.mirror[name]).abs()
        rows = err.reshape(err.shape[0], -1) if err.dim() > 1 else err.reshape(1, -1)
        scales = stored.down[name].scales
        assert scales is not None
        bound = scales.float().reshape(-1, 1) * step_fraction + 1e-6
        assert bool((rows <= bound).all()), name


def test_a_down_delta_out_of_order_is_refused(tiny_cfg, stdlib_small):
    init = _init(tiny_cfg)
    frags = [list(init)]
    syncer = Syncer(
        cfg=SyncerConfig(learners=1), outer=OuterConfig(), fragments=frags, init=init, down="4bit"
    )

    def learner():
        return Learner(
            learner_id=0,
            model_cfg=tiny_cfg,
            inner=INNER,
            fragments=frags,
            sampler=BatchSampler(stdlib_small.train, block_size=32, batch_size=4, seed=0),
            init=init,
            device="cpu",
        )

    busy = learner()
    versions = []
    for _ in range(2):
        busy.train(2)
        syncer.submit(busy.make_delta(0), now=0.0)
        versions += syncer.poll(now=0.0)
        busy.receive(versions[-1].down_delta())
        busy.adopt_held(0)
    assert busy.held_version == [2]
    with pytest.raises(ValueError, match="version 2 on a copy of version 0"):
        learner().receive(versions[1].down_delta())  # it missed version 1: it needs the full copy


def test_a_missing_down_object_is_rewritten_from_its_version(tmp_path):
    transport = ObjectStoreTransport(open_store(f"file://{tmp_path}/objects"), prefix="runs/4")
    init = {"w": torch.zeros(4, 3)}
    syncer = Syncer(
        cfg=SyncerConfig(learners=1),
        outer=OuterConfig(),
        fragments=[["w"]],
        init=init,
        transport=transport,
        down="int8",
    )
    from training.engine.compression import Compressor
    from training.engine.messages import FragmentDelta

    comp = Compressor(CompressionConfig(kind="int8"))
    transport.put_delta(
        FragmentDelta(
            learner=0,
            fragment=0,
            base_version=0,
            seq=0,
            steps=1,
            tokens=1,
            tensors=comp.compress({"w": torch.randn(4, 3)}),
        )
    )
    syncer.pull(now=0.0)
    syncer.poll(now=0.0)
    key = "runs/4/down/f000/v00000001.syd"
    expected = transport.get_down(0, 1)
    (tmp_path / "objects" / key).unlink()  # the publisher died between its two writes
    again = transport.get_down(0, 1)
    assert transport.store.exists(key)
    assert torch.equal(again.tensors["w"].values, expected.tensors["w"].values)
    with pytest.raises(LookupError):
        transport.get_down(0, 0)  # version 0 is fetched whole


def test_a_resumed_syncer_continues_the_mirror_chain(tiny_cfg):
    transport = InMemoryTransport()
    init = {"w": torch.zeros(3, 5)}
    cfg = SyncerConfig(learners=1)
    s = Syncer(cfg=cfg, outer=OuterConfig(), fragments=[["w"]], init=init, transport=transport, down="4bit")
    from training.engine.compression import Compressor
    from training.engine.messages import FragmentDelta

    comp = Compressor(CompressionConfig(kind="fp32"))
    for seq in range(3):
        if seq == 2:  # killed after version 2: the new one reads the mirror from the store
            s = Syncer.resume(
                cfg=cfg, outer=OuterConfig(), fragments=[["w"]], transport=transport, down="4bit"
            )
        transport.put_delta(
            FragmentDelta(
                learner=0,
                fragment=0,
                base_version=seq,
                seq=seq,
                steps=1,
                tokens=1,
                tensors=comp.compress({"w": torch.randn(3, 5, generator=torch.Generator().manual_seed(seq))}),
            )
        )
        s.pull(now=float(seq))
        s.poll(now=float(seq))
    held = transport.get_version(0, 0).params["w"].clone()
    for v in (1, 2, 3):
        held = held + transport.get_down(0, v).decoded()["w"]
    assert torch.equal(held, transport.get_version(0, 3).mirror["w"])


def test_the_simulator_counts_down_deltas_not_full_versions(tiny_cfg, stdlib_small, tiny_eval):
    def run(kind):
        cfg = SimConfig(
            model=tiny_cfg,
            inner=INNER,
            learners=(LearnerSpec(batch_size=4),) * 2,
            h=5,
            compression=CompressionConfig(kind=kind),
            max_steps=20,
        )
        return Simulator(cfg, stdlib_small, tiny_eval[:4], device="cpu").run()

    fp32, q4 = run("fp32"), run("4bit")
    assert fp32.bytes_down == fp32.bytes_up  # one S up and one S down per sync
    ratio_down = fp32.bytes_down[0] / q4.bytes_down[0]
    assert ratio_down == pytest.approx(fp32.bytes_up[0] / q4.bytes_up[0])  # same payload both ways
    assert ratio_down > 6
