"""The identities DiLoCo reduces to (arXiv 2311.08105): averaging and plain training."""

from __future__ import annotations

import torch

from training.engine.config import InnerConfig, OuterConfig, SyncerConfig
from training.engine.data import BatchSampler
from training.engine.learner import Learner
from training.engine.model import build_model
from training.engine.outer import OuterOptimizer
from training.engine.simulator import LearnerSpec, SimConfig, Simulator
from training.engine.syncer import Syncer


def _init(cfg):
    return {n: p.detach().clone() for n, p in build_model(cfg, seed=0).named_parameters()}


def test_outer_sgd_with_lr_one_and_no_momentum_is_parameter_averaging(tiny_cfg, stdlib_small):
    init = _init(tiny_cfg)
    frags = [list(init)]
    learners = [
        Learner(
            learner_id=i,
            model_cfg=tiny_cfg,
            inner=InnerConfig(batch_size=4, warmup_steps=0),
            fragments=frags,
            init=init,
            device="cpu",
            sampler=BatchSampler(stdlib_small.train, block_size=32, batch_size=4, seed=i),
        )
        for i in range(3)
    ]
    for lr in learners:
        lr.train(3)
    syncer = Syncer(
        cfg=SyncerConfig(learners=3), outer=OuterConfig(lr=1.0, momentum=0.0), fragments=frags, init=init
    )
    for lr in learners:
        syncer.submit(lr.make_delta(0), now=0.0)
    (snap,) = syncer.poll(now=0.0)
    assert snap.version == 1
    for name in init:
        mean = torch.stack([lr.params[name].detach() for lr in learners]).mean(0)
        torch.testing.assert_close(snap.params[name], mean, rtol=0, atol=1e-6)


def test_one_learner_with_h_one_and_sgd_inner_is_plain_training(tiny_cfg, stdlib_small, sgd_inner):
    steps = 6
    cfg = SimConfig(
        model=tiny_cfg,
        inner=sgd_inner,
        learners=(LearnerSpec(batch_size=4),),
        h=1,
        outer=OuterConfig(lr=1.0, momentum=0.0),
        max_steps=steps,
        seed=0,
    )
    sim = Simulator(cfg, stdlib_small, [], device="cpu")
    # Plain training: the same init, the same batches, torch's own SGD.
    model = build_model(tiny_cfg, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=sgd_inner.lr)
    sampler = BatchSampler(stdlib_small.train, block_size=32, batch_size=4, seed=cfg.seed * 1000 + 1)
    for _ in range(steps):
        x, y = sampler.next()
        model(x, y).backward()
        opt.step()
        opt.zero_grad()
    result = sim.run()
    assert result.publishes == steps
    merged = sim.syncer.global_params()
    for name, p in model.named_parameters():
        torch.testing.assert_close(merged[name], p.detach(), rtol=0, atol=1e-6)


def test_outer_nesterov_matches_torch_sgd():
    torch.manual_seed(0)
    theta = torch.randn(5, 3)
    mine = {"w": theta.clone()}
    ref = torch.nn.Parameter(theta.clone())
    opt = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
    outer = OuterOptimizer(OuterConfig(lr=0.7, momentum=0.9, nesterov=True))
    for _ in range(4):
        g = torch.randn(5, 3)
        outer.step(mine, {"w": g})
        ref.grad = g.clone()
        opt.step()
    torch.testing.assert_close(mine["w"], ref.detach())
